"""The episode driver on the real ALE: its preprocessing is the native vector env's, and an
episode is a function of (contract, policy, seed) wherever and whenever it is played."""

import dataclasses
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np
import pytest

from breakout_core.common.cores import usable_cores
from breakout_core.game import driver as driver_module
from breakout_core.game.contract import CONTRACTS, MAX_REPEAT_ACTION_PROBABILITY, Contract
from breakout_core.game.driver import (
    GAME_OVER,
    STOPPED,
    WORKER_MIN_EPISODES,
    EpisodeDriver,
    evaluation_driver,
    make_vector_env,
    play_seeds,
)
from breakout_core.game.envs import (
    LAST_ACTION_CLEARING_DRAW,
    LAST_ACTION_CLEARING_SEED,
    AleGame,
    episode_start,
    new_emulator,
)
from breakout_core.game.game_worker import GameWorkerError

V3 = CONTRACTS["breakout-v3"]
two_processes = pytest.mark.skipif(not hasattr(os, "memfd_create") or usable_cores() < 2,
                                   reason="a driver's worker process needs os.memfd_create (Linux) and two cores")
SEEDS = [3, 17, 4, 11, 7]  # games of five lengths: slots free up at different steps


@pytest.mark.parametrize("sticky", [0.0, 0.25])
def test_a_game_is_the_native_vector_envs_game_frame_by_frame(sticky):
    """A fresh ROM load seeded with s, then the driver's preprocessing, against ale-py's vector
    env reset with seed s: the same observations, rewards, lives and frame counts."""
    contract = Contract().replace(repeat_action_probability=sticky)
    env = make_vector_env(contract, 1)
    try:
        for seed in (5, 6):
            game = AleGame(contract, new_emulator(contract, seed))
            game.reset()
            obs, _ = env.reset(seed=np.array([seed]))
            assert np.array_equal(obs[0], game.obs)
            actions = np.random.default_rng(seed).integers(0, 4, 400)
            for action in actions:
                reward, over, truncated = game.step(int(action))
                obs, rewards, terminated, _, info = env.step(np.array([action]))
                assert np.array_equal(obs[0], game.obs)
                assert (reward, over, game.lives, game.episode_frames()) == (
                    rewards[0], terminated[0], info["lives"][0], info["episode_frame_number"][0])
                if over:
                    break
    finally:
        env.close()


@pytest.mark.parametrize("contract", [V3, V3.replace(repeat_action_probability=0.0), V3.replace(fire_on_reset=False)],
                         ids=["v3", "no-sticky", "no-reset-fire"])
def test_an_episode_start_plays_as_a_fresh_seeded_load_whatever_came_before(contract):
    """ALE keeps the last action played out of its saved states, and sticky actions may repeat
    it: the game before (ending on FIRE, RIGHT or LEFT held) must not reach the next one."""
    restored = AleGame(contract, new_emulator(contract, 0))
    restored.reset(episode_start(contract, 999))
    for last_action, seed in zip((1, 2, 3, 1, 2, 3), (123, 5, 77777, 40, 6, 2**31 - 1)):
        for _ in range(20):
            restored.step(last_action)
        fresh = AleGame(contract, new_emulator(contract, seed))
        fresh.reset()
        restored.reset(episode_start(contract, seed))
        assert np.array_equal(fresh.obs, restored.obs)
        for action in np.random.default_rng(seed).integers(0, 4, 200):
            assert fresh.step(int(action)) == restored.step(int(action))
            assert np.array_equal(fresh.obs, restored.obs)
            assert (fresh.lives, fresh.episode_frames()) == (restored.lives, restored.episode_frames())


def test_the_last_action_clearing_draw_is_the_generators_first():
    """The NOOP frame that clears the last action keeps nothing only if seed 0's first draw is
    above every contract's repeat probability (ALE's std::mt19937 seeds as numpy's MT19937)."""
    generator = np.random.MT19937()
    generator.state = {"bit_generator": "MT19937",
                       "state": {"key": np.random.RandomState(LAST_ACTION_CLEARING_SEED).get_state()[1], "pos": 624}}
    assert generator.random_raw() / 2**32 == LAST_ACTION_CLEARING_DRAW
    assert MAX_REPEAT_ACTION_PROBABILITY < LAST_ACTION_CLEARING_DRAW
    assert all(c.repeat_action_probability <= MAX_REPEAT_ACTION_PROBABILITY for c in CONTRACTS.values())
    # ALE keeps the probability to 6 significant digits: 0.5488135 is read as 0.548814, above the draw
    with pytest.raises(ValueError, match="would keep the last action"):
        episode_start(V3.replace(repeat_action_probability=0.5488135), 1)


class Scripted:
    """The same action sequence whatever it sees or whichever episode it plays."""

    def __init__(self):
        self.pattern = np.array([1, 2, 2, 2, 3, 3, 3, 3, 2, 0, 1, 3], dtype=np.int64)

    def __call__(self, driver):
        def decide(obs, slots, generators):
            return self.pattern[[driver.steps_played(i) % len(self.pattern) for i in slots]]
        return decide


def trajectories(contract, seeds, slots, max_steps=None, processes=1):
    """Per seed: a digest of every step's observation, reward and action, and the episode."""
    driver = EpisodeDriver(contract, slots, processes=processes)
    digests = {s: hashlib.sha256() for s in seeds}

    def on_step(result):
        for i in result.slots:
            digests[driver.seeds[i]].update(result.obs[i].tobytes() + bytes([int(result.actions[i])])
                                            + str(result.reward[i]).encode())

    played = play_seeds(driver, seeds, Scripted()(driver), on_step=on_step, max_steps=max_steps)
    driver.close()
    return {s: (digests[s].hexdigest(), played[s].score, played[s].steps, played[s].frames, played[s].ended_by)
            for s in seeds}


@pytest.mark.slow
def test_v3_episodes_are_the_same_alone_batched_reversed_and_in_another_process():
    short = V3.replace(max_episode_frames=4_000)
    batched = trajectories(short, SEEDS, len(SEEDS))
    assert trajectories(short, SEEDS[::-1], len(SEEDS)) == batched
    assert trajectories(short, SEEDS, 3) == batched  # other slots, after other episodes
    if hasattr(os, "memfd_create"):
        assert trajectories(short, SEEDS[::-1], 5, processes=2) == batched  # 3 of the 5 slots in a worker process
    assert {s: trajectories(short, [s], 1)[s] for s in SEEDS} == batched
    code = ("import json, sys; sys.path.insert(0, 'tests'); from test_driver import trajectories, SEEDS; "
            "from breakout_core.game.contract import CONTRACTS; "
            "print(json.dumps(trajectories(CONTRACTS['breakout-v3'].replace(max_episode_frames=4_000), "
            "SEEDS[::-1], 2)))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert {int(k): tuple(v) for k, v in json.loads(other.stdout).items()} == batched


def test_v3_seeds_give_different_games_to_a_fixed_script():
    played = trajectories(V3, list(range(12)), 4)
    outcomes = {(score, steps) for _, score, steps, _, _ in played.values()}
    assert len(outcomes) >= 9, outcomes  # most of 12 seeds differ in score or length
    # without sticky actions the same script plays one game, whatever the seed
    plain = trajectories(V3.replace(repeat_action_probability=0.0), list(range(4)), 4)
    assert len({(score, steps) for _, score, steps, _, _ in plain.values()}) == 1


def test_forced_actions_are_the_contracts():
    """A no-op start of the seed's length, and (when the contract serves) FIRE after a lost life."""
    contract = V3.replace(noop_start_max=30, serve_after_life_loss=True)
    driver = EpisodeDriver(contract, 1)

    def left(obs, slots, generators):  # never serves by itself
        return np.full(len(slots), 3)

    finished = []
    forced_actions = []

    def on_step(result):
        if result.forced[0]:
            forced_actions.append(int(result.actions[0]))

    episode = play_seeds(driver, [8], left, on_step=on_step, on_episode=finished.append)[8]
    assert episode.ended_by == GAME_OVER and finished == [episode]
    assert forced_actions == [0] * episode.noop_steps + [1] * 4  # four serves: five lives
    assert episode.action_counts[1] == 4
    capped = play_seeds(EpisodeDriver(contract, 1), [8], left, max_steps=10)[8]
    assert capped.ended_by == STOPPED and capped.steps == 10


def test_a_slot_without_an_episode_cannot_step_or_continue():
    driver = EpisodeDriver(V3, 2)
    with pytest.raises(ValueError, match="no seeded episode"):
        driver.start(0, None)
    driver.start(0, 1)
    with pytest.raises(ValueError, match=r"slots \[1\]"):
        driver.step(np.zeros(2, dtype=np.int64), slots=[0, 1])
    for bad in ([0, 0], [-1], [2]):
        with pytest.raises(ValueError, match="distinct indices 0..1"):
            driver.step(np.zeros(2, dtype=np.int64), slots=bad)
    with pytest.raises(ValueError, match=r"outside 0..2147483647"):
        driver.start(1, 2**31)  # ALE seeds its sticky actions with a 32-bit int


def test_slots_that_do_not_step_report_nothing_played():
    driver = EpisodeDriver(V3.replace(serve_after_life_loss=True), 2)
    driver.start(0, 1)
    driver.start(1, 2)
    result = driver.step(np.array([2, 3]), slots=[0])
    assert result.actions.tolist() == [2, 0] and not result.forced[1] and driver.steps_played(1) == 0


def unserved_starts(contract, seeds) -> int:
    """Episodes whose ball is not in play after the reset: 150 NOOP steps lose no life."""
    driver = EpisodeDriver(contract, 1)
    unserved = 0
    for seed in seeds:
        driver.start(0, seed)
        lives = driver.games[0].lives
        for _ in range(150):
            driver.step(np.zeros(1, dtype=np.int64))
            if driver.games[0].lives < lives:
                break
        else:
            unserved += 1
        driver.stop(0)
    return unserved


@pytest.mark.slow
def test_under_v3_the_reset_fire_is_sticky_too():
    """The one-frame FIRE that starts a game is replaced by NOOP a quarter of the time, so a
    breakout-v3 agent must learn to serve (docs/contract_v3.md): of 40 seeds, 10 expected,
    from 4 to 16 (about two standard deviations of a binomial draw; these seeds give 11)."""
    assert unserved_starts(CONTRACTS["breakout-v2"], range(40)) == 0
    assert 4 <= unserved_starts(V3, range(40)) <= 16


def step_by_step(processes):
    """Every step's results on 3 slots, one of them continued unseeded as training does, and
    the episodes: under a contract that serves after each lost life."""
    contract = V3.replace(noop_start_max=5, serve_after_life_loss=True, max_episode_frames=3_000)
    driver = EpisodeDriver(contract, 3, processes=processes)
    for slot, seed in enumerate((21, 22, 23)):
        driver.start(slot, seed)
    steps, finished = [], []
    for t in range(900):
        result = driver.step(np.array([(t + slot) % 4 for slot in range(3)]))
        steps.append((result.actions.tolist(), result.forced.tolist(), result.reward.tolist(),
                      result.terminated.tolist(), result.truncated.tolist(), result.life_lost.tolist(),
                      hashlib.sha256(result.obs.tobytes()).hexdigest()))
        for episode in result.finished:
            finished.append(dataclasses.replace(episode, wall_s=0.0))
            driver.start(episode.slot, None)
    driver.close()
    return steps, finished


@two_processes
def test_a_worker_process_steps_its_slots_as_this_process_would():
    in_one, in_two = step_by_step(1), step_by_step(2)
    assert in_one[1], "no episode ended: the comparison would miss unseeded continuations"
    assert in_two == in_one


@two_processes
def test_a_dead_worker_is_an_error_that_names_it():
    driver = EpisodeDriver(V3, 2, processes=2)
    driver.start(0, 1)
    driver.start(1, 2)
    worker = driver._workers[0]
    worker._process.kill()
    worker._process.wait()
    with pytest.raises(GameWorkerError, match=r"game worker for slots \[1\] \(pid \d+\) ended unexpectedly"):
        driver.step(np.zeros(2, dtype=np.int64))


@two_processes
def test_a_worker_ends_with_the_process_that_made_it():
    """Killed without a chance to close it, the driver's process leaves no worker behind."""
    code = ("import os, signal; from breakout_core.game.contract import CONTRACTS; "
            "from breakout_core.game.driver import EpisodeDriver; "
            "d = EpisodeDriver(CONTRACTS['breakout-v3'], 2, processes=2); d.start(1, 5); "
            "print(d._workers[0]._process.pid, flush=True); os.kill(os.getpid(), signal.SIGKILL)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    pid = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and pathlib.Path(f"/proc/{pid}").exists():
        if pathlib.Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            break  # exited, waiting for init to reap it
        time.sleep(0.1)
    else:
        assert not pathlib.Path(f"/proc/{pid}").exists(), f"worker {pid} outlived its driver's process"


@two_processes
def test_an_evaluation_gets_a_worker_only_where_it_can_pay_for_it():
    made = []
    try:  # (batch, seeds, policies) -> (slots, workers): no more slots than seeds, a worker from 16 episodes in all
        for batch, seeds, policies in ((4, WORKER_MIN_EPISODES, 1), (4, WORKER_MIN_EPISODES // 2, 2),
                                       (4, WORKER_MIN_EPISODES - 1, 1), (8, 4, 4), (1, 100, 1)):
            made.append(evaluation_driver(V3, batch, seeds, policies))
        assert [(d.num_slots, len(d._workers)) for d in made] == [(4, 1), (4, 1), (4, 0), (4, 1), (1, 0)]
    finally:
        for driver in made:
            driver.close()
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        evaluation_driver(V3, 0, 10, 1)


@two_processes
def test_an_interrupted_step_leaves_the_worker_in_step_and_a_closed_one_says_so(monkeypatch):
    driver = EpisodeDriver(V3, 2, processes=2)
    driver.start(0, 1)
    driver.start(1, 2)
    real = driver_module.step_games

    def failing(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(driver_module, "step_games", failing)
    with pytest.raises(KeyboardInterrupt):
        driver.step(np.zeros(2, dtype=np.int64))  # the worker's reply to it is read all the same
    monkeypatch.setattr(driver_module, "step_games", real)
    driver.start(1, 3)  # would read the interrupted step's reply if it were left in the pipe
    assert len(driver.step(np.zeros(2, dtype=np.int64)).slots) == 2
    driver.close()
    with pytest.raises(GameWorkerError, match=r"game worker for slots \[1\] is closed"):
        driver.step(np.zeros(2, dtype=np.int64))
