"""Breakout on the real ALE emulator (ale-py's bundled ROM), single or vectorized.

Both come from ale-py's native vector env, configured from a Contract, so a single env is
exactly one slot of a vector env: the same preprocessing code path plays an episode alone
or inside a batch.
"""

from __future__ import annotations

import numpy as np
from ale_py.vector_env import AtariVectorEnv

from breakout_core.contract import Contract

ACTION_NAMES = ("NOOP", "FIRE", "RIGHT", "LEFT")
NUM_ACTIONS = len(ACTION_NAMES)


def make_vector_env(
    contract: Contract,
    num_envs: int,
    *,
    num_threads: int = 0,
) -> AtariVectorEnv:
    """Native vector env of `num_envs` independent games, synchronous (all step together).

    Autoreset is NEXT_STEP: the step that ends an episode returns its final observation, and
    the caller either resets that slot itself (with a seed) or lets the next step reset it.
    Rewards are always raw: a trainer clips what it learns from (the contract says whether)
    and still reports raw episode returns. Episodes are always full games; a trainer that
    treats a lost life as terminal for its targets does so from `info["lives"]`.
    """
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    return AtariVectorEnv(
        contract.game,
        num_envs,
        num_threads=num_threads,
        max_num_frames_per_episode=contract.max_episode_frames,
        repeat_action_probability=contract.repeat_action_probability,
        full_action_space=False,
        autoreset_mode="NextStep",
        img_height=contract.screen_size,
        img_width=contract.screen_size,
        grayscale=True,
        stack_num=contract.frame_stack,
        frameskip=contract.frame_skip,
        maxpool=contract.max_pool,
        noop_max=0,  # the caller plays the contract's no-op start (see Contract)
        episodic_life=False,
        reward_clipping=False,
        use_fire_reset=contract.fire_on_reset,
    )


def noop_start_steps(contract: Contract, rng: np.random.Generator) -> int:
    """How many forced NOOP agent steps begin an episode: uniform over 0..noop_start_max."""
    return int(rng.integers(0, contract.noop_start_max + 1))


def bare_stepping_rate(contract: Contract, num_envs: int, steps: int, *, seed: int = 0) -> float:
    """Transitions per second of the vector env alone, stepping random actions (its own
    autoreset), env creation excluded: the ceiling for anything that acts in it."""
    import time

    env = make_vector_env(contract, num_envs)
    try:
        env.reset()
        rng = np.random.default_rng(seed)
        actions = rng.integers(0, NUM_ACTIONS, (steps, num_envs))
        started = time.perf_counter()
        for row in actions:
            env.step(row)
        return steps * num_envs / (time.perf_counter() - started)
    finally:
        env.close()


def make_single_env(contract: Contract) -> AtariVectorEnv:
    """One game: a vector env with one slot, so observations are (1, 4, 84, 84)."""
    return make_vector_env(contract, 1, num_threads=1)
