"""Fixed states: observations captured from real play, the shared input of every parity check.

States come from full games on the real ALE, played by a policy (usually the checkpoint
under test, with a small epsilon so it does not loop) on fixed episode seeds. Each episode
is played by the episode driver exactly as the evaluator plays it (the seed's own game and
no-op start, the same per-episode policy generator), so a state is named by (episode seed,
agent step) and can be found again by replaying that episode.

States are spread over each game, not taken from its first frames: an episode of unknown
length keeps a thinned, evenly strided set of candidate observations (at most
`candidates_per_episode`, the stride doubling whenever it fills), and when the episode ends
`states_per_episode` of them are taken nearest to the centres of equal slices of the
episode. Memory stays bounded whatever the episode length. A picture seen before in the
episode (a stalled game, ball not in play, repeats it) is never taken twice.

The file is a versioned `.npz` (no pickle) with the observations, the seeds and steps that
produced them, the contract hash and the checkpoint's path and sha256.
"""

from __future__ import annotations

import io
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from breakout_core.common.files import write_whole
from breakout_core.common.hashing import file_sha256, model_sha256
from breakout_core.evaluation.policies import Policy, check_fits
from breakout_core.game.contract import Contract
from breakout_core.game.driver import STOPPED, EpisodeDriver, play_seeds

FIXED_STATES_FORMAT = "breakout-fixed-states/1"
STEP_CAP = "step_cap"  # stopped by max_steps_per_episode, not by the game


@dataclass(frozen=True)
class CapturedEpisode:
    seed: int
    steps: int  # agent steps played (transitions), no-op start included
    noop_steps: int  # forced NOOP steps at the start
    score: float  # raw Atari score of the steps played
    ended_by: str  # game_over, time_limit or STEP_CAP
    states: int  # states taken from this episode


@dataclass
class FixedStates:
    """A set of states and where each came from."""

    obs: np.ndarray  # uint8 (N, frame_stack, H, W)
    episode_seeds: np.ndarray  # int64 (N,): the episode each state comes from
    steps: np.ndarray  # int64 (N,): agent step of that episode (0 = first observation after reset)
    actions: np.ndarray  # int64 (N,): the action the capturing policy took there
    contract_hash: str
    checkpoint_path: str | None
    checkpoint_sha256: str | None
    meta: dict[str, Any] = field(default_factory=dict)  # policy, epsilon, seeds, episodes, versions

    def __len__(self) -> int:
        return int(self.obs.shape[0])


class _EvenSampler:
    """Keeps candidates at a stride that doubles when full: evenly spaced over any length."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.stride = 1
        self.steps: list[int] = []
        self.obs: list[np.ndarray] = []
        self.actions: list[int] = []
        self.seen = 0  # decision steps offered so far

    def offer(self, index: int, step: int, obs: np.ndarray, action: int) -> None:
        """Decision `index` (0, 1, 2, ... in order) at agent `step` of the episode."""
        self.seen = index + 1
        if index % self.stride:
            return
        self.steps.append(step)
        self.obs.append(obs.copy())
        self.actions.append(action)
        if len(self.steps) > self.capacity:
            # candidate j is decision j * stride: keep the even ones, i.e. multiples of 2 * stride
            self.steps, self.obs, self.actions = self.steps[::2], self.obs[::2], self.actions[::2]
            self.stride *= 2

    def pick(self, k: int) -> list[int]:
        """Up to k candidate positions, nearest to the centres of k equal slices of the episode.

        An observation seen before (a stalled game repeats its picture) is a candidate once
        only, so no state is taken twice.
        """
        if not self.steps or k <= 0:
            return []
        seen: set[bytes] = set()
        distinct = []
        for position, obs in enumerate(self.obs):
            key = obs.tobytes()
            if key not in seen:
                seen.add(key)
                distinct.append(position)
        positions = np.asarray(distinct)
        decisions = positions * self.stride
        targets = (np.arange(k) + 0.5) * self.seen / k
        chosen = set()
        for target in targets:  # nearest free candidate to each slice centre
            order = np.argsort(np.abs(decisions - target), kind="stable")
            free = next((int(positions[o]) for o in order if int(positions[o]) not in chosen), None)
            if free is None:
                break
            chosen.add(free)
        return sorted(chosen)


def capture_fixed_states(
    policy: Policy,
    contract: Contract,
    *,
    n_states: int,
    episode_seeds: Sequence[int],
    policy_seed: int = 0,
    batch_size: int = 4,
    max_steps_per_episode: int | None = None,
    candidates_per_episode: int = 256,
    checkpoint_path: str | Path | None = None,
) -> FixedStates:
    """Play one episode per seed and take about n_states / len(seeds) states from each.

    The first `n_states` states in seed order are kept (each episode contributes
    ceil(n_states / len(seeds)), spread over it). Episodes run `batch_size` at a time on
    one episode driver. `max_steps_per_episode` (agent steps) caps an episode, for tests
    or for a policy that stalls; a capped episode is marked STEP_CAP. A policy whose
    episodes are too short to give enough distinct states raises ValueError.
    """
    seeds = [int(s) for s in episode_seeds]
    if n_states < 1:
        raise ValueError(f"n_states must be >= 1, got {n_states}")
    if not seeds:
        raise ValueError("episode_seeds must not be empty")
    if len(set(seeds)) != len(seeds):
        raise ValueError("episode_seeds must be distinct")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if max_steps_per_episode is not None and max_steps_per_episode < 1:
        raise ValueError(f"max_steps_per_episode must be >= 1, got {max_steps_per_episode}")
    per_episode = math.ceil(n_states / len(seeds))
    if candidates_per_episode < 2 * per_episode:
        raise ValueError(f"candidates_per_episode must be >= 2 * states per episode ({2 * per_episode})")

    check_fits(policy, contract)
    started = time.perf_counter()
    driver = EpisodeDriver(contract, min(batch_size, len(seeds)))
    samplers: dict[int, _EvenSampler] = {}

    def decide(obs: np.ndarray, slots: np.ndarray, generators: list[np.random.Generator]) -> np.ndarray:
        actions = policy.act(obs, generators)
        for row, slot in enumerate(slots):
            sampler = samplers.setdefault(driver.seeds[slot], _EvenSampler(candidates_per_episode))
            sampler.offer(sampler.seen, driver.steps_played(slot), obs[row], int(actions[row]))
        return actions

    played = play_seeds(driver, seeds, decide, policy_seed=policy_seed, max_steps=max_steps_per_episode)
    taken: dict[int, tuple[list[int], list[np.ndarray], list[int]]] = {}
    episodes: dict[int, CapturedEpisode] = {}
    for seed in seeds:
        sampler, episode = samplers.get(seed, _EvenSampler(candidates_per_episode)), played[seed]
        picks = sampler.pick(per_episode)
        taken[seed] = ([sampler.steps[p] for p in picks], [sampler.obs[p] for p in picks],
                       [sampler.actions[p] for p in picks])
        ended_by = STEP_CAP if episode.ended_by == STOPPED else episode.ended_by
        episodes[seed] = CapturedEpisode(seed=seed, steps=episode.steps, noop_steps=episode.noop_steps,
                                         score=episode.score, ended_by=ended_by, states=len(picks))

    state_seeds: list[int] = []
    state_steps: list[int] = []
    state_obs: list[np.ndarray] = []
    state_actions: list[int] = []
    for seed in seeds:
        s_steps, s_obs, s_actions = taken[seed]
        state_seeds += [seed] * len(s_steps)
        state_steps += s_steps
        state_obs += s_obs
        state_actions += s_actions
    if len(state_obs) < n_states:
        short = {s: episodes[s].steps for s in seeds if episodes[s].states < per_episode}
        raise ValueError(
            f"captured only {len(state_obs)} distinct states, {n_states} asked: episodes too short "
            f"for {per_episode} states each (seed: steps) {short}; give more seeds or longer episodes"
        )
    checkpoint_sha = file_sha256(checkpoint_path) if checkpoint_path is not None else None
    meta = {
        "policy": getattr(policy, "name", type(policy).__name__),
        "epsilon": getattr(policy, "epsilon", None),
        "policy_seed": int(policy_seed),
        "episode_seeds": seeds,
        "states_per_episode": per_episode,
        "max_steps_per_episode": max_steps_per_episode,
        "candidates_per_episode": candidates_per_episode,
        "episodes": [vars(episodes[s]) for s in seeds],
        "contract": contract.to_dict(),
        "capture_wall_s": time.perf_counter() - started,
        "numpy": np.__version__,
    }
    return FixedStates(
        obs=np.stack(state_obs[:n_states]).astype(np.uint8, copy=False),
        episode_seeds=np.asarray(state_seeds[:n_states], dtype=np.int64),
        steps=np.asarray(state_steps[:n_states], dtype=np.int64),
        actions=np.asarray(state_actions[:n_states], dtype=np.int64),
        contract_hash=contract.hash,
        checkpoint_path=str(checkpoint_path) if checkpoint_path is not None else None,
        checkpoint_sha256=checkpoint_sha,
        meta=meta,
    )


def capture_from_checkpoint(
    checkpoint_path: str | Path,
    *,
    n_states: int = 60,
    episode_seeds: Sequence[int] = tuple(range(6)),
    epsilon: float = 0.05,
    contract: Contract | None = None,
    other_contract_deliberate: bool = False,
    **options: Any,
) -> FixedStates:
    """Fixed states from a checkpoint's own play, under the contract it was trained with, or
    under `contract`: one whose hash differs from the checkpoint's is refused unless
    `other_contract_deliberate`. Other options go to capture_fixed_states (policy_seed,
    batch_size, max_steps_per_episode, ...).
    """
    from breakout_core.evaluation.policies import QNetworkPolicy

    policy = QNetworkPolicy.from_checkpoint(checkpoint_path, epsilon=epsilon)
    meta = policy.checkpoint_meta
    own = Contract(**meta["contract"])
    if own.hash != meta["contract_hash"]:
        raise ValueError(f"{checkpoint_path}: stored contract hash {meta['contract_hash']} "
                         f"does not match its contract ({own.hash})")
    if contract is not None and contract.hash != own.hash and not other_contract_deliberate:
        raise ValueError(
            f"{checkpoint_path} was trained under contract {own.name} ({own.hash}); "
            f"capturing under {contract.name} ({contract.hash}) would not be its game"
        )
    return capture_fixed_states(
        policy, contract or own, n_states=n_states, episode_seeds=episode_seeds, checkpoint_path=checkpoint_path,
        **options
    )


def capture_from_onnx(onnx_path: str | Path, contract: Contract, *, n_states: int = 60,
                      episode_seeds: Sequence[int] = tuple(range(6)), epsilon: float = 0.05,
                      source: str | Path | None = None, **options: Any) -> FixedStates:
    """Fixed states from an ONNX model's own play (uint8 input, as adapted) under `contract`, for a
    model with no checkpoint of this project's. `source`: the file the model was adapted from
    (default: `onnx_path`); its path and sha256 are kept in the states' meta (`onnx_path`,
    `onnx_sha256`), not as a checkpoint's, which an export's lineage checks. Other options go to
    capture_fixed_states."""
    from breakout_core.evaluation.policies import OnnxPolicy

    policy = OnnxPolicy(onnx_path, epsilon=epsilon)
    try:
        states = capture_fixed_states(policy, contract, n_states=n_states, episode_seeds=episode_seeds, **options)
    finally:
        policy.close()
    source = Path(source or onnx_path)
    states.meta.update(onnx_path=str(source.resolve()), onnx_sha256=model_sha256(source))
    return states


def save_fixed_states(path: str | Path, states: FixedStates) -> Path:
    """Write a versioned, pickle-free .npz (atomically: a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    header = {
        "format": FIXED_STATES_FORMAT,
        "contract_hash": states.contract_hash,
        "checkpoint_path": states.checkpoint_path,
        "checkpoint_sha256": states.checkpoint_sha256,
        "meta": states.meta,
    }
    buffer = io.BytesIO()
    np.savez_compressed(
        buffer,
        header=np.array(json.dumps(header, sort_keys=True)),
        obs=states.obs,
        episode_seeds=states.episode_seeds,
        steps=states.steps,
        actions=states.actions,
    )
    return write_whole(path, buffer.getvalue())


def states_contract(path: str | Path) -> tuple[str | None, str]:
    """(name, hash) of the contract a fixed-states file was captured under."""
    states = load_fixed_states(path)
    return (states.meta.get("contract") or {}).get("name"), states.contract_hash


def load_fixed_states(path: str | Path, expected_contract_hash: str | None = None) -> FixedStates:
    """Read a fixed-states file; refuse another format version or another contract (ValueError)."""
    path = Path(path)
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {k: data[k] for k in data.files}
    except FileNotFoundError:
        raise
    except ValueError as exc:
        if "allow_pickle" in str(exc):  # numpy's message would advise loading it unsafely
            raise ValueError(f"{path}: not a readable fixed-states file (not an .npz archive of arrays: numpy "
                             "would read it as pickled Python objects, which are never loaded)") from None
        raise ValueError(f"{path}: not a readable fixed-states file (ValueError: {exc})") from None
    except Exception as exc:
        raise ValueError(f"{path}: not a readable fixed-states file ({exc.__class__.__name__}: {exc})") from None
    required = {"header", "obs", "episode_seeds", "steps", "actions"}
    if not required <= set(arrays):
        raise ValueError(f"{path}: not a {FIXED_STATES_FORMAT} file (missing {sorted(required - set(arrays))})")
    try:
        header = json.loads(str(arrays["header"]))
    except json.JSONDecodeError:
        raise ValueError(f"{path}: unreadable header") from None
    version = header.get("format")
    if version != FIXED_STATES_FORMAT:
        raise ValueError(f"{path}: format {version!r}, this code reads {FIXED_STATES_FORMAT!r}")
    if expected_contract_hash is not None and header.get("contract_hash") != expected_contract_hash:
        raise ValueError(
            f"{path}: states captured under contract {header.get('contract_hash')}, "
            f"expected {expected_contract_hash}; they are not the same game"
        )
    obs = arrays["obs"]
    if obs.dtype != np.uint8 or obs.ndim != 4:
        raise ValueError(f"{path}: obs must be uint8 (N, stack, H, W), got {obs.dtype} {obs.shape}")
    n = obs.shape[0]
    for key in ("episode_seeds", "steps", "actions"):
        if arrays[key].shape != (n,):
            raise ValueError(f"{path}: {key} has shape {arrays[key].shape}, expected ({n},)")
    return FixedStates(
        obs=obs,
        episode_seeds=arrays["episode_seeds"].astype(np.int64),
        steps=arrays["steps"].astype(np.int64),
        actions=arrays["actions"].astype(np.int64),
        contract_hash=header["contract_hash"],
        checkpoint_path=header.get("checkpoint_path"),
        checkpoint_sha256=header.get("checkpoint_sha256"),
        meta=header.get("meta", {}),
    )
