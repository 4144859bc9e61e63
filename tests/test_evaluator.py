"""The evaluator on the real ALE: deterministic per seed, alone or inside any batch."""

import imageio.v3 as iio
import numpy as np
import pytest

from breakout_core.evaluation.evaluator import evaluate, write_gif
from breakout_core.evaluation.policies import QNetworkPolicy, RandomPolicy
from breakout_core.game.contract import Contract
from breakout_core.game.driver import GAME_OVER, TIME_LIMIT

SHORT = Contract().replace(max_episode_frames=2_000)  # keeps a stalling untrained net short
SEEDS = [11, 3, 27, 8, 15]


def _key(result):
    return [(e.seed, e.score, e.steps, e.frames, e.ended_by, e.action_counts) for e in result.episodes]


def test_random_policy_is_deterministic_run_to_run():
    first = evaluate(RandomPolicy(), SEEDS, Contract(), batch_size=3)
    second = evaluate(RandomPolicy(), SEEDS, Contract(), batch_size=3)
    assert _key(first) == _key(second)
    assert [e.seed for e in first.episodes] == SEEDS  # results come back in the order given
    assert all(e.ended_by == GAME_OVER for e in first.episodes)
    # frames are the emulator's own count: 4 a step, give or take the reset's FIRE and a game
    # over that lands inside a frame skip
    assert all(abs(e.frames - e.steps * SHORT.frame_skip) <= SHORT.frame_skip for e in first.episodes)
    assert sum(e.steps for e in first.episodes) == first.transitions


@pytest.mark.slow
@pytest.mark.parametrize("batch_size", [2, 5, 8])
def test_batched_and_single_episodes_agree_per_seed_random(batch_size):
    alone = [evaluate(RandomPolicy(), [s], Contract(), batch_size=1).episodes[0] for s in SEEDS]
    batched = evaluate(RandomPolicy(), SEEDS, Contract(), batch_size=batch_size).episodes
    assert [(e.score, e.steps, e.frames) for e in alone] == [(e.score, e.steps, e.frames) for e in batched]


@pytest.mark.slow
@pytest.mark.parametrize("epsilon", [0.0, 0.1])
def test_batched_and_single_episodes_agree_per_seed_qnetwork(checkpoint, epsilon):
    policy = QNetworkPolicy.from_checkpoint(checkpoint, epsilon=epsilon)
    alone = [evaluate(policy, [s], SHORT, batch_size=1).episodes[0] for s in SEEDS[:3]]
    batched = evaluate(policy, SEEDS[:3], SHORT, batch_size=3).episodes
    assert ([(e.score, e.steps, e.action_counts) for e in alone]
            == [(e.score, e.steps, e.action_counts) for e in batched])


def test_time_limit_is_reported(checkpoint):
    policy = QNetworkPolicy.from_checkpoint(checkpoint, epsilon=0.0)
    tiny = Contract().replace(max_episode_frames=200)
    episodes = evaluate(policy, [1, 2], tiny, batch_size=2).episodes
    # the limit counts emulator frames after the reset's no-ops, so frames may pass 200 by those
    assert all(e.ended_by == TIME_LIMIT and e.steps * tiny.frame_skip <= 200 for e in episodes)


def test_bad_seed_lists_are_refused():
    with pytest.raises(ValueError, match="empty"):
        evaluate(RandomPolicy(), [], Contract())
    with pytest.raises(ValueError, match="distinct"):
        evaluate(RandomPolicy(), [1, 1], Contract())


def test_gif_of_one_episode(tmp_path):
    result = evaluate(RandomPolicy(), [5, 6], Contract(), batch_size=2, record_seed=6)
    episode = result.episodes[1]
    assert len(result.frames) == episode.steps
    path = write_gif(result.frames, tmp_path / "e.gif", scale=2)
    frames = iio.imread(path, index=None)
    # GIF encoders merge identical consecutive frames, so the file may hold fewer than steps
    assert 0 < frames.shape[0] <= episode.steps and frames.shape[1:3] == (168, 168)


class NeverServes:
    """Holds LEFT: after a lost life the ball is never served again."""

    def act(self, obs, rngs):
        return np.full(len(obs), 3, dtype=np.int64)


def test_the_serving_contract_ends_a_stalling_agent_by_game_over():
    capped = Contract().replace(max_episode_frames=8000)
    stalled = evaluate(NeverServes(), [0, 1], capped, batch_size=2).episodes
    assert all(e.ended_by == TIME_LIMIT and e.action_counts[1] == 0 for e in stalled)
    serving = capped.replace(serve_after_life_loss=True)
    alone = [evaluate(NeverServes(), [s], serving, batch_size=1).episodes[0] for s in (0, 1)]
    batched = evaluate(NeverServes(), [0, 1], serving, batch_size=2).episodes
    for e in batched:
        # five lives: four serves played by the contract, then game over
        assert e.ended_by == GAME_OVER and e.action_counts[1] == 4
    assert [(e.score, e.steps) for e in alone] == [(e.score, e.steps) for e in batched]
