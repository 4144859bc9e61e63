"""DQN, Double DQN and Dueling Double DQN on N vectorized Breakout envs.

Everything is counted in transitions (one env step of one env), whatever N is: epsilon,
learning start, update frequency, target sync, diagnostics and checkpoints all fire when
the transition count crosses their multiples. The trainer yields plain records and knows
nothing of specs or databases.
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from breakout_core.common.files import torch_bytes, write_whole
from breakout_core.game.contract import Contract
from breakout_core.game.driver import EpisodeDriver
from breakout_core.learning import allocator
from breakout_core.learning.input_major import (
    input_major_weights,
    optimizer_state_transposed_at,
    transposed_at,
    with_input_major_linears,
)
from breakout_core.learning.learner_precision import PrecisionChoice, choose_learner_precision
from breakout_core.learning.qnetwork import QNetwork, load_checkpoint, save_checkpoint
from breakout_core.learning.replay import FrameReplay, ReplayBatch
from breakout_core.learning.train_config import TrainConfig

STATE_FORMAT = "breakout-trainer-state/1"


@dataclass(frozen=True)
class EpisodeEnd:
    env_index: int
    transition: int  # global transition count when it ended
    episode_return: float  # raw score
    length: int  # transitions
    ended_by: str  # game_over / time_limit


@dataclass(frozen=True)
class Diagnostics:
    transition: int
    update: int
    loss: float
    q_mean: float
    target_mean: float
    td_abs_mean: float
    td_abs_max: float
    grad_norm: float
    epsilon: float
    replay_frames: int


@dataclass(frozen=True)
class CheckpointSaved:
    transition: int
    path: str


@dataclass(frozen=True)
class TrainDone:
    transitions: int
    updates: int
    target_syncs: int
    # every attempt of the run, each up to its last saved state (what a killed attempt did past it is redone)
    wall_s: float  # records' consumers included
    measured_transitions: int  # made after the warm-up (config.measure_from)
    measured_s: float
    transitions_per_s: float  # measured_transitions / measured_s
    weights_moved: float  # L2 distance of the online weights from the run's initial weights


class TrainingDiverged(RuntimeError):
    pass


def _crossings(before: int, after: int, every: int) -> int:
    return after // every - before // every


class Trainer:
    def __init__(self, config: TrainConfig, contract: Contract, out_dir: str | Path, *,
                 cpu_flags: frozenset[str] | None = None):
        """`cpu_flags`: the CPU flags the learner's precision is chosen for; this CPU's when None."""
        self.config = config
        self.contract = contract
        self.out_dir = Path(out_dir)
        self.precision: PrecisionChoice = choose_learner_precision(
            config.learner_precision, config.learner_device, cpu_flags,
            timings=lambda: precision_timings(config, contract, cpu_flags))
        if config.torch_threads:
            torch.set_num_threads(config.torch_threads)
        allocator.apply(config.keep_freed_memory)
        torch.manual_seed(config.seed)
        self.device = torch.device(config.learner_device)
        arch = "dueling" if config.algorithm == "dueling" else "nature"
        self.online = QNetwork(arch, num_actions=contract.num_actions).to(self.device)
        self.target = QNetwork(arch, num_actions=contract.num_actions).to(self.device)
        self.target.load_state_dict(self.online.state_dict())
        self.target.eval()
        if config.input_major_linear:
            with_input_major_linears(self.online)
            with_input_major_linears(self.target)
        if config.channels_last:
            self.online = self.online.to(memory_format=torch.channels_last)
            self.target = self.target.to(memory_format=torch.channels_last)
        self.optimizer = _adam(self.online.parameters(), config.learning_rate, config.fused_adam)
        # saved states hold these weights' moments and initial values in nn.Linear's layout
        self._input_major = input_major_weights(self.online)
        # compiled lazily, at the first update; the modules and their state_dict keys stay as they are
        self._loss_fn = torch.compile(self._td_loss) if config.compile else self._td_loss
        self.initial = [p.detach().clone() for p in self.online.parameters()]  # weights_moved is measured from here
        self.measured = (0, 0.0)  # (transitions, seconds) measured by earlier attempts, up to their saved state
        self.wall_s = 0.0  # earlier attempts' wall time, up to their saved state
        self.transitions = 0
        self.updates = 0
        self.target_syncs = 0
        self.resumes = 0
        self.rng = np.random.default_rng([config.seed, 0])

    # -- state -----------------------------------------------------------------------
    def state_path(self) -> Path:
        return self.out_dir / "trainer_state.pt"

    def save_state(self, measured: tuple[int, float], wall_s: float) -> None:
        """Everything but the replay and the emulators: enough to go on from here, and for the
        results to summarise the whole run (its initial weights, the time measured so far)."""
        payload = {
            "format": STATE_FORMAT, "config": asdict(self.config), "contract_hash": self.contract.hash,
            "online": self.online.state_dict(), "target": self.target.state_dict(),
            "optimizer": optimizer_state_transposed_at(self.optimizer.state_dict(), self._input_major),
            "transitions": self.transitions, "updates": self.updates, "target_syncs": self.target_syncs,
            "resumes": self.resumes,
            "initial": transposed_at(self.initial, self._input_major), "measured": list(measured), "wall_s": wall_s,
        }
        write_whole(self.state_path(), torch_bytes(payload))

    def load_state(self) -> None:
        payload = torch.load(self.state_path(), map_location=self.device, weights_only=True)
        if payload.get("format") != STATE_FORMAT:
            raise ValueError(f"{self.state_path()}: not a {STATE_FORMAT} file")
        if payload["contract_hash"] != self.contract.hash:
            raise ValueError(f"{self.state_path()}: saved under contract {payload['contract_hash']}, "
                             f"not {self.contract.hash}")
        self.online.load_state_dict(payload["online"])
        self.target.load_state_dict(payload["target"])
        # the saved param_groups carry the saver's Adam kernel (fused or not), which is this trainer's setting
        kernels = [{k: group[k] for k in ("fused", "foreach") if k in group} for group in self.optimizer.param_groups]
        self.optimizer.load_state_dict(optimizer_state_transposed_at(payload["optimizer"], self._input_major))
        for group, kernel in zip(self.optimizer.param_groups, kernels):
            group.update(kernel)
        _lay_out_moments_like_weights(self.optimizer)
        self.transitions, self.updates = payload["transitions"], payload["updates"]
        self.target_syncs, self.resumes = payload["target_syncs"], payload["resumes"] + 1
        if "initial" in payload:  # a state saved by an older runner: this attempt's seeded weights stand in
            self.initial = transposed_at([t.to(self.device) for t in payload["initial"]], self._input_major)
            self.measured, self.wall_s = (int(payload["measured"][0]), float(payload["measured"][1])), payload["wall_s"]
        self.rng = np.random.default_rng([self.config.seed, self.resumes])

    def load_weights(self, checkpoint: str | Path, *, other_contract: bool = False) -> None:
        """Begin from a checkpoint's weights (online and target), at its transition count, with
        a fresh optimizer: what a checkpoint holds when the trainer's own state is lost. A
        checkpoint trained under another contract is refused unless `other_contract`."""
        network, meta = load_checkpoint(checkpoint)
        if not other_contract and meta.get("contract_hash") != self.contract.hash:
            raise ValueError(f"{checkpoint}: trained under contract {meta.get('contract_hash')}, not "
                             f"{self.contract.hash}")
        if network.architecture != self.online.architecture:
            raise ValueError(f"{checkpoint}: a {network.architecture} network, not the {self.online.architecture} "
                             f"network algorithm {self.config.algorithm} trains")
        self.online.load_state_dict(network.state_dict())
        self.target.load_state_dict(network.state_dict())
        self.transitions = int(meta["transitions"])
        self.resumes += 1
        self.rng = np.random.default_rng([self.config.seed, self.resumes])

    def checkpoint_path(self, transitions: int) -> Path:
        return self.out_dir / f"checkpoint_{transitions:09d}.pt"

    def _so_far(self, clock: tuple[float, int] | None, started: float, now: float) -> tuple[tuple[int, float], float]:
        """((transitions, seconds) measured, wall seconds) over every attempt up to `now`."""
        measured = self.measured
        if clock is not None:
            measured = (measured[0] + self.transitions - clock[1], measured[1] + now - clock[0])
        return measured, self.wall_s + now - started

    # -- acting ----------------------------------------------------------------------
    def _act(self, obs: np.ndarray, epsilon: float) -> np.ndarray:
        """Epsilon-greedy; the network runs only on the envs that act greedily this step.

        The random draws are the same whatever the network does (explore flags, then one
        random action per env), so skipping the forward pass for exploring envs (all of
        them while epsilon is 1) changes no trajectory, only the cost of collecting.
        """
        explore = self.rng.random(len(obs)) < epsilon
        actions = self.rng.integers(self.contract.num_actions, size=len(obs)).astype(np.int64)
        greedy = np.flatnonzero(~explore)
        if len(greedy):
            with torch.inference_mode():
                x = torch.from_numpy(obs[greedy]).to(self.device)
                if self.config.channels_last:
                    x = x.contiguous(memory_format=torch.channels_last)
                actions[greedy] = self.online(x).argmax(dim=1).cpu().numpy()
        return actions

    # -- learning --------------------------------------------------------------------
    def _td_loss(self, obs: torch.Tensor, next_obs: torch.Tensor, actions: torch.Tensor, rewards: torch.Tensor,
                 terminal: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(Huber loss, Q(s, a), TD target) of a batch: the forward part of a gradient step, the
        part `compile` hands to torch.compile."""
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.precision.autocast):
            q_all = self.online(obs)
        q = q_all.float().gather(1, actions[:, None]).squeeze(1)
        with torch.no_grad():
            if self.config.algorithm == "dqn":
                next_q = self.target(next_obs).max(dim=1).values
            else:
                best = self.online(next_obs).argmax(dim=1, keepdim=True)
                next_q = self.target(next_obs).gather(1, best).squeeze(1)
            target = rewards + self.config.gamma * (1.0 - terminal) * next_q
        return F.smooth_l1_loss(q, target), q, target

    def _batch_inputs(self, batch: ReplayBatch) -> tuple[torch.Tensor, ...]:
        obs, next_obs = batch.obs, batch.next_obs
        if self.config.channels_last:
            obs = obs.contiguous(memory_format=torch.channels_last)
            next_obs = next_obs.contiguous(memory_format=torch.channels_last)
        return obs, next_obs, batch.actions, batch.rewards, batch.terminal

    def _update(self, replay: FrameReplay, want_diagnostics: bool) -> dict | None:
        cfg = self.config
        batch = replay.sample(cfg.batch_size, self.device)
        loss, q, target = self._loss_fn(*self._batch_inputs(batch))
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(self.online.parameters(), cfg.max_grad_norm)
        loss_value = float(loss.detach())
        if not math.isfinite(loss_value) or not math.isfinite(float(grad_norm)):
            bad = "loss" if not math.isfinite(loss_value) else "grad_norm"
            raise TrainingDiverged(
                f"non-finite {bad} ({loss_value if bad == 'loss' else float(grad_norm)}) at transition "
                f"{self.transitions}, update {self.updates + 1}")
        self.optimizer.step()
        self.updates += 1
        if not want_diagnostics:
            return None
        td = (target - q).detach().abs()
        values = {"loss": loss_value, "q_mean": float(q.detach().mean()), "target_mean": float(target.mean()),
                  "td_abs_mean": float(td.mean()), "td_abs_max": float(td.max()), "grad_norm": float(grad_norm)}
        for name, value in values.items():
            if not math.isfinite(value):
                raise TrainingDiverged(f"non-finite {name} ({value}) at transition {self.transitions}, "
                                       f"update {self.updates}")
        return values

    # -- the loop --------------------------------------------------------------------
    def run(self, *, resume: bool = False, start_from: str | Path | None = None, other_contract: bool = False
            ) -> Iterator[EpisodeEnd | Diagnostics | CheckpointSaved | TrainDone]:
        """Train to `total_transitions`: from scratch, from the state an interrupted run saved in
        out_dir (`resume`), or from a checkpoint's weights (`start_from`; trained under another
        contract only when `other_contract` says that is deliberate, e.g. fine-tuning a
        breakout-v2 agent under breakout-v3)."""
        cfg = self.config
        if resume and start_from is not None:
            raise ValueError("resume and start_from exclude each other")
        self.out_dir.mkdir(parents=True, exist_ok=True)
        if resume:
            self.load_state()
        elif start_from is not None:
            self.load_weights(start_from, other_contract=other_contract)
        resume = resume or start_from is not None
        n = cfg.num_envs
        replay = FrameReplay(cfg.replay_capacity, n, frame_shape=(self.contract.screen_size,) * 2,
                             stack=self.contract.frame_stack, device=cfg.replay_device, seed=cfg.seed + self.resumes)
        # after a resume the replay starts empty: refill before learning again
        learn_from = self.transitions + cfg.learning_starts if resume else cfg.learning_starts
        driver = EpisodeDriver(self.contract, n)
        started = time.perf_counter()
        clock = (started, self.transitions) if self.transitions >= cfg.measure_from else None
        for i in range(n):  # each slot's first game is seeded; its later games go on from it
            driver.start(i, slot_seed(cfg.seed, self.resumes, i))
        first_of_episode = np.ones(n, dtype=bool)
        while self.transitions < cfg.total_transitions:
            epsilon = cfg.epsilon(self.transitions)
            idx = np.arange(min(n, cfg.total_transitions - self.transitions))  # exact total
            frames = driver.obs[idx, -1].copy()
            step = driver.step(self._act(driver.obs, epsilon), slots=idx)
            done = step.terminated | step.truncated
            learn_reward = np.sign(step.reward) if self.contract.clip_rewards_in_training else step.reward
            terminal = step.terminated | (step.life_lost & cfg.life_loss_terminal)
            replay.add(idx, frames, step.actions[idx], learn_reward[idx].astype(np.float32),
                       terminal[idx], first_of_episode[idx])
            ended = idx[done[idx]]
            if len(ended):
                replay.add_final_frames(ended, step.obs[ended, -1])
            before = self.transitions
            self.transitions += len(idx)
            if clock is None and self.transitions >= cfg.measure_from:
                clock = (time.perf_counter(), self.transitions)
            first_of_episode[idx] = False
            for episode in step.finished:
                yield EpisodeEnd(episode.slot, self.transitions, episode.score, episode.steps, episode.ended_by)
                driver.start(episode.slot, None)
                first_of_episode[episode.slot] = True
            if self.transitions >= learn_from:
                updates_due = _crossings(max(before, learn_from - 1), self.transitions, cfg.train_every)
                diag_due = _crossings(before, self.transitions, cfg.diagnostics_every) > 0
                for k in range(updates_due):
                    values = self._update(replay, want_diagnostics=diag_due and k == updates_due - 1)
                    if values is not None:
                        yield Diagnostics(self.transitions, self.updates, epsilon=epsilon,
                                          replay_frames=int(np.minimum(replay.written, replay.stream_capacity).sum()),
                                          **values)
            if _crossings(before, self.transitions, cfg.target_sync_every):
                self.target.load_state_dict(self.online.state_dict())
                self.target_syncs += 1
            for mark in cfg.checkpoint_at:
                if before < mark <= self.transitions:
                    path = save_checkpoint(self.checkpoint_path(mark), self.online, self.contract,
                                           transitions=self.transitions, train_config=asdict(cfg))
                    # the consumer stores the checkpoint and every record before it, then the state
                    # is saved: a resume never starts past rows that were not stored
                    yield CheckpointSaved(self.transitions, str(path))
                    self.save_state(*self._so_far(clock, started, time.perf_counter()))
        ended = time.perf_counter()
        moved = float(torch.sqrt(sum(((p.detach() - q) ** 2).sum()
                                     for p, q in zip(self.online.parameters(), self.initial))))
        path = save_checkpoint(self.out_dir / "final.pt", self.online, self.contract,
                               transitions=self.transitions, train_config=asdict(cfg))
        yield CheckpointSaved(self.transitions, str(path))
        (measured, measured_s), wall_s = self._so_far(clock, started, ended)
        self.save_state((measured, measured_s), wall_s)
        yield TrainDone(self.transitions, self.updates, self.target_syncs, wall_s, measured, measured_s,
                        measured / measured_s if measured_s > 0 else 0.0, moved)


def slot_seed(seed: int, attempt: int, slot: int) -> int:
    """The episode seed of a training slot's first game in an attempt: distinct per slot and
    attempt, and within the emulator's seed range whatever the (32-bit) training seed."""
    return int(np.random.SeedSequence([seed, attempt, slot]).generate_state(1)[0] >> 1)


def random_replay(config: TrainConfig, contract: Contract) -> FrameReplay:
    """A single-stream replay filled with random frames and actions: what the bare gradient step
    is measured on (its cost does not depend on what the frames show)."""
    replay = FrameReplay(max(4_096, config.batch_size * 8), 1, frame_shape=(contract.screen_size,) * 2,
                         stack=contract.frame_stack, seed=config.seed)
    rng = np.random.default_rng(config.seed)
    for k in range(replay.stream_capacity):
        frame = rng.integers(0, 255, (1, contract.screen_size, contract.screen_size), dtype=np.uint8)
        replay.add(np.array([0]), frame, rng.integers(0, contract.num_actions, 1), np.zeros(1, np.float32),
                   np.zeros(1, bool), np.array([k == 0]))
    return replay


def learner_rate(config: TrainConfig, contract: Contract, *, updates: int = 40, warmup: int = 5) -> float:
    """Bare gradient steps per second: the update alone, on a replay of random frames, with the
    config's network, batch size, memory format, optimizer, compilation and threads. 4 x this (one
    update per 4 transitions) is the learner-bound limit of training throughput."""
    trainer = Trainer(config, contract, "/nonexistent-unused")
    replay = random_replay(config, contract)
    _time_updates(trainer, replay, warmup)
    return updates / _time_updates(trainer, replay, updates)


def precision_timings(config: TrainConfig, contract: Contract, cpu_flags: frozenset[str] | None = None, *,
                      rounds: int = 3, updates: int = 6, warmup: int = 2) -> dict[str, float]:
    """{"fp32_ms", "bf16_ms"}: the median over `rounds` alternated bursts of `updates` gradient
    steps of this config (its batch size, threads, memory format and optimizer; uncompiled, so
    the burst costs a second or two) in each precision, on a replay of random frames."""
    trainers = {precision: Trainer(replace(config, learner_precision=precision, compile=False), contract,
                                   "/nonexistent-unused", cpu_flags=cpu_flags) for precision in ("fp32", "bf16")}
    replay = random_replay(config, contract)
    times: dict[str, list[float]] = {precision: [] for precision in trainers}
    for precision, trainer in trainers.items():
        _time_updates(trainer, replay, warmup)
    for _ in range(rounds):
        for precision, trainer in trainers.items():
            times[precision].append(_time_updates(trainer, replay, updates) / updates * 1e3)
    return {f"{precision}_ms": float(np.median(values)) for precision, values in times.items()}


def _time_updates(trainer: "Trainer", replay: FrameReplay, updates: int) -> float:
    """Seconds `updates` gradient steps of `trainer` took."""
    started = time.perf_counter()
    for _ in range(updates):
        trainer._update(replay, want_diagnostics=False)
    return time.perf_counter() - started


def _lay_out_moments_like_weights(optimizer: torch.optim.Optimizer) -> None:
    """Give each of Adam's moments its weight's memory layout. A state saved under the other
    layout (channels_last on or off) loads its moments as they were saved, and the fused kernel
    pairs a weight with its gradient and moments by memory position, not by index: each weight
    would be updated with another weight's moments, silently."""
    for weight, state in optimizer.state.items():
        for key, value in state.items():
            if torch.is_tensor(value) and value.shape == weight.shape and value.stride() != weight.stride():
                state[key] = torch.empty_like(weight).copy_(value)


def _adam(params, lr: float, fused: bool) -> torch.optim.Optimizer:
    if fused:
        try:
            return torch.optim.Adam(params, lr=lr, fused=True)
        except (RuntimeError, TypeError):
            pass
    return torch.optim.Adam(params, lr=lr)
