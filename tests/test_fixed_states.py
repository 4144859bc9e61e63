"""Fixed states: captured from real play of a checkpoint, spread over the game, saved and refused."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from runtime_artifacts import EPISODE_SEEDS, MAX_STEPS, N_STATES

from breakout_core.evaluation.fixed_states import (
    FIXED_STATES_FORMAT,
    STEP_CAP,
    capture_fixed_states,
    capture_from_checkpoint,
    file_sha256,
    load_fixed_states,
    save_fixed_states,
)
from breakout_core.evaluation.policies import RandomPolicy
from breakout_core.game.contract import Contract


def test_states_come_from_real_play_spread_over_each_episode(artifacts):
    states = artifacts.states
    assert states.obs.shape == (N_STATES, 4, 84, 84) and states.obs.dtype == np.uint8
    assert states.contract_hash == Contract().hash
    assert states.checkpoint_sha256 == file_sha256(artifacts.checkpoint)
    per_episode = N_STATES // len(EPISODE_SEEDS)
    assert states.episode_seeds.tolist() == [s for s in EPISODE_SEEDS for _ in range(per_episode)]
    for seed, episode in zip(EPISODE_SEEDS, states.meta["episodes"]):
        steps = states.steps[states.episode_seeds == seed]
        assert np.all(np.diff(steps) > 0)  # distinct, in play order
        # spread: the first state is early and the last late in the episode, not the first frames only
        assert steps[0] < episode["steps"] / 4 and steps[-1] > 3 * episode["steps"] / 4
        assert steps[0] >= episode["noop_steps"]  # only states where the policy decided
    # real game frames: not blank, and not all the same picture
    assert states.obs.max() > 0
    assert len({s.tobytes() for s in states.obs}) == N_STATES
    assert all(e["ended_by"] in ("game_over", STEP_CAP) and e["steps"] <= MAX_STEPS for e in states.meta["episodes"])


def test_states_depend_only_on_their_episode_seed(artifacts):
    # the same episodes played one at a time give the same states as played side by side
    alone = capture_from_checkpoint(
        artifacts.checkpoint, n_states=N_STATES, episode_seeds=EPISODE_SEEDS, epsilon=0.05,
        max_steps_per_episode=MAX_STEPS, batch_size=1,
    )
    np.testing.assert_array_equal(alone.obs, artifacts.states.obs)
    np.testing.assert_array_equal(alone.steps, artifacts.states.steps)


def test_round_trip(artifacts):
    loaded = load_fixed_states(artifacts.states_path, expected_contract_hash=Contract().hash)
    np.testing.assert_array_equal(loaded.obs, artifacts.states.obs)
    np.testing.assert_array_equal(loaded.steps, artifacts.states.steps)
    np.testing.assert_array_equal(loaded.episode_seeds, artifacts.states.episode_seeds)
    np.testing.assert_array_equal(loaded.actions, artifacts.states.actions)
    assert loaded.checkpoint_sha256 == artifacts.states.checkpoint_sha256
    assert loaded.checkpoint_path == str(artifacts.checkpoint)
    assert loaded.meta["episode_seeds"] == list(EPISODE_SEEDS)
    assert len(loaded) == N_STATES


def test_wrong_contract_hash_is_refused(artifacts):
    other = Contract().replace(repeat_action_probability=0.25)
    with pytest.raises(ValueError, match="contract"):
        load_fixed_states(artifacts.states_path, expected_contract_hash=other.hash)


def test_wrong_version_and_foreign_files_are_refused(artifacts, tmp_path):
    with np.load(artifacts.states_path) as data:
        arrays = {k: data[k] for k in data.files}
    header = json.loads(str(arrays["header"]))
    header["format"] = "breakout-fixed-states/0"
    arrays["header"] = np.array(json.dumps(header))
    old = tmp_path / "old.npz"
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    old.write_bytes(buffer.getvalue())
    with pytest.raises(ValueError, match=FIXED_STATES_FORMAT):
        load_fixed_states(old)
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, x=np.zeros(3))
    with pytest.raises(ValueError, match="not a"):
        load_fixed_states(foreign)
    garbage = tmp_path / "garbage.npz"
    garbage.write_bytes(b"not a zip")
    with pytest.raises(ValueError, match="not a readable"):
        load_fixed_states(garbage)


def test_capture_under_another_contract_is_refused(artifacts):
    with pytest.raises(ValueError, match="trained under contract"):
        capture_from_checkpoint(artifacts.checkpoint, n_states=4, episode_seeds=[0],
                                contract=Contract().replace(noop_start_max=0), max_steps_per_episode=10)


def test_any_policy_and_too_short_episodes(tmp_path):
    contract = Contract()
    states = capture_fixed_states(RandomPolicy(), contract, n_states=5, episode_seeds=[7, 8],
                                  max_steps_per_episode=60, batch_size=2)
    assert states.obs.shape == (5, 4, 84, 84) and states.checkpoint_path is None
    assert states.meta["policy"] == "random"
    path = save_fixed_states(tmp_path / "random.npz", states)
    assert load_fixed_states(path).steps.tolist() == states.steps.tolist()
    with pytest.raises(ValueError, match="too short"):
        capture_fixed_states(RandomPolicy(), contract, n_states=40, episode_seeds=[7],
                             max_steps_per_episode=35, candidates_per_episode=80)


def test_a_captured_episode_is_the_evaluators_episode(artifacts, one_torch_thread):
    # the same seed, policy and epsilon play the same game in both: (seed, step) names a state
    from breakout_core.evaluation.evaluator import evaluate
    from breakout_core.evaluation.policies import QNetworkPolicy

    policy = QNetworkPolicy.from_checkpoint(artifacts.checkpoint, epsilon=0.05)
    evaluated = evaluate(policy, [3], Contract(), batch_size=1).episodes[0]
    captured = capture_from_checkpoint(artifacts.checkpoint, n_states=4, episode_seeds=[3], epsilon=0.05)
    episode = captured.meta["episodes"][0]
    assert (episode["steps"], episode["score"], episode["ended_by"]) == (evaluated.steps, evaluated.score, "game_over")


def test_a_file_of_pickled_objects_is_refused_without_advice_to_load_it_unsafely(tmp_path):
    path = tmp_path / "objects.npz"
    np.savez(path, header=np.array([{"format": "x"}], dtype=object), obs=np.zeros((1, 4, 84, 84), np.uint8))
    with pytest.raises(ValueError) as refused:
        load_fixed_states(path)
    assert "pickled Python objects, which are never loaded" in str(refused.value)
    assert "allow_pickle" not in str(refused.value)
