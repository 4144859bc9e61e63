"""The shipped reference agent, and the path that ships one: train -> export rows -> evaluate
with the training history -> model card, all through the real CLI on a tiny training."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest
from click.testing import Result
from test_cli_inputs import cli

from breakout_core.evaluation.evaluator import evaluate
from breakout_core.evaluation.policies import QNetworkPolicy, RandomPolicy
from breakout_core.game.contract import CONTRACTS
from breakout_core.learning.qnetwork import load_checkpoint

REPO = Path(__file__).parents[1]
SHIPPED = REPO / "models" / "reference"


@pytest.mark.slow
def test_shipped_checkpoint_has_the_contract_and_beats_random_on_three_seeds():
    import torch

    network, meta = load_checkpoint(SHIPPED / "dqn_breakout.pt")
    assert meta["contract_hash"] == CONTRACTS["breakout-v3"].hash and meta["transitions"] > 0
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        # the serving contract (breakout-v3 plus a forced FIRE after a lost life): a greedy agent
        # that stalls without serving plays until the time limit otherwise (minutes per game).
        # Games of 2,000 frames: the agent scores 14 in each, random play 1 to 4 in its whole game.
        serving = CONTRACTS["breakout-v3"].replace(serve_after_life_loss=True, max_episode_frames=2000)
        seeds = [0, 1, 2]
        agent = evaluate(QNetworkPolicy(network, epsilon=0.0), seeds, serving, batch_size=3)
        random = evaluate(RandomPolicy(), seeds, serving, batch_size=3)
    finally:
        torch.set_num_threads(previous)
    agent_scores = np.array([e.score for e in agent.episodes])
    random_scores = np.array([e.score for e in random.episodes])
    assert agent_scores.mean() > random_scores.mean(), (agent_scores, random_scores)


def _runner(*args: str, cwd: Path) -> Result:
    """`runner ARGS` in this process: a separate one would add only its imports here."""
    out = cli(*args, cwd=cwd)
    assert out.exit_code == 0, (out.output[-3000:], out.exception)
    return out


TRAIN = """
name: tiny_reference
measurements:
  - kind: train
    name: reference
    algorithm: double
    total_transitions: 1000
    num_envs: 2
    replay_capacity: 1000
    learning_starts: 100
    train_every: 8
    target_sync_every: 100
    epsilon_decay_transitions: 1000
    diagnostics_every: 50
    checkpoint_every: 500
    torch_threads: 1
    seed: 3
"""

EVALUATE = """
name: tiny_reference_agent
contract: {name: breakout-v3, max_episode_frames: 1000, other_contracts: deliberate}  # a capped game: another contract
policies:
  random: {type: random}
  dqn: {type: checkpoint, path: CHECKPOINT}
measurements:
  - kind: evaluate
    name: scores
    policies: [random, dqn]
    seeds: [0, 1]
    batch_size: 2
  - kind: training_history
    name: history
    rows: ROWS
verdicts:
  - {name: dqn_beats_random, measurement: scores, candidate: dqn, baseline: random,
     deployment_worthy_when: {paired_score_diff_ci_low: "> 0"}}
"""


@pytest.mark.slow
def test_train_export_evaluate_with_history_and_model_card(tmp_path):
    (tmp_path / "train.yaml").write_text(TRAIN)
    _runner("run", "train.yaml", "--db", "train.duckdb", "--no-report", cwd=tmp_path)
    con = duckdb.connect(str(tmp_path / "train.duckdb"), read_only=True)
    train_run = con.execute("SELECT run_id FROM runs").fetchone()[0]
    checkpoint = Path(con.execute("SELECT path FROM train_checkpoints WHERE transition = 1000").fetchone()[0])
    con.close()
    _runner("export", train_run, "--out", "rows", "--db", "train.duckdb", cwd=tmp_path)

    # a clean database: the evaluation spec brings the training rows in with it
    (tmp_path / "evaluate.yaml").write_text(EVALUATE.replace("CHECKPOINT", str(tmp_path / checkpoint))
                                            .replace("ROWS", "rows"))
    out = _runner("run", "evaluate.yaml", "--db", "clean.duckdb", "--reports", "reports", cwd=tmp_path)
    report = next((tmp_path / "reports").glob("tiny_reference_agent-*.html")).read_text()
    assert "how the shipped agent was trained" in report and "learning curves" in report
    con = duckdb.connect(str(tmp_path / "clean.duckdb"), read_only=True)
    eval_run = con.execute("SELECT run_id FROM runs WHERE spec_name = 'tiny_reference_agent'").fetchone()[0]
    episodes = con.execute("SELECT count(*) FROM train_episodes WHERE run_id = ?", [train_run]).fetchone()[0]
    assert episodes > 0
    history = con.execute("SELECT source_run_id, imported_rows FROM training_history").fetchone()
    assert history[0] == train_run and history[1] > episodes
    con.close()
    # running it again does not import the rows twice
    _runner("run", "evaluate.yaml", "--db", "clean.duckdb", "--no-report", cwd=tmp_path)
    con = duckdb.connect(str(tmp_path / "clean.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM train_episodes WHERE run_id = ?", [train_run]).fetchone()[0] == episodes
    con.close()

    _runner("model-card", "--checkpoint", str(tmp_path / checkpoint), "--train-run", train_run,
            "--eval-run", eval_run, "--out", "CARD.md", "--db", "clean.duckdb",
            cwd=tmp_path)
    card = (tmp_path / "CARD.md").read_text()
    assert "Trained for **1,000 transitions**" in card and train_run in card and eval_run in card
    assert "Started from the checkpoint" not in card  # a fresh training: its counts are its own
    assert "| scores | dqn | 2 |" in card and "| scores | random | 2 |" in card
    assert "dqn_beats_random" in card and "name: tiny_reference" in card
    assert "verdict dqn_beats_random" in out.stdout
    assert "- Wall time to this checkpoint: **" in card  # from the checkpoint files' times
    # on a machine without the training run's files the card says the time is not known, not 0 h
    shipped = tmp_path / "shipped.pt"
    shipped.write_bytes((tmp_path / checkpoint).read_bytes())
    for path in (tmp_path / checkpoint).parent.glob("*.pt"):
        path.unlink()
    _runner("model-card", "--checkpoint", str(shipped), "--train-run", train_run, "--eval-run", eval_run,
            "--out", "CARD2.md", "--db", "clean.duckdb", cwd=tmp_path)
    assert "- Wall time to this checkpoint: not known here" in (tmp_path / "CARD2.md").read_text()
