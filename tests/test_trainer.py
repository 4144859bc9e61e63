"""The trainer on the real ALE with tiny settings: counts in transitions, whatever N is."""

import pytest
import torch

from breakout_core.game.contract import Contract
from breakout_core.learning.qnetwork import load_checkpoint
from breakout_core.learning.train_config import TrainConfig
from breakout_core.learning.trainer import CheckpointSaved, Diagnostics, EpisodeEnd, TrainDone, Trainer

# batches of 8: what these tests count (transitions, updates, syncs, resumes) does not depend on a batch's size
TINY = dict(learning_starts=200, replay_capacity=2_000, diagnostics_every=100, target_sync_every=150,
            epsilon_decay_transitions=400, torch_threads=1, batch_size=8)


@pytest.mark.slow
@pytest.mark.parametrize("num_envs", [1, 3])
def test_counts_are_transitions_whatever_n(tmp_path, num_envs):
    config = TrainConfig(total_transitions=401, num_envs=num_envs, checkpoint_at=(250,), **TINY)
    contract = Contract().replace(max_episode_frames=400)  # an untrained greedy net may never serve: end its games
    trainer = Trainer(config, contract, tmp_path)
    before = [p.detach().clone() for p in trainer.online.parameters()]
    records = list(trainer.run())
    done = records[-1]
    assert isinstance(done, TrainDone) and done.transitions == 401  # exact, though 401 % 3 != 0
    assert done.updates == 401 // 4 - 199 // 4  # one per 4 transitions once 200 are in
    assert done.target_syncs == 401 // 150
    assert any(not torch.equal(a, b) for a, b in zip(before, trainer.online.parameters()))
    diagnostics = [r for r in records if isinstance(r, Diagnostics)]
    assert [d.transition // 100 for d in diagnostics] == sorted({d.transition // 100 for d in diagnostics})
    assert diagnostics[-1].epsilon == pytest.approx(config.epsilon(diagnostics[-1].transition - num_envs), abs=0.01)
    saved = [r for r in records if isinstance(r, CheckpointSaved)]
    assert saved[0].transition >= 250 and saved[-1].path.endswith("final.pt")
    _, meta = load_checkpoint(saved[0].path)
    assert meta["contract_hash"] == contract.hash and meta["train_config"]["num_envs"] == num_envs
    episodes = [r for r in records if isinstance(r, EpisodeEnd)]
    assert episodes and all(e.length > 0 and 0 <= e.env_index < num_envs for e in episodes)


def test_epsilon_schedule_is_linear_in_transitions():
    config = TrainConfig(epsilon_start=1.0, epsilon_end=0.1, epsilon_decay_transitions=1000)
    assert config.epsilon(0) == 1.0
    assert config.epsilon(500) == pytest.approx(0.55)
    assert config.epsilon(1000) == config.epsilon(5000) == pytest.approx(0.1)


@pytest.mark.slow
def test_resume_goes_on_to_the_same_total(tmp_path):
    config = TrainConfig(total_transitions=500, num_envs=2, checkpoint_at=(250,), **TINY)
    first = Trainer(config, Contract(), tmp_path)
    records = first.run()
    for record in records:
        if isinstance(record, CheckpointSaved):
            next(records)  # the consumer took the checkpoint; the trainer saves its state and goes on
            break  # as if killed right after the 250 checkpoint
    resumed = Trainer(config, Contract(), tmp_path)
    records = list(resumed.run(resume=True))
    assert records[-1].transitions == 500
    assert resumed.resumes == 1


def test_state_is_saved_only_once_the_consumer_took_the_checkpoint(tmp_path):
    """A consumer stores a checkpoint's row, and every row before it, when it receives the record;
    a state saved before that would let a kill in between resume past rows never stored."""
    config = TrainConfig(total_transitions=500, num_envs=2, checkpoint_at=(250,), **TINY)
    trainer = Trainer(config, Contract(), tmp_path)
    records = trainer.run()
    saved = next(r for r in records if isinstance(r, CheckpointSaved))
    assert saved.transition == 250 and not trainer.state_path().exists()
    next(records)
    assert torch.load(trainer.state_path(), weights_only=True)["transitions"] == 250


@pytest.mark.slow
def test_results_summarise_every_attempt(tmp_path):
    """Killed after its final state was saved, a resumed trainer has nothing left to do; its
    results still describe the whole run, not an attempt that moved no weight."""
    config = TrainConfig(total_transitions=500, num_envs=2, checkpoint_at=(250,), **TINY)
    whole = list(Trainer(config, Contract(), tmp_path).run())[-1]
    again = Trainer(config, Contract(), tmp_path)
    done = list(again.run(resume=True))[-1]
    assert again.resumes == 1
    assert (done.transitions, done.updates, done.target_syncs) == (whole.transitions, whole.updates, whole.target_syncs)
    assert done.weights_moved == pytest.approx(whole.weights_moved) and done.weights_moved > 0
    assert done.measured_transitions == whole.measured_transitions == 500
    assert done.measured_s >= whole.measured_s > 0 and done.wall_s >= whole.wall_s
    assert done.transitions_per_s > 0


def test_unknown_algorithm_is_refused():
    with pytest.raises(ValueError, match="unknown algorithm"):
        TrainConfig(algorithm="rainbow")


def test_a_checkpoint_starts_training_at_its_transition_with_its_weights(tmp_path):
    """When the trainer's state is lost, a checkpoint is enough to go on: its weights in both
    networks, its transition count, a fresh optimizer, and an empty replay refilled first."""
    config = TrainConfig(total_transitions=300, num_envs=2, checkpoint_at=(250,), **TINY)
    first = list(Trainer(config, Contract(), tmp_path / "first").run())
    checkpoint = next(r.path for r in first if isinstance(r, CheckpointSaved) and r.transition == 250)
    weights = load_checkpoint(checkpoint)[0].state_dict()
    later = Trainer(config, Contract(), tmp_path / "later")
    records = later.run(start_from=checkpoint)
    next(records)  # the first record: the weights are loaded by now
    assert later.transitions >= 250 and all(torch.equal(later.target.state_dict()[k], v) for k, v in weights.items())
    done = list(records)[-1]
    assert done.transitions == 300 and later.resumes == 1
    assert done.updates == 0  # 250 + 200 learning_starts lies past the total: the replay is only refilled

    other = Contract().replace(repeat_action_probability=0.1)
    with pytest.raises(ValueError, match="trained under contract"):
        next(Trainer(config, other, tmp_path / "other").run(start_from=checkpoint))
    fine_tuned = Trainer(config, other, tmp_path / "deliberate")  # a spec that says the mismatch is deliberate
    next(fine_tuned.run(start_from=checkpoint, other_contract=True))
    assert fine_tuned.transitions >= 250
    with pytest.raises(ValueError, match="a nature network, not the dueling network"):
        next(Trainer(TrainConfig(algorithm="dueling", **TINY), Contract(), tmp_path / "d").run(start_from=checkpoint))
