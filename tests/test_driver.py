"""The episode driver on the real ALE: its preprocessing is the native vector env's, and an
episode is a function of (contract, policy, seed) wherever and whenever it is played."""

import hashlib
import json
import subprocess
import sys

import numpy as np
import pytest

from breakout_core.contract import CONTRACTS, Contract
from breakout_core.driver import GAME_OVER, STOPPED, EpisodeDriver, make_vector_env, new_emulator, play_seeds, seed_state
from breakout_core.envs import AleGame

V3 = CONTRACTS["breakout-v3"]
SEEDS = [3, 17, 4, 250, 9, 11, 40, 7]


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


def test_a_restored_seed_state_plays_as_a_fresh_seeded_load():
    fresh = AleGame(V3, new_emulator(V3, 123))
    fresh.reset()
    restored = AleGame(V3, new_emulator(V3, 0))
    restored.reset(seed_state(V3, 999))  # another game first
    for action in range(50):
        restored.step(action % 4)
    restored.reset(seed_state(V3, 123))
    for action in np.random.default_rng(0).integers(0, 4, 300):
        assert fresh.step(int(action)) == restored.step(int(action))
        assert np.array_equal(fresh.obs, restored.obs)


class Scripted:
    """The same action sequence whatever it sees or whichever episode it plays."""

    def __init__(self):
        self.pattern = np.array([1, 2, 2, 2, 3, 3, 3, 3, 2, 0, 1, 3], dtype=np.int64)

    def __call__(self, driver):
        def decide(obs, slots, generators):
            return self.pattern[[driver.steps_played(i) % len(self.pattern) for i in slots]]
        return decide


def trajectories(contract, seeds, slots, max_steps=None):
    """Per seed: a digest of every step's observation, reward and action, and the episode."""
    driver = EpisodeDriver(contract, slots)
    digests = {s: hashlib.sha256() for s in seeds}

    def on_step(result):
        for i in result.slots:
            digests[driver.seeds[i]].update(result.obs[i].tobytes() + bytes([int(result.actions[i])])
                                            + str(result.reward[i]).encode())

    played = play_seeds(driver, seeds, Scripted()(driver), on_step=on_step, max_steps=max_steps)
    return {s: (digests[s].hexdigest(), played[s].score, played[s].steps, played[s].frames, played[s].ended_by)
            for s in seeds}


@pytest.mark.slow
def test_v3_episodes_are_the_same_alone_batched_reversed_and_in_another_process():
    short = V3.replace(max_episode_frames=4_000)
    batched = trajectories(short, SEEDS, 8)
    assert trajectories(short, SEEDS[::-1], 8) == batched
    assert trajectories(short, SEEDS, 3) == batched  # other slots, after other episodes
    assert {s: trajectories(short, [s], 1)[s] for s in SEEDS} == batched
    code = ("import json, sys; sys.path.insert(0, 'tests'); from test_driver import trajectories, SEEDS; "
            "from breakout_core.contract import CONTRACTS; "
            "print(json.dumps(trajectories(CONTRACTS['breakout-v3'].replace(max_episode_frames=4_000), SEEDS[::-1], 2)))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert {int(k): tuple(v) for k, v in json.loads(other.stdout).items()} == batched


def test_v3_seeds_give_different_games_to_a_fixed_script():
    played = trajectories(V3, list(range(20)), 4)
    outcomes = {(score, steps) for _, score, steps, _, _ in played.values()}
    assert len(outcomes) >= 15, outcomes  # most of 20 seeds differ in score or length
    # without sticky actions the same script plays one game, whatever the seed
    plain = trajectories(V3.replace(repeat_action_probability=0.0), list(range(5)), 4)
    assert len({(score, steps) for _, score, steps, _, _ in plain.values()}) == 1


def test_forced_actions_are_the_contracts():
    """A no-op start of the seed's length, and (when the contract serves) FIRE after a lost life."""
    contract = V3.replace(noop_start_max=30, serve_after_life_loss=True)
    driver = EpisodeDriver(contract, 1)
    left = lambda obs, slots, generators: np.full(len(slots), 3)  # never serves by itself
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
    breakout-v3 agent must learn to serve (docs/contract_v3.md)."""
    assert unserved_starts(CONTRACTS["breakout-v2"], range(100)) == 0
    assert 10 <= unserved_starts(V3, range(100)) <= 40
