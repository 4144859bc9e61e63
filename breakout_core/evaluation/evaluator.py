"""Play full games on fixed episode seeds and report the raw Atari score of each.

Episodes are batched across the slots of one episode driver (`breakout_core.game.driver`),
which plays the contract's rules: an episode is a function of (contract, policy, seed),
so it scores the same alone or inside any batch. The seed also seeds the policy's own
generator.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from breakout_core.evaluation.policies import Policy, check_fits
from breakout_core.game.contract import Contract
from breakout_core.game.driver import EpisodeDriver, FinishedEpisode, StepResult, play_seeds


@dataclass
class EvaluationResult:
    episodes: list[FinishedEpisode]  # in the order of the seeds given
    frames: list[np.ndarray] | None  # the recorded episode's newest frame after each of its steps
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
    on_episode: Callable[[FinishedEpisode], None] | None = None,
    driver: EpisodeDriver | None = None,
) -> EvaluationResult:
    """Evaluate `policy` on every seed; `batch_size` episodes run side by side.

    `on_step(n)` is called after each step of the batch with the number of transitions it
    made; `on_episode` when an episode ends. When `record_seed` is one of the seeds, the
    frames of that episode are returned for a GIF. A caller that evaluates several policies
    may pass its own `driver` (made with this contract) to skip making one (~0.1 s a
    slot); then its slot count replaces `batch_size`.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    check_fits(policy, contract)
    if driver is None:
        driver = EpisodeDriver(contract, max(1, min(batch_size, len(seeds))))
    elif driver.contract != contract:
        raise ValueError(f"the driver plays contract {driver.contract.hash}, not {contract.hash}")
    recorded: list[np.ndarray] | None = [] if record_seed in seeds else None
    transitions = 0
    started = time.perf_counter()

    def stepped(result: StepResult) -> None:
        nonlocal transitions
        if recorded is not None:
            recorded.extend(result.obs[slot, -1] for slot in result.slots if driver.seeds[slot] == record_seed)
        transitions += len(result.slots)
        if on_step is not None:
            on_step(len(result.slots))

    episodes = play_seeds(driver, seeds, lambda obs, _slots, generators: policy.act(obs, generators),
                          policy_seed=policy_seed, on_step=stepped, on_episode=on_episode)
    return EvaluationResult(
        episodes=[episodes[int(s)] for s in seeds],
        frames=recorded,
        wall_s=time.perf_counter() - started,
        transitions=transitions,
    )


GIF_MAX_FRAMES = 1_800  # one minute at 30 fps: a stalled agent's 27,000 steps would make a GIF of ~2 GB in memory


def write_gif(frames: Sequence[np.ndarray], path: str | Path, *, scale: int = 3, fps: int = 30,
              max_frames: int = GIF_MAX_FRAMES) -> Path:
    """Write the agent's-eye frames (84x84 grayscale) as an upscaled looping GIF of at most
    `max_frames` frames, the episode's first ones: encoded in memory, then written whole (a
    full disk is `NoSpaceLeft` naming the GIF)."""
    import imageio.v3 as iio

    from breakout_core.common.files import write_whole

    if not frames:
        raise ValueError("no frames to write")
    big = [np.kron(f, np.ones((scale, scale), dtype=np.uint8)) for f in frames[:max_frames]]
    return write_whole(path, iio.imwrite("<bytes>", np.stack(big), extension=".gif", duration=1000 / fps, loop=0))
