"""Play full games on fixed episode seeds and report the raw Atari score of each.

Episodes are batched across the slots of one native vector env: a slot that finishes is
reset alone and plays the next seed in the list. An unseeded ALE reset with sticky actions
off always yields the same game, so an episode is decided by its seed alone: the seed
draws the no-op start (see Contract) and seeds the policy's own generator. An episode
therefore scores the same alone or inside any batch, and no reset pays the ~0.1 s ROM
reload that a seeded ALE reset costs.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ale_py.vector_env import AtariVectorEnv

from breakout_core.contract import Contract
from breakout_core.contract import FIRE, serves
from breakout_core.envs import NUM_ACTIONS, make_vector_env, noop_start_steps
from breakout_core.policies import Policy, episode_rng

NOOP_STREAM = 0x6E6F6F70  # keeps the no-op draw apart from any policy's generator
GAME_OVER = "game_over"
TIME_LIMIT = "time_limit"


@dataclass(frozen=True)
class EpisodeRecord:
    seed: int
    score: float  # raw Atari score, full game
    steps: int  # agent steps (transitions)
    frames: int  # emulator frames
    ended_by: str  # GAME_OVER or TIME_LIMIT
    action_counts: tuple[int, ...]  # NOOP, FIRE, RIGHT, LEFT
    wall_s: float  # seconds from this episode's reset to its end (shared with its batch)


@dataclass
class EvaluationResult:
    episodes: list[EpisodeRecord]  # in the order of the seeds given
    frames: list[np.ndarray] | None  # last frame of each observation of the recorded episode
    wall_s: float
    transitions: int  # real episode steps, not counting idle slots


def evaluate(
    policy: Policy,
    seeds: Sequence[int],
    contract: Contract,
    *,
    batch_size: int = 8,
    policy_seed: int = 0,
    record_seed: int | None = None,
    on_step: Callable[[int], None] | None = None,
    on_episode: Callable[[EpisodeRecord], None] | None = None,
    env: AtariVectorEnv | None = None,
) -> EvaluationResult:
    """Evaluate `policy` on every seed; `batch_size` episodes run side by side.

    `on_step(n)` is called after each vector step with the number of real transitions it
    made; `on_episode` when an episode ends. When `record_seed` is one of the seeds, the
    frames of that episode are returned for a GIF. A caller that evaluates several policies
    may pass its own `env` (made by make_vector_env with this contract) to skip creating one
    (~0.15 s a slot); then its slot count replaces `batch_size`, and the caller closes it.
    """
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must not be empty")
    if len(set(seeds)) != len(seeds):
        raise ValueError("seeds must be distinct")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    owned = env is None
    slots = min(batch_size, len(seeds)) if owned else env.num_envs
    pending = deque(seeds[slots:])
    slot_seed: list[int | None] = list(seeds[:slots]) + [None] * max(0, slots - len(seeds))
    if owned:
        env = make_vector_env(contract, slots)
    records: dict[int, EpisodeRecord] = {}
    recorded: list[np.ndarray] | None = [] if record_seed in seeds else None
    started = time.perf_counter()
    transitions = 0
    try:
        obs, info = env.reset()  # unseeded, like every later reset of a slot
        lives = info["lives"].copy()
        serve = np.zeros(slots, dtype=bool)  # the contract's forced FIRE after a lost life
        rngs = [episode_rng(policy_seed, s) if s is not None else None for s in slot_seed]
        noops = np.array([noop_start_steps(contract, noop_rng(s)) if s is not None else 0 for s in slot_seed],
                         dtype=np.int64)
        score = np.zeros(slots)
        steps = np.zeros(slots, dtype=np.int64)
        counts = np.zeros((slots, NUM_ACTIONS), dtype=np.int64)
        episode_start = np.full(slots, started)
        active = np.array([s is not None for s in slot_seed])
        idx = np.flatnonzero(active)
        while len(idx):
            if recorded is not None and record_seed in slot_seed:
                recorded.append(obs[slot_seed.index(record_seed), -1].copy())
            actions = np.zeros(slots, dtype=np.int64)  # NOOP: idle slots and no-op starts
            actions[serve] = FIRE
            deciding = np.flatnonzero(active & (noops == 0) & ~serve)
            noops[idx] = np.maximum(noops[idx] - 1, 0)
            if len(deciding):
                actions[deciding] = policy.act(obs[deciding], [rngs[i] for i in deciding])
            obs, reward, terminated, truncated, info = env.step(actions)
            serve = serves(contract, lives, info["lives"], terminated | truncated) & active
            lives = info["lives"].copy()
            score[idx] += reward[idx]
            steps[idx] += 1
            counts[idx, actions[idx]] += 1
            transitions += len(idx)
            if on_step is not None:
                on_step(len(idx))
            finished = np.flatnonzero(active & (terminated | truncated))
            if not len(finished):
                continue
            now = time.perf_counter()
            reset_mask = np.zeros(slots, dtype=bool)
            for i in finished:
                record = EpisodeRecord(
                    seed=slot_seed[i],
                    score=float(score[i]),
                    steps=int(steps[i]),
                    frames=int(info["episode_frame_number"][i]),
                    ended_by=GAME_OVER if terminated[i] else TIME_LIMIT,
                    action_counts=tuple(int(c) for c in counts[i]),
                    wall_s=float(now - episode_start[i]),
                )
                records[record.seed] = record
                if on_episode is not None:
                    on_episode(record)
                if pending:
                    slot_seed[i] = pending.popleft()
                    rngs[i] = episode_rng(policy_seed, slot_seed[i])
                    noops[i] = noop_start_steps(contract, noop_rng(slot_seed[i]))
                    score[i], steps[i], counts[i], episode_start[i] = 0.0, 0, 0, now
                    reset_mask[i] = True
                else:
                    slot_seed[i] = None
                    active[i] = False
            idx = np.flatnonzero(active)
            if reset_mask.any():
                obs, info = env.reset(options={"reset_mask": reset_mask})
                lives[reset_mask] = info["lives"][reset_mask]
    finally:
        if owned:
            env.close()
    return EvaluationResult(
        episodes=[records[s] for s in seeds],
        frames=recorded,
        wall_s=time.perf_counter() - started,
        transitions=transitions,
    )


def noop_rng(episode_seed: int) -> np.random.Generator:
    """The generator that draws an episode's no-op start: a function of its seed only."""
    return np.random.default_rng([NOOP_STREAM, episode_seed])


GIF_MAX_FRAMES = 1_800  # one minute at 30 fps: a stalled agent's 27,000 steps would make a GIF of ~2 GB in memory


def write_gif(frames: Sequence[np.ndarray], path: str | Path, *, scale: int = 3, fps: int = 30,
              max_frames: int = GIF_MAX_FRAMES) -> Path:
    """Write the agent's-eye frames (84x84 grayscale) as an upscaled looping GIF of at most
    `max_frames` frames, the episode's first ones."""
    import imageio.v3 as iio

    if not frames:
        raise ValueError("no frames to write")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    big = [np.kron(f, np.ones((scale, scale), dtype=np.uint8)) for f in frames[:max_frames]]
    iio.imwrite(path, np.stack(big), extension=".gif", duration=1000 / fps, loop=0)
    return path
