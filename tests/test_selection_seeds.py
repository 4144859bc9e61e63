"""Selection seeds: an evaluation of a checkpoint on seeds its training chose it on is flagged,
one on seeds disjoint from them is held out, and a file no stored training wrote is unknown,
never held out. A real (tiny) training scores its checkpoint on seeds 7 and 8; the same
database then evaluates that checkpoint, a copy of it whose training files are gone (found by
its metadata), and an outside checkpoint; the model card leads with the held-out mean."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from tiny_onnx import tiny_model

TRAIN = """
name: tiny_selection
contract: {max_episode_frames: 400}
measurements:
  - kind: train
    name: reference
    total_transitions: 300
    batch_size: 8
    learning_starts: 100
    replay_capacity: 1000
    diagnostics_every: 50
    target_sync_every: 100
    epsilon_decay_transitions: 200
    torch_threads: 1
    checkpoint_at: [300]
    evaluate_checkpoints: {seeds: [7, 8], batch_size: 2}
"""

EVALUATE = """
name: tiny_selection_report
contract: {max_episode_frames: 400}
policies:
  dqn: {type: checkpoint, path: CHECKPOINT}
  outside: {type: checkpoint, path: OUTSIDE}
measurements:
  - kind: evaluate
    name: chosen
    policies: [dqn, outside]
    seeds: [7, 9]
    batch_size: 2
  - kind: evaluate
    name: held
    policies: [dqn, outside]
    seeds: [10, 11]
    batch_size: 2
verdicts:
  - {name: chosen_held_out, measurement: chosen, candidate: dqn, baseline: outside,
     deployment_worthy_when: {candidate_held_out: "== 1"}}
  - {name: held_held_out, measurement: held, candidate: dqn, baseline: outside,
     deployment_worthy_when: {candidate_held_out: "== 1"}}
  - {name: outside_held_out, measurement: held, candidate: outside, baseline: dqn,
     deployment_worthy_when: {candidate_held_out: "== 1"}}
"""


def _runner(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "runner", *args], capture_output=True, text=True, timeout=600,
                         cwd=cwd, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def _selection(db: Path, run_id: str) -> dict:
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT measurement, policy, selection, selection_overlap, selection_trainings, lineage "
                       "FROM policy_files WHERE run_id = ?", [run_id]).fetchall()
    con.close()
    return {(m, p): tuple(rest) for m, p, *rest in rows}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from breakout_core.game.contract import Contract
    from breakout_core.learning.qnetwork import QNetwork, load_checkpoint, save_checkpoint

    folder = tmp_path_factory.mktemp("selection")
    (folder / "train.yaml").write_text(TRAIN)
    _runner("run", "train.yaml", "--db", "results.duckdb", "--no-report", cwd=folder)
    con = duckdb.connect(str(folder / "results.duckdb"), read_only=True)
    train_run, checkpoint = con.execute("SELECT run_id, path FROM train_checkpoints WHERE transition = 300").fetchone()
    con.close()
    played = load_checkpoint(folder / checkpoint)[1]["contract"]  # an outside file made under the same game
    outside = save_checkpoint(folder / "outside.pt", QNetwork(), Contract(**played), transitions=0)
    return folder, train_run, folder / checkpoint, outside


def _evaluate(folder: Path, checkpoint: Path, outside: Path) -> tuple[str, str]:
    spec = EVALUATE.replace("CHECKPOINT", str(checkpoint)).replace("OUTSIDE", str(outside))
    (folder / "evaluate.yaml").write_text(spec)
    out = _runner("run", "evaluate.yaml", "--db", "results.duckdb", "--reports", "reports", cwd=folder)
    run_id = next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("run "))
    return run_id, out.stdout


@pytest.mark.slow
def test_seeds_the_training_chose_on_are_flagged_disjoint_ones_held_out_an_outside_file_unknown(trained):
    folder, train_run, checkpoint, outside = trained
    run_id, stdout = _evaluate(folder, checkpoint, outside)
    found = _selection(folder / "results.duckdb", run_id)
    selection, overlap, trainings, lineage = found[("chosen", "dqn")]
    assert (selection, overlap, lineage) == ("selection_seeds", 1, "sha256 of a checkpoint file the training wrote")
    assert json.loads(trainings) == [{"run_id": train_run, "measurement": "reference", "trial": "base",
                                      "training_seed": 42, "seeds": "7-8"}]
    assert found[("held", "dqn")][:2] == ("held_out", 0)
    for measurement in ("chosen", "held"):  # a file no stored training wrote: unknown, never held out
        assert found[(measurement, "outside")][0] == "unknown" and found[(measurement, "outside")][1] is None
    con = duckdb.connect(str(folder / "results.duckdb"), read_only=True)
    verdicts = {v: (o, r) for v, o, r in con.execute("SELECT verdict, outcome, reason FROM verdicts WHERE run_id = ?",
                                                     [run_id]).fetchall()}
    con.close()
    assert verdicts["chosen_held_out"][0] == "rejected"
    assert "dqn: played on the seeds it was chosen on (1 of its 2 seeds)" in verdicts["chosen_held_out"][1]
    assert verdicts["held_held_out"][0] == "deployment-worthy" and "dqn: held out" in verdicts["held_held_out"][1]
    assert verdicts["outside_held_out"][0] == "rejected"
    assert "outside: unknown whether held out" in verdicts["outside_held_out"][1]
    report = (folder / "reports" / f"tiny_selection_report-{run_id}.html").read_text()
    assert "held out, or played on the seeds it was chosen on" in report and "selection_seeds" in report

    _runner("model-card", "--checkpoint", str(checkpoint), "--train-run", train_run, "--eval-run", run_id,
            "--out", "CARD.md", "--db", "results.duckdb", cwd=folder)
    card = (folder / "CARD.md").read_text()
    headline = card[card.index("## Headline"):card.index("## What it is")]
    assert "**Held-out mean score:" in headline and "seeds 10-11" in headline and "seeds 7-8" in headline
    assert "Difference, held-out minus selection seeds: **" in headline
    assert "Seeds: dqn: played on the seeds it was chosen on (1 of its 2 seeds)." in card


@pytest.mark.slow
def test_a_copy_without_its_training_files_is_found_by_its_metadata(trained):
    folder, _, checkpoint, outside = trained
    copy = folder / "shipped.pt"
    copy.write_bytes(checkpoint.read_bytes())
    away = folder / "away"
    away.mkdir()
    moved = [path.rename(away / path.name) for path in checkpoint.parent.glob("*.pt")]
    try:
        run_id, _ = _evaluate(folder, copy, outside)
    finally:
        for path in moved:
            path.rename(checkpoint.parent / path.name)
    found = _selection(folder / "results.duckdb", run_id)
    assert found[("chosen", "dqn")][0] == "selection_seeds" and found[("held", "dqn")][0] == "held_out"
    assert found[("held", "dqn")][3] == "the checkpoint's training config, contract and transition count"


@pytest.mark.slow
def test_an_onnx_file_follows_its_export_and_an_outside_one_is_unknown(trained, tmp_path, monkeypatch):
    from breakout_core.conversion.export import export_onnx
    from runner.kinds.shared.selection_seeds import selection_of

    folder, _, checkpoint, _ = trained
    monkeypatch.chdir(folder)  # train_checkpoints paths are as the training wrote them, from its folder
    exported = export_onnx(checkpoint, tmp_path / "model.onnx").onnx_path
    outside = tiny_model(tmp_path / "outside.onnx")
    con = duckdb.connect(str(folder / "results.duckdb"), read_only=True)
    unknown = selection_of(con, outside, "", [7, 8])
    assert unknown["selection"] == "unknown" and unknown["selection_overlap"] is None
    assert unknown["lineage"] == "unknown: an ONNX file that records no checkpoint it was exported from"
    assert selection_of(con, exported, "", [8])["selection"] == "selection_seeds"
    assert selection_of(con, exported, "", [20])["selection"] == "held_out"
    con.close()
