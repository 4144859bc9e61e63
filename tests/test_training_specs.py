"""The repository's training specs (Day 13, 14, 16 and the throughput benchmark), shrunk to a
few hundred transitions and run through the real CLI on the real ALE; and a training killed
mid-run that resumes to the same total."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
import yaml
from click.testing import CliRunner, Result
from test_end_to_end import runner, wait_for_rows
from test_learner_precision import this_cpu_flags, this_cpu_has_amx

from breakout_core.learning.qnetwork import load_checkpoint
from runner.cli.commands import main
from runner.spec.document import load_spec
from runner.spec.yaml_source import read_spec_text

SPECS = Path(__file__).resolve().parent.parent / "specs"
SMALL_TRAIN = dict(total_transitions=400, batch_size=8, learning_starts=100, replay_capacity=2_000,
                   diagnostics_every=100, target_sync_every=150, epsilon_decay_transitions=300,
                   checkpoint_at=[200, 400])
# 40 timed transitions, 10 of them with an update: enough for every mode's rate to be a positive number
SMALL_THROUGHPUT = dict(total_transitions=150, warmup_transitions=50, learning_starts=110, replay_capacity=2_000,
                        learner_updates=10, env_steps=100, repeats=1)


def shrink(name: str, tmp_path: Path) -> Path:
    """The repository spec `name` with every count cut down (one training seed, one timing, one
    torch thread); its method (measurements, sweeps, modes, verdicts) unchanged. Episodes are
    capped at 400 frames (100 agent steps) so an evaluated checkpoint that never serves ends quickly,
    and training episodes end several times within a training."""
    spec = read_spec_text(load_spec(SPECS / f"{name}.yaml").text)  # with its extends merged in
    spec.setdefault("contract", {})["max_episode_frames"] = 400
    for m in spec["measurements"]:
        if "torch_threads" in m:  # the suite runs two tests at once on two cores; torch's threads wait on each other
            m["torch_threads"] = 1
        if m["kind"] == "train":
            m.update(SMALL_TRAIN)
            if "gif" in m:
                m["gif"]["at"] = [200, 400]
            if "evaluate_checkpoints" in m:
                m["evaluate_checkpoints"]["seeds"] = {"start": 1000, "count": 2}
            if "seeds" in m:
                m["seeds"] = 1
            if "score_seeds" in m:
                m["score_seeds"] = {"start": 5000, "count": 2}
        elif m["kind"] == "throughput":
            m.update(SMALL_THROUGHPUT)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def run_spec(path: Path, tmp_path: Path, *extra: str) -> tuple[str, duckdb.DuckDBPyConnection, str]:
    """Run id, a read-only connection to the results, and what the run wrote to stderr."""
    done = runner("run", str(path), "--db", "results.duckdb", *extra, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run_id = done.stdout.split()[1]
    return run_id, duckdb.connect(str(tmp_path / "results.duckdb"), read_only=True), done.stderr


def model_card(*args: str, cwd: Path) -> Result:
    """`runner model-card` in this process, from `cwd`: it only reads the database and checkpoints,
    so it needs no process (and no second start of torch) of its own."""
    with contextlib.chdir(cwd):
        return CliRunner().invoke(main, ["model-card", *args])


def verdict_outcomes(con, run_id: str) -> dict[str, str]:
    return dict(con.execute("SELECT verdict, outcome FROM verdicts WHERE run_id = ?", [run_id]).fetchall())


@pytest.mark.slow
def test_day13_health_check_is_healthy(tmp_path):
    run_id, con, _ = run_spec(shrink("day13_health_check", tmp_path), tmp_path)
    assert verdict_outcomes(con, run_id) == {"trainer_healthy": "deployment-worthy"}
    assert con.execute("SELECT evidence->>'$.label' FROM verdicts WHERE run_id = ?",
                       [run_id]).fetchone()[0] == "healthy"
    epsilons = con.execute("SELECT transition, epsilon, replay_frames FROM train_diagnostics WHERE run_id = ? "
                           "ORDER BY transition", [run_id]).fetchall()
    assert len(epsilons) >= 3 and epsilons[-1][1] == pytest.approx(0.05)
    assert epsilons[-1][2] >= 400  # every transition's frame is stored, and each ended episode's final frame


@pytest.mark.slow
def test_day14_learning_rates_curves_gifs_and_verdict(tmp_path):
    run_id, con, _ = run_spec(shrink("day14_learning_rate", tmp_path), tmp_path)
    trials = con.execute("SELECT trial, episodes, last20_mean FROM train_trial_summary WHERE run_id = ? ORDER BY trial",
                         [run_id]).fetchall()
    assert [t[0] for t in trials] == ["learning_rate=0.0001", "learning_rate=0.0002", "learning_rate=5e-05"]
    assert all(t[1] > 0 and t[2] is not None for t in trials)
    checkpoints = con.execute("SELECT trial, list(DISTINCT transition ORDER BY transition) FROM train_checkpoints "
                              "WHERE run_id = ? GROUP BY trial", [run_id]).fetchall()
    assert {tuple(c[1]) for c in checkpoints} == {(200, 400)}
    gifs = con.execute("SELECT path FROM artifacts WHERE run_id = ?", [run_id]).fetchall()
    assert len(gifs) == 6 and all((tmp_path / path).stat().st_size > 1000 for (path,) in gifs)
    # one training seed per rate: the scores are stored, and the verdict says it cannot decide
    scores = con.execute("SELECT trial, training_seed, episodes FROM train_seed_scores WHERE run_id = ? ORDER BY trial",
                         [run_id]).fetchall()
    assert scores == [(t[0], 42, 2) for t in trials]
    outcome, reason = con.execute("SELECT outcome, reason FROM verdicts WHERE run_id = ?", [run_id]).fetchone()
    assert outcome == "inconclusive" and reason.startswith("one training seed per arm")
    page = next((tmp_path / "reports").glob(f"*{run_id}.html")).read_text()
    assert "learning curves" in page and "diagnostics over time" in page and page.count("data:image/gif;base64,") == 6


@pytest.mark.slow
def test_day16_vector_envs_screen_train_and_checkpoint_scores(tmp_path):
    run_id, con, log = run_spec(shrink("day16_vector_envs", tmp_path), tmp_path)
    ratios = con.execute("SELECT trial, full_over_learner_bound, collect_over_env FROM throughput_ratios "
                         "WHERE run_id = ? ORDER BY trial", [run_id]).fetchall()
    assert [r[0] for r in ratios] == ["num_envs=1", "num_envs=2", "num_envs=4", "num_envs=8"]
    assert all(r[1] > 0 and r[2] > 0 for r in ratios)
    evaluated = con.execute("SELECT policy, count(*), list(seed ORDER BY seed) FROM episodes WHERE run_id = ? "
                            "GROUP BY policy ORDER BY policy", [run_id]).fetchall()
    assert [(p, n, s) for p, n, s in evaluated] == [
        (f"num_envs={n},seed=42@{t}", 2, [1000, 1001]) for n in (1, 2, 4) for t in (200, 400)]
    # a log file names each evaluated checkpoint on one line, as it finishes
    assert sorted(re.findall(r"· evaluated (\S+) on 2 seeds: mean score", log)) == [p for p, _, _ in evaluated]
    finished = con.execute("SELECT trial, transitions FROM train_results WHERE run_id = ? ORDER BY trial",
                           [run_id]).fetchall()
    assert finished == [("num_envs=1", 400), ("num_envs=2", 400), ("num_envs=4", 400)]
    outcomes = verdict_outcomes(con, run_id)
    assert set(outcomes) == {"n2_speedup_over_n1", "n4_speedup_over_n1",
                             "n2_speedup_over_n1_at_100k", "n4_speedup_over_n1_at_100k"}
    rates = dict(con.execute("SELECT trial, transitions_per_s FROM train_results WHERE run_id = ?",
                             [run_id]).fetchall())
    evidence = con.execute("SELECT evidence FROM verdicts WHERE run_id = ? AND verdict = 'n4_speedup_over_n1_at_100k'",
                           [run_id]).fetchone()[0]
    speedup = json.loads(evidence)["metrics"]["transitions_per_s_speedup"]
    assert speedup == pytest.approx(rates["num_envs=4"] / rates["num_envs=1"])
    # one training seed and one timing per setting: no speed-up verdict decides on a single ratio
    assert set(outcomes.values()) == {"inconclusive"}
    # a card of one training of this three-training run: that training's curve only, found by the checkpoint's bytes
    final = con.execute("SELECT path FROM train_checkpoints WHERE run_id = ? AND trial = 'num_envs=2' "
                        "AND transition = 400", [run_id]).fetchone()[0]
    con.close()
    card = model_card("--checkpoint", final, "--train-run", run_id, "--eval-run", run_id,
                      "--measurement", "train_100k", "--out", "CARD.md", "--db", "results.duckdb", cwd=tmp_path)
    assert card.exit_code == 0, card.output[-2000:]
    curve = (tmp_path / "CARD.md").read_text().split("## Greedy score against transitions and hours", 1)[1]
    assert re.findall(r"^\| `([^`]+)`", curve, flags=re.M) == ["num_envs=2,seed=42@200", "num_envs=2,seed=42@400"]
    stranger = model_card("--checkpoint", str(SPECS.parent / "models/reference/dqn_breakout.pt"),
                          "--train-run", run_id, "--eval-run", run_id, "--measurement", "train_100k",
                          "--out", "OTHER.md", "--db", "results.duckdb", cwd=tmp_path)
    assert stranger.exit_code != 0 and "none of their checkpoint files on this machine" in stranger.stderr
    # refused through sys.exit, not an exception that would print a traceback
    assert isinstance(stranger.exception, SystemExit) and not (tmp_path / "OTHER.md").exists()


@pytest.mark.slow
def test_day14_pipeline_runs_every_setting(tmp_path):
    run_id, con, _ = run_spec(shrink("day14_pipeline", tmp_path), tmp_path)
    counts = dict(con.execute("SELECT measurement, count(*) FROM throughput_trials WHERE run_id = ? AND "
                              "transitions_per_s > 0 GROUP BY measurement", [run_id]).fetchall())
    assert counts == {"replay_device": 2, "diagnostics_cadence": 2, "batch_size": 6, "threads": 6}


@pytest.mark.slow
def test_benchmark_splits_collect_into_acting_and_loop(tmp_path):
    run_id, con, _ = run_spec(shrink("bench_training_throughput", tmp_path), tmp_path)
    rows = con.execute("SELECT trial, full_over_learner_bound, collect_over_env, explore_over_env FROM "
                       "throughput_ratios WHERE run_id = ? AND measurement = 'pipeline' ORDER BY trial",
                       [run_id]).fetchall()
    assert [r[0] for r in rows] == ["num_envs=1", "num_envs=2", "num_envs=4"]
    assert all(value > 0 for row in rows for value in row[1:])
    steps = con.execute("SELECT count(*) FROM throughput_trials WHERE run_id = ? AND measurement = 'gradient_step' "
                        "AND mode = 'learner'", [run_id]).fetchone()[0]
    assert steps == 4
    # one timing per setting: the full rate is not judged against its bound on a single ratio
    outcomes = verdict_outcomes(con, run_id)
    assert {outcomes[f"n{n}_full_near_learner_bound"] for n in (1, 2, 4)} == {"inconclusive"}


KILLABLE = """\
name: killable_training
contract: {max_episode_frames: 400}
measurements:
  - kind: train
    name: train
    total_transitions: 1500
    num_envs: 2
    batch_size: 8
    learning_starts: 200
    replay_capacity: 4000
    diagnostics_every: 200
    epsilon_decay_transitions: 1000
    torch_threads: 1
    checkpoint_at: [500, 1000, 1500]
    evaluate_checkpoints: {seeds: [7], batch_size: 1}
"""


@pytest.mark.slow
def test_killed_training_resumes_to_the_same_total(tmp_path, write_spec):
    spec = write_spec(KILLABLE)
    db = tmp_path / "results.duckdb"
    proc = subprocess.Popen([sys.executable, "-m", "runner", "run", str(spec), "--db", str(db)], cwd=tmp_path,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_rows(db, "SELECT count(*) FROM train_checkpoints", timeout=240)
        # the trainer saves its state once the checkpoint's rows are stored: kill after that
        deadline = time.monotonic() + 240
        while not list(tmp_path.glob("runs/*/train/base/trainer_state.pt")) and time.monotonic() < deadline:
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    # a checkpoint is scored as it lands, before the trainer goes on: the killed run scored its first.
    # Its rows are stored, or spooled beside the database when this test's polling held it; the next
    # command that writes appends the spool, as a user's next command does.
    from runner.store.database import Store

    with Store(db).writer():
        pass
    with duckdb.connect(str(db), read_only=True) as con:
        assert "base@500" in {row[0] for row in con.execute("SELECT policy FROM episodes").fetchall()}
        assert con.execute("SELECT count(*) FROM train_results").fetchone()[0] == 0
    run_id, con, _ = run_spec(spec, tmp_path, "--resume")
    attempts = con.execute("SELECT attempt, from_transition FROM train_attempts WHERE run_id = ? ORDER BY attempt",
                           [run_id]).fetchall()
    assert len(attempts) == 2 and 500 <= attempts[1][1] < 1500  # from its last checkpoint
    assert con.execute("SELECT transitions FROM train_results WHERE run_id = ?", [run_id]).fetchall() == [(1500,)]
    assert con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()[0] == "done"
    assert con.execute("SELECT list(DISTINCT policy ORDER BY policy) FROM episodes WHERE run_id = ?",
                       [run_id]).fetchone()[0] == ["base@1000", "base@1500", "base@500"]
    assert con.execute("SELECT count(*) FROM episodes WHERE run_id = ?", [run_id]).fetchone()[0] == 3  # each once
    # no episode is counted twice: the killed attempt's rows past its checkpoint are superseded
    valid = con.execute("SELECT count(*), count(DISTINCT (env_index, transition)) FROM train_episodes_valid "
                        "WHERE run_id = ?", [run_id]).fetchone()
    assert valid[0] == valid[1] > 0
    con.close()

    # killed while evaluating checkpoints: --resume evaluates only what is missing
    with Store(db).writer() as writer:
        writer.execute("DELETE FROM episodes WHERE policy = 'base@1000'")
        writer.execute("UPDATE runs SET status = 'interrupted' WHERE run_id = ?", [run_id])
    again, con, log = run_spec(spec, tmp_path, "--resume")
    assert again == run_id
    assert re.findall(r"· evaluated (\S+) on", log) == ["base@1000"]
    assert con.execute("SELECT policy, count(*) FROM episodes WHERE run_id = ? GROUP BY policy ORDER BY policy",
                       [run_id]).fetchall() == [("base@1000", 1), ("base@1500", 1), ("base@500", 1)]


@pytest.mark.slow
def test_reference_training_goes_on_from_the_shipped_checkpoint_and_the_card_shows_its_curve(tmp_path):
    """The v3 reference training spec, shrunk: it starts from the shipped checkpoint with an
    empty replay (resume mode 'checkpoint', recorded with the file's sha256), scores that
    checkpoint before it learns, then each new one; the model card shows the greedy score
    against transitions and hours. With its trainer state lost, a resume goes on from the training's
    own latest checkpoint; with that gone too, one that would start over from a start file whose
    bytes changed since is refused, and stores nothing."""
    import torch

    from breakout_core.common.hashing import file_sha256

    spec = yaml.safe_load((SPECS / "train_reference_v3.yaml").read_text())
    spec["contract"].update(max_episode_frames=400, other_contracts="deliberate")  # a capped game: another contract
    m = spec["measurements"][0]
    shipped = tmp_path / "shipped.pt"
    shipped.write_bytes((SPECS / m["start_from"]).read_bytes())
    start = int(load_checkpoint(shipped)[1]["transitions"])
    m.update(SMALL_TRAIN, start_from=shipped.name, total_transitions=start + 400,
             checkpoint_at=[start + 200, start + 400], torch_threads=1,  # one thread, as shrink() gives
             learner_precision="auto")
    m["evaluate_checkpoints"].update(seeds=[1000, 1001], batch_size=2)
    path = tmp_path / "train_reference_v3.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    run_id, con, _ = run_spec(path, tmp_path, "--no-report")
    assert con.execute("SELECT resume_mode, resumed_from, resumed_from_sha256, from_transition FROM train_attempts "
                       "WHERE run_id = ?", [run_id]).fetchall() == [
        ("checkpoint", str(shipped), file_sha256(shipped), start)]
    assert con.execute("SELECT policy, count(*) FROM episodes WHERE run_id = ? GROUP BY policy ORDER BY policy",
                       [run_id]).fetchall() == [(f"base@{t}", 2) for t in (start, start + 200, start + 400)]
    precision = json.loads(con.execute("SELECT learner_precision FROM train_attempts WHERE run_id = ?",
                                       [run_id]).fetchone()[0])
    amx = this_cpu_has_amx()
    assert (precision["requested"], precision["chosen"]) == ("auto", "bf16" if amx else "fp32")
    assert set(precision["cpu_flags"]) <= this_cpu_flags() and ("amx_bf16" in precision["cpu_flags"]) == amx
    con.close()
    done = model_card("--checkpoint", str(shipped), "--train-run", run_id, "--eval-run", run_id,
                      "--out", "CARD.md", "--db", "results.duckdb", cwd=tmp_path)
    assert done.exit_code == 0, done.output[-2000:]
    card = (tmp_path / "CARD.md").read_text()
    curve = card.split("## Greedy score against transitions and hours", 1)[1].split("##", 1)[0]
    rows = [line for line in curve.splitlines() if line.startswith("| `base@")]
    assert [row.split("|")[2].strip() for row in rows] == [f"{t:,}" for t in (start, start + 200, start + 400)]
    hours = [row.split("|")[3].strip() for row in rows]
    assert hours[0] == "0.00" and all(float(h) >= 0 for h in hours)  # the starting checkpoint at 0 h
    assert "Its first row is the checkpoint it started from" in curve
    assert f"- Learner precision: **{precision['chosen']}** (requested auto: {precision['reason']}; CPU flags " in card
    assert f"Started from the checkpoint `{shipped}` (the agent shipped there before this one), sha256 " \
           f"`{file_sha256(shipped)}`," in card

    # its trainer state lost and the start file replaced (a ship): --resume would start another agent
    with duckdb.connect(str(tmp_path / "results.duckdb")) as writer:
        out_dir = writer.execute("SELECT out_dir FROM train_attempts WHERE run_id = ?", [run_id]).fetchone()[0]
        writer.execute("DELETE FROM train_results WHERE run_id = ?", [run_id])
        writer.execute("UPDATE runs SET status = 'interrupted' WHERE run_id = ?", [run_id])
        stored = writer.execute("SELECT count(*) FROM train_episodes").fetchone()[0]
        own = writer.execute("SELECT path FROM train_checkpoints WHERE run_id = ? ORDER BY transition DESC, path",
                             [run_id]).fetchall()
    (tmp_path / out_dir / "trainer_state.pt").unlink()
    replaced = torch.load(shipped, weights_only=True)
    replaced["state_dict"] = {k: v + 1e-3 for k, v in replaced["state_dict"].items()}
    torch.save(replaced, shipped)
    aside = tmp_path / "aside"
    aside.mkdir()
    for (checkpoint,) in own:
        (tmp_path / checkpoint).rename(aside / Path(checkpoint).name)
    # the spec named by another path than the first run's: the start file is still known by its role
    refused = runner("run", path.name, "--db", "results.duckdb", "--resume", cwd=tmp_path)
    assert refused.returncode == 2
    assert f"{shipped.name} is not the file run {run_id} began from" in refused.stderr
    assert "Traceback" not in refused.stderr
    with duckdb.connect(str(tmp_path / "results.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM train_attempts WHERE run_id = ?", [run_id]).fetchone()[0] == 1
        assert con.execute("SELECT count(*) FROM train_episodes").fetchone()[0] == stored

    # its own checkpoints back: the resume goes on from the latest, whatever became of the start file
    for (checkpoint,) in own:
        (aside / Path(checkpoint).name).rename(tmp_path / checkpoint)
    latest = own[0][0]  # checkpoint_….pt, not final.pt: the same weights
    resumed = runner("run", str(path), "--db", "results.duckdb", "--resume", "--no-report", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    with duckdb.connect(str(tmp_path / "results.duckdb"), read_only=True) as con:
        assert con.execute("SELECT attempt, resume_mode, resumed_from, resumed_from_sha256, from_transition "
                           "FROM train_attempts WHERE run_id = ? ORDER BY attempt", [run_id]).fetchall()[1:] == \
            [(1, "checkpoint", latest, file_sha256(tmp_path / latest), start + 400)]
        assert con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()[0] == "done"
        assert con.execute("SELECT transitions FROM train_results WHERE run_id = ?", [run_id]).fetchall() == \
            [(start + 400,)]
        assert con.execute("SELECT count(*) FROM episodes WHERE run_id = ? AND policy = ?",
                           [run_id, f"base@{start + 400}"]).fetchone()[0] == 2  # scored once, not again


def test_a_training_refuses_a_start_file_replaced_after_its_job_was_made(tmp_path):
    """Trainings run one after another: the bytes a training loads must be the ones hashed for its row."""
    from breakout_core.common.hashing import file_sha256
    from breakout_core.game.contract import Contract
    from breakout_core.learning.train_config import TrainConfig
    from runner.kinds.train.trainings import Training, TrainingJob, train_one

    start = tmp_path / "start.pt"
    start.write_bytes((SPECS / "../models/reference/dqn_breakout.pt").read_bytes())
    job = TrainingJob(run_id="r", measurement="m", training=Training("base", {}, 7, "base"), config=TrainConfig(),
                  contract=Contract(),
                  out_dir=str(tmp_path / "out"), attempt=0, resume_mode="checkpoint", resumed_from=str(start),
                  resumed_from_sha256=file_sha256(start), other_contract=True, from_transition=0, score_seeds=(),
                  score_batch=1)
    start.write_bytes(start.read_bytes() + b"a ship")
    with pytest.raises(ValueError, match=r"start\.pt: replaced while the run was going .* base did not start"):
        next(train_one(job))


def test_a_resume_refuses_trainings_the_spec_does_not_make(tmp_path, write_spec):
    """A seed sweep stored while every trial trained the base seed (as the runner once did) is not
    resumed under the trials' own seeds, which would train them again beside the old rows; the
    refusal comes before any measurement goes on, and leaves the run as it was."""
    spec = write_spec("name: seedsweep\nmeasurements:\n"
                      "  - kind: train\n    name: first\n    total_transitions: 100\n    replay_capacity: 1000\n"
                      "  - kind: train\n    name: tr\n    seed: 7\n    total_transitions: 100\n"
                      "    replay_capacity: 1000\n    sweep: {seed: [1, 2]}\n")
    run_id, con, _ = run_spec(spec, tmp_path, "--no-report")
    assert con.execute("SELECT trial, training_seed FROM train_attempts WHERE measurement = 'tr' ORDER BY ALL"
                       ).fetchall() == [("seed=1", 1), ("seed=2", 2)]
    con.close()
    with duckdb.connect(str(tmp_path / "results.duckdb")) as writer:  # as the run was stored before
        for table in ("train_attempts", "train_results", "train_episodes", "train_checkpoints"):
            writer.execute(f"UPDATE {table} SET training_seed = 7 WHERE measurement = 'tr'")
        writer.execute("DELETE FROM train_results")  # every training unfinished: 'first' would go on first
        writer.execute("UPDATE runs SET status = 'interrupted' WHERE run_id = ?", [run_id])
        attempts = writer.execute("SELECT count(*) FROM train_attempts").fetchone()[0]
    refused = runner("run", str(spec), "--db", "results.duckdb", "--no-report", "--resume", cwd=tmp_path)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert (f"measurement 'tr': run {run_id} holds trainings this spec does not make (seed=1 with training seed 7, "
            "seed=2 with training seed 7)") in refused.stderr
    with duckdb.connect(str(tmp_path / "results.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM train_attempts").fetchone()[0] == attempts
        assert con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()[0] == "interrupted"
