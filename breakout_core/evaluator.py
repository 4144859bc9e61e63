"""Play full games on fixed episode seeds and report the raw Atari score of each.

Episodes are batched across the slots of one episode driver (`breakout_core.driver`),
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

from breakout_core.contract import Contract
from breakout_core.driver import GAME_OVER, TIME_LIMIT, EpisodeDriver, FinishedEpisode, StepResult, play_seeds
from breakout_core.policies import Policy, episode_rng

__all__ = ["GAME_OVER", "TIME_LIMIT", "EpisodeRecord", "EvaluationResult", "evaluate", "write_gif"]


@dataclass(frozen=True)
class EpisodeRecord:
    seed: int
    score: float  # raw Atari score, full game
    steps: int  # agent steps (transitions)
    frames: int  # emulator frames
    ended_by: str  # GAME_OVER or TIME_LIMIT
    action_counts: tuple[int, ...]  # NOOP, FIRE, RIGHT, LEFT
    wall_s: float  # seconds from this episode's start to its end (shared with its batch)


@dataclass
class EvaluationResult:
    episodes: list[EpisodeRecord]  # in the order of the seeds given
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
    on_episode: Callable[[EpisodeRecord], None] | None = None,
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
    if driver is None:
        driver = EpisodeDriver(contract, max(1, min(batch_size, len(seeds))))
    elif driver.contract != contract:
        raise ValueError(f"the driver plays contract {driver.contract.hash}, not {contract.hash}")
    rngs: dict[int, np.random.Generator] = {}
    recorded: list[np.ndarray] | None = [] if record_seed in seeds else None
    transitions = 0
    started = time.perf_counter()

    def decide(obs: np.ndarray, slots: np.ndarray) -> np.ndarray:
        return policy.act(obs, [_rng(driver.seeds[i]) for i in slots])

    def _rng(seed: int) -> np.random.Generator:
        if seed not in rngs:
            rngs[seed] = episode_rng(policy_seed, seed)
        return rngs[seed]

    def stepped(result: StepResult) -> None:
        nonlocal transitions
        if recorded is not None:
            recorded.extend(result.obs[slot, -1] for slot in result.slots if driver.seeds[slot] == record_seed)
        transitions += len(result.slots)
        if on_step is not None:
            on_step(len(result.slots))

    def finished(episode: FinishedEpisode) -> None:
        rngs.pop(episode.seed, None)
        if on_episode is not None:
            on_episode(_record_of(episode))

    episodes = play_seeds(driver, seeds, decide, on_step=stepped, on_episode=finished)
    return EvaluationResult(
        episodes=[_record_of(episodes[int(s)]) for s in seeds],
        frames=recorded,
        wall_s=time.perf_counter() - started,
        transitions=transitions,
    )


def _record_of(episode: FinishedEpisode) -> EpisodeRecord:
    return EpisodeRecord(seed=episode.seed, score=episode.score, steps=episode.steps, frames=episode.frames,
                         ended_by=episode.ended_by, action_counts=episode.action_counts, wall_s=episode.wall_s)


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
