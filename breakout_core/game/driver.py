"""The episode driver: the one place that plays the contract's rules, for N game slots.

Every caller that plays Breakout (evaluator, trainer, fixed-state capture, the closed
loop, the play page) goes through it; none of them implements a rule of the contract:

- An episode of seed `s` starts from the emulator state that a ROM load seeded with `s`
  leaves after ALE's reset (the sticky-action generator included; `envs.episode_start`), so
  its whole trajectory is a function of (contract, policy, seed): the same alone, in any
  batch, in any slot, after any other episode, in any process. The state is made once per
  seed and process (a ROM load and a reset) and restored for each later episode of that
  seed, at a tenth of the cost of ALE's reset. Without sticky actions the seed does not
  reach the emulator, and every episode starts from one state.
- The no-op start: 0..noop_start_max forced NOOP agent steps, the count drawn from the seed.
- The serve after a lost life, when the contract asks for it: one forced FIRE agent step.
- Lives, scores, lengths, action counts and how each episode ended are kept per slot.

A slot can also go on unseeded (`start(slot, None)`): the next game continues the slot's
emulator and generators. Training does this; evaluation never does.

The driver that the `evaluate` and `episodes` kinds share between their policies steps its
games in two processes (`evaluation_driver`, `breakout_core.game.game_worker`); every other
caller's steps them in its own (training's cores belong to the learner).

ale-py's native vector env (`make_vector_env`), under the contract's emulator settings but
none of its episode rules, is the bare-stepping baseline that benchmarks measure the
driver against.
"""

from __future__ import annotations

import os
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
from ale_py.vector_env import AtariVectorEnv

from breakout_core.common.cores import usable_cores
from breakout_core.game.contract import FIRE, MAX_EPISODE_SEED, Contract
from breakout_core.game.envs import AleGame, new_emulator
from breakout_core.game.game_worker import GameWorker, SlotArrays, reset_game, step_games

NOOP = 0
NOOP_STREAM = 0x6E6F6F70  # keeps the no-op draw apart from any policy's generator
GAME_OVER = "game_over"
TIME_LIMIT = "time_limit"
STOPPED = "stopped"  # ended by its caller (a step cap), not by the game


@dataclass(frozen=True)
class FinishedEpisode:
    slot: int
    seed: int | None  # None: an unseeded continuation
    score: float  # raw Atari score, full game
    steps: int  # agent steps (transitions), forced ones included
    noop_steps: int  # forced NOOP steps at its start
    frames: int  # emulator frames
    ended_by: str  # GAME_OVER, TIME_LIMIT or STOPPED
    action_counts: tuple[int, ...]  # per output of the contract's action set (contract.action_names), as played
    wall_s: float  # from its start to its end (shared with its batch)


@dataclass(frozen=True)
class StepResult:
    slots: np.ndarray  # the slots that stepped
    actions: np.ndarray  # (N,) actions played (forced ones included); NOOP for slots that did not step
    forced: np.ndarray  # (N,) bool: the contract chose the action (False for slots that did not step)
    reward: np.ndarray  # (N,) raw reward
    terminated: np.ndarray  # (N,) game over
    truncated: np.ndarray  # (N,) time limit
    life_lost: np.ndarray  # (N,) a life was lost in this step
    obs: np.ndarray  # (N, stack, H, W) observations after the step (a copy: final ones where episodes ended)
    finished: list[FinishedEpisode]


def noop_rng(episode_seed: int) -> np.random.Generator:
    """The generator that draws an episode's no-op start: a function of its seed only."""
    return np.random.default_rng([NOOP_STREAM, episode_seed])


class EpisodeDriver:
    """N game slots playing the contract's episodes; the caller decides the free actions.

    With `processes` > 1 the slots are split into that many groups of consecutive slots:
    this process steps the first (the smallest) and a worker process each other, in
    parallel (`breakout_core.game.game_worker`). Nothing else changes: every rule and all
    bookkeeping stay here, and an episode plays the same in any group. `close` ends the
    workers (they also end with the driver's process).
    """

    def __init__(self, contract: Contract, slots: int, *, processes: int = 1):
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        if not 1 <= processes <= slots:
            raise ValueError(f"processes must be 1..{slots} (one slot at least each), got {processes}")
        if processes > 1 and not hasattr(os, "memfd_create"):
            raise ValueError("a driver with worker processes needs os.memfd_create (Linux); use processes=1")
        self.contract = contract
        shape = (slots, contract.frame_stack, contract.screen_size, contract.screen_size)
        sizes = sorted(slots // processes + (k < slots % processes) for k in range(processes))
        bounds = np.cumsum([0, *sizes])
        # each game writes its slot's observation and step outcome in place, the workers' ones too
        self._arrays = SlotArrays.local(shape) if processes == 1 else SlotArrays.shared(shape)
        self.obs = self._arrays.obs
        self._workers = [GameWorker(contract, range(bounds[k], bounds[k + 1]), self._arrays)
                         for k in range(1, processes)]
        self._group = np.repeat(np.arange(processes), sizes)  # per slot: 0 this process, k the k-th worker
        # the games this process steps: the first group's slots (all of them with processes=1)
        self.games = [AleGame(contract, new_emulator(contract, 0), self.obs[i]) for i in range(sizes[0])]
        self.active = np.zeros(slots, dtype=bool)
        self.seeds: list[int | None] = [None] * slots
        self._noop_rngs: list[np.random.Generator | None] = [None] * slots
        self._noops_left = np.zeros(slots, dtype=np.int64)
        self._noops = np.zeros(slots, dtype=np.int64)
        self._serve = np.zeros(slots, dtype=bool)
        self._score = np.zeros(slots)
        self._steps = np.zeros(slots, dtype=np.int64)
        self._counts = np.zeros((slots, contract.num_actions), dtype=np.int64)
        self._started = np.zeros(slots)

    @property
    def num_slots(self) -> int:
        return len(self.obs)

    def close(self) -> None:
        """End the worker processes, if any; the driver cannot step afterwards."""
        for worker in self._workers:
            worker.close()

    def start(self, slot: int, seed: int | None) -> None:
        """Begin an episode in `slot`: seed `seed`'s, or (None) the slot's next unseeded game."""
        if seed is not None and not 0 <= seed <= MAX_EPISODE_SEED:
            raise ValueError(f"episode seed {seed} is outside 0..{MAX_EPISODE_SEED} (ALE seeds its sticky actions "
                             "with a 32-bit int)")
        if seed is None and self._noop_rngs[slot] is None:
            raise ValueError(f"slot {slot} has no seeded episode to continue from")
        if self._group[slot]:
            self._arrays.frames[slot] = self._workers[self._group[slot] - 1].reset(slot, seed)
        else:
            self._arrays.frames[slot] = reset_game(self.games[slot], self.contract, seed)
        if seed is not None:
            self._noop_rngs[slot] = noop_rng(seed)
        self.seeds[slot] = seed
        count = int(self._noop_rngs[slot].integers(0, self.contract.noop_start_max + 1))
        self._noops[slot] = self._noops_left[slot] = count
        self._serve[slot] = False
        self._score[slot], self._steps[slot], self._counts[slot] = 0.0, 0, 0
        self._started[slot] = time.perf_counter()
        self.active[slot] = True

    def stop(self, slot: int) -> FinishedEpisode | None:
        """Leave `slot` idle; the episode it was playing, if any, ends as STOPPED."""
        finished = self._finish(slot, STOPPED, time.perf_counter()) if self.active[slot] else None
        self.active[slot] = False
        return finished

    def forced(self) -> np.ndarray:
        """(N,) bool: active slots whose next action the contract decides (no-op start, serve)."""
        return self.active & ((self._noops_left > 0) | self._serve)

    def deciding(self) -> np.ndarray:
        """Indices of the active slots whose next action is the caller's."""
        return np.flatnonzero(self.active & ~self.forced())

    def steps_played(self, slot: int) -> int:
        return int(self._steps[slot])

    def step(self, actions: np.ndarray | None = None, slots: Sequence[int] | None = None) -> StepResult:
        """Step `slots` (default: every active slot) once.

        `actions` (N,) holds the caller's choice for the deciding slots; the contract's
        forced actions replace it elsewhere. An episode that ends is reported in `finished`
        and its slot waits for `start` or `stop`: its row of `self.obs` holds the final
        observation until then.
        """
        n = self.num_slots
        run = np.flatnonzero(self.active) if slots is None else np.asarray(slots, dtype=np.int64)
        if slots is not None and (len(set(run.tolist())) != len(run) or not all(0 <= s < n for s in run.tolist())):
            raise ValueError(f"slots must be distinct indices 0..{n - 1}, got {run.tolist()}")
        if len(run) and not self.active[run].all():
            raise ValueError(f"slots {run[~self.active[run]].tolist()} have no episode; start one first")
        stepping = np.zeros(n, dtype=bool)
        stepping[run] = True
        forced = self.forced() & stepping
        played = np.zeros(n, dtype=np.int64)
        if actions is not None:
            played[stepping] = np.asarray(actions)[stepping]
        outside = stepping & ~forced & ((played < 0) | (played >= self.contract.num_actions))
        if outside.any():  # an index like -1 would play another action (LEFT) rather than fail
            slot = int(np.flatnonzero(outside)[0])
            raise ValueError(f"action {int(played[slot])} for slot {slot} is not one of contract "
                             f"{self.contract.name}'s actions 0..{self.contract.num_actions - 1}")
        played[forced] = NOOP
        played[self._serve & stepping] = FIRE
        asked = []  # the workers' games step while this process steps its own
        try:
            for group, worker in enumerate(self._workers, start=1):
                theirs = run[self._group[run] == group]
                if len(theirs):
                    worker.send_step(theirs, played[theirs])
                    asked.append(worker)
            mine = run[run < len(self.games)]
            step_games([self.games[i] for i in mine], mine, played[mine], self._arrays)
        finally:  # even when this process's games raised: no worker's reply is left unread
            for worker in asked:
                worker.receive_step()
        out = self._arrays
        reward = np.where(stepping, out.reward, 0.0)
        terminated, truncated, life_lost = out.terminated & stepping, out.truncated & stepping, out.life_lost & stepping
        self._noops_left[run] = np.maximum(self._noops_left[run] - 1, 0)
        self._serve[run] = False
        if self.contract.serve_after_life_loss:
            self._serve[run] = life_lost[run] & ~(terminated[run] | truncated[run])
        self._score[run] += reward[run]
        self._steps[run] += 1
        np.add.at(self._counts, (run, played[run]), 1)
        finished = []
        ended = run[(terminated | truncated)[run]]
        if len(ended):
            now = time.perf_counter()
            for i in ended:
                finished.append(self._finish(int(i), GAME_OVER if terminated[i] else TIME_LIMIT, now))
                self.active[i] = False
        return StepResult(slots=run, actions=played, forced=forced, reward=reward, terminated=terminated,
                          truncated=truncated, life_lost=life_lost, obs=self.obs.copy(), finished=finished)

    def _finish(self, slot: int, ended_by: str, now: float) -> FinishedEpisode:
        return FinishedEpisode(
            slot=slot, seed=self.seeds[slot], score=float(self._score[slot]), steps=int(self._steps[slot]),
            noop_steps=int(self._noops[slot]), frames=int(self._arrays.frames[slot]), ended_by=ended_by,
            action_counts=tuple(int(c) for c in self._counts[slot]), wall_s=float(now - self._started[slot]))


# A worker costs ~0.5 s to start (imports, its ROM loads): on 2 cores, 16 random-policy episodes played
# by a driver made for them take about as long with one as without; a trained agent's longer episodes and
# every policy after the first (the seeds' states already made in both processes) repay it.
WORKER_MIN_EPISODES = 16


def episode_rng(policy_seed: int, episode_seed: int) -> np.random.Generator:
    """The generator a policy uses for one episode: a function of both seeds only."""
    return np.random.default_rng([policy_seed, episode_seed])


def evaluation_driver(contract: Contract, batch_size: int, seeds: int, policies: int) -> EpisodeDriver:
    """The driver that plays `seeds` episodes, `batch_size` side by side, for each of
    `policies` policies (or runtimes) one after another.

    Its games are stepped by two processes where there are two slots, two cores, at least
    `WORKER_MIN_EPISODES` episodes in all to pay for the worker's start, and Linux (the
    worker maps the observations through a memfd). The caller closes it.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    slots = max(1, min(batch_size, seeds))
    parallel = (slots >= 2 and usable_cores() >= 2 and seeds * policies >= WORKER_MIN_EPISODES
                and hasattr(os, "memfd_create"))
    return EpisodeDriver(contract, slots, processes=2 if parallel else 1)


# (obs of the deciding slots, those slots, each one's episode generator) -> their actions
Decide = Callable[[np.ndarray, np.ndarray, list[np.random.Generator]], np.ndarray]


def play_seeds(
    driver: EpisodeDriver,
    seeds: Sequence[int],
    decide: Decide,
    *,
    policy_seed: int = 0,
    on_step: Callable[[StepResult], None] | None = None,
    on_episode: Callable[[FinishedEpisode], None] | None = None,
    max_steps: int | None = None,
) -> dict[int, FinishedEpisode]:
    """Play one episode per seed across the driver's slots; a slot that finishes takes the
    next seed. `decide` chooses the deciding slots' actions (their seeds are
    `driver.seeds[slot]`), given each episode's own generator for the policy's randomness
    (`episode_rng(policy_seed, seed)`); `max_steps` (agent steps) stops an episode
    early as STOPPED."""
    seeds = [int(s) for s in seeds]
    if not seeds:
        raise ValueError("seeds must not be empty")
    if len(set(seeds)) != len(seeds):
        raise ValueError("seeds must be distinct")
    if max_steps is not None and max_steps < 1:
        raise ValueError(f"max_steps must be >= 1, got {max_steps}")
    pending = deque(seeds)
    done: dict[int, FinishedEpisode] = {}
    generators: dict[int, np.random.Generator] = {}  # of the episodes being played

    def generator(seed: int) -> np.random.Generator:
        if seed not in generators:
            generators[seed] = episode_rng(policy_seed, seed)
        return generators[seed]

    def finish(episode: FinishedEpisode) -> None:
        done[episode.seed] = episode
        generators.pop(episode.seed, None)
        if on_episode is not None:
            on_episode(episode)
        if pending:
            driver.start(episode.slot, pending.popleft())

    for slot in range(min(driver.num_slots, len(seeds))):
        driver.start(slot, pending.popleft())
    while driver.active.any():
        deciding = driver.deciding()
        actions = np.zeros(driver.num_slots, dtype=np.int64)
        if len(deciding):
            actions[deciding] = decide(driver.obs[deciding], deciding, [generator(driver.seeds[i]) for i in deciding])
        result = driver.step(actions)
        if on_step is not None:
            on_step(result)
        for episode in result.finished:
            finish(episode)
        if max_steps is not None:
            for slot in np.flatnonzero(driver.active):
                if driver.steps_played(slot) >= max_steps:
                    finish(driver.stop(int(slot)))
    return done


def make_vector_env(contract: Contract, num_envs: int, *, num_threads: int = 0) -> AtariVectorEnv:
    """ale-py's native vector env under the contract's preprocessing, with its own autoreset:
    the bare-stepping baseline (no no-op starts, serves or seeding rules of the contract)."""
    if num_envs < 1:
        raise ValueError(f"num_envs must be >= 1, got {num_envs}")
    return AtariVectorEnv(
        contract.game,
        num_envs,
        num_threads=num_threads,
        max_num_frames_per_episode=contract.max_episode_frames,
        repeat_action_probability=contract.repeat_action_probability,
        full_action_space=contract.full_action_space,
        autoreset_mode="NextStep",
        img_height=contract.screen_size,
        img_width=contract.screen_size,
        grayscale=True,
        stack_num=contract.frame_stack,
        frameskip=contract.frame_skip,
        maxpool=contract.max_pool,
        noop_max=0,
        episodic_life=False,
        reward_clipping=False,
        use_fire_reset=contract.fire_on_reset,
    )


def bare_stepping_rate(contract: Contract, num_envs: int, steps: int, *, seed: int = 0) -> float:
    """Transitions per second of the vector env alone, stepping random actions (its own
    autoreset), env creation excluded: the ceiling for anything that acts in it."""
    env = make_vector_env(contract, num_envs)
    try:
        env.reset()
        rng = np.random.default_rng(seed)
        actions = rng.integers(0, contract.num_actions, (steps, num_envs))
        started = time.perf_counter()
        for row in actions:
            env.step(row)
        return steps * num_envs / (time.perf_counter() - started)
    finally:
        env.close()
