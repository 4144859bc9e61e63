"""Training studies over training seeds: the statistics over seeds (checked against rliable's
definitions, an independent bootstrap and their coverage at a few seeds), the train kind's
(trial, seed) trainings through the real CLI in process and on a real local Ray cluster, a Ray
worker killed mid-training, and the verdict rules that refuse to decide on one training seed per
arm."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import numpy as np
import pytest
import yaml
from test_end_to_end import runner, wait_for_rows

from breakout_core.statistics import stats

ROOT = Path(__file__).resolve().parent.parent
TINY = {
    "name": "tiny_seeds",
    "contract": {"name": "breakout-v3", "max_episode_frames": 400},  # a checkpoint that never serves ends soon
    "measurements": [{
        "kind": "train", "name": "seeds_lr", "algorithm": "dqn", "total_transitions": 400, "num_envs": 1,
        "learning_starts": 200, "train_every": 4, "target_sync_every": 200, "epsilon_decay_transitions": 400,
        "batch_size": 8, "replay_capacity": 2000, "diagnostics_every": 100, "torch_threads": 1, "seed": 3, "seeds": 2,
        "score_seeds": [11, 12], "score_batch": 2, "sweep": {"learning_rate": [0.0001, 0.0002]},
    }],
    "verdicts": [{"name": "faster_lr_scores_higher", "measurement": "seeds_lr", "candidate": "learning_rate=0.0002",
                  "baseline": "learning_rate=0.0001",
                  "deployment_worthy_when": {"score_iqm_diff_ci_low": "> 0",
                                             "probability_of_improvement_ci_low": "> 0.5"}}],
}
# what is the same whichever executor ran a training: everything but times and the run's own id
DETERMINISTIC = {
    "train_attempts": "trial, training_seed, attempt, from_transition, config",
    "train_episodes": "trial, training_seed, attempt, env_index, transition, episode_return, length, ended_by",
    "train_diagnostics": 'trial, training_seed, attempt, transition, "update", loss, q_mean, target_mean, td_abs_mean, '
                         "td_abs_max, grad_norm, epsilon, replay_frames",
    # a checkpoint's path below its measurement's folder: TRIAL/seed=N/FILE
    "train_checkpoints": "trial, training_seed, attempt, transition, "
                         "regexp_replace(path, '^.*/([^/]+/[^/]+/[^/]+)$', '\\1')",
    "train_results": "trial, training_seed, attempt, transitions, updates, target_syncs, weights_moved",
    "train_scores": "trial, training_seed, transition, checkpoint, eval_seed, score, steps, ended_by",
}


def write(tmp_path: Path, spec: dict, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def rows(db: Path, table: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(f"SELECT {DETERMINISTIC[table]} FROM {table} ORDER BY ALL").fetchall()


# -- statistics over seeds ---------------------------------------------------------------------

def test_point_estimates_match_rliable():
    from rliable import metrics as rliable_metrics  # its metrics module needs only numpy and scipy

    rng = np.random.default_rng(5)
    for n_x, n_y in ((3, 3), (5, 4), (10, 10)):
        x, y = rng.integers(0, 30, n_x).astype(float), rng.integers(0, 30, n_y).astype(float)
        assert stats.iqm(x) == pytest.approx(rliable_metrics.aggregate_iqm(x[:, None]))
        assert stats.probability_of_improvement(x, y) == pytest.approx(
            rliable_metrics.probability_of_improvement(x[:, None], y[:, None]))


def test_bootstrap_intervals_match_an_independent_resampling():
    """scipy's percentile bootstrap against rliable's procedure written out: resample each arm's
    runs with replacement from numpy's (seeded) global generator, take percentiles."""
    rng = np.random.default_rng(8)
    x, y = rng.normal(20, 5, 10), rng.normal(17, 5, 8)
    np.random.seed(0)
    draws_x, draws_y = np.random.choice(x, (20_000, x.size)), np.random.choice(y, (20_000, y.size))
    for name in ("mean_diff", "iqm_diff", "probability_of_improvement"):
        statistic = stats.TWO_ARM_STATISTICS[name][0]
        values = statistic(draws_x, draws_y, axis=-1)  # one value per resample
        low, high = np.percentile(values, [2.5, 97.5])
        ci = stats.independent_bootstrap_ci((x, y), statistic, n_resamples=20_000)
        width = high - low
        assert ci.low == pytest.approx(low, abs=0.05 * width) and ci.high == pytest.approx(high, abs=0.05 * width), name


def test_t_intervals_are_the_textbook_ones():
    from scipy import stats as scipy_stats

    x, y = np.array([4.0, 9.0, 7.0, 1.0]), np.array([3.0, 3.5, 5.0])
    expected = scipy_stats.ttest_1samp(x, 0).confidence_interval(0.95)
    got = stats.trimmed_mean_interval(x)
    assert (got.low, got.high) == pytest.approx((expected.low, expected.high))
    expected = scipy_stats.ttest_ind(y, x, equal_var=False).confidence_interval(0.95)
    got = stats.difference_interval(x, y)
    assert (got.low, got.high) == pytest.approx((expected.low, expected.high)) and got.method == "Welch t"
    # the IQM of 8 values: 2 cut each side, winsorized variance, 3 degrees of freedom
    z = np.array([1.0, 2.0, 4.0, 5.0, 6.0, 8.0, 20.0, 40.0])
    winsorized = np.array([4.0, 4.0, 4.0, 5.0, 6.0, 8.0, 8.0, 8.0])
    half = scipy_stats.t.ppf(0.975, 3) * np.sqrt(7 * winsorized.var(ddof=1) / (4 * 3))
    got = stats.trimmed_mean_interval(z, trim=0.25)
    assert (got.low, got.high) == pytest.approx((5.75 - half, 5.75 + half))


def test_intervals_over_a_few_seeds_cover_what_they_claim():
    """1,000 simulated studies per size: at 3 and 5 seeds per arm the 95% intervals of the mean,
    the IQM and their differences cover the true value in 93-97.5% of them (the percentile
    bootstrap they replace covered 80% at 3 seeds), and with no true difference the probability
    of improvement's interval lies above 0.5 in at most 5% of studies."""
    rng = np.random.default_rng(11)
    for n in (3, 5):
        covered = {"mean": 0, "iqm": 0, "mean_diff": 0, "iqm_diff": 0}
        studies = 1_000
        for _ in range(studies):
            x, y = rng.normal(1.0, 1.0, n), rng.normal(0.0, 2.0, n)  # symmetric: IQM = mean = the centre
            mean_ci = stats.trimmed_mean_interval(x)
            covered["mean"] += mean_ci.low <= 1.0 <= mean_ci.high
            iqm_ci = stats.trimmed_mean_interval(x, trim=stats.IQM_TRIM)
            covered["iqm"] += iqm_ci.low <= 1.0 <= iqm_ci.high
            for name, trim in (("mean_diff", 0.0), ("iqm_diff", stats.IQM_TRIM)):
                ci = stats.difference_interval(y, x, trim=trim)
                covered[name] += ci.low <= 1.0 <= ci.high
        for name, hits in covered.items():
            assert 0.93 <= hits / studies <= 0.975, (n, name, hits / studies)
        ahead = 0
        for _ in range(100):
            x, y = rng.normal(0.0, 1.0, n), rng.normal(0.0, 1.0, n)
            ahead += stats.probability_of_improvement_interval(x, y).low > 0.5
        assert ahead <= 5, (n, ahead)
    # three seeds that all beat three others: the bootstrap alone reads [1, 1]; the rank test cannot decide
    ci = stats.probability_of_improvement_interval(np.array([5.0, 6.0, 7.0]), np.array([1.0, 2.0, 3.0]))
    assert ci.low == 0.5 and ci.high == 1.0 and "exact rank test (p=0.1)" in ci.method


def test_no_interval_from_fewer_than_three_seeds():
    found = stats.seed_statistics([4.0, 9.0], [3.0, 3.0])
    assert found["mean_diff"] == 3.5 and "mean_diff_ci_low" not in found and "mean_ci_low" not in found
    found = stats.seed_statistics([4.0, 9.0, 7.0], [3.0, 3.0, 5.0])
    assert found["mean_diff_ci_low"] <= found["mean_diff"] <= found["mean_diff_ci_high"]
    assert 0.0 <= found["probability_of_improvement_ci_low"] <= found["probability_of_improvement_ci_high"] <= 1.0


# -- the train kind's trainings, in process and on Ray ----------------------------------------------

@pytest.mark.slow
def test_ray_executor_stores_the_same_rows_as_the_local_one(tmp_path):
    spec = write(tmp_path, TINY)
    done = runner("run", str(spec), "--db", "local.duckdb", "--no-report", cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    # two training seeds per arm: the verdict reads inconclusive and says why
    assert "inconclusive — 2 training seeds per arm" in done.stdout
    done = runner("run", str(spec), "--db", "ray.duckdb", "--no-report", "--executor", "ray",
                  "--runs-dir", "ray_runs", cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trained on Ray" in done.stderr
    for table in DETERMINISTIC:
        local, ray = rows(tmp_path / "local.duckdb", table), rows(tmp_path / "ray.duckdb", table)
        assert local and local == ray, table
    # 2 trials x 2 seeds, each row carrying its training seed; checkpoints written by the runner
    assert {r[:2] for r in rows(tmp_path / "ray.duckdb", "train_results")} == {
        (t, s) for t in ("learning_rate=0.0001", "learning_rate=0.0002") for s in (3, 4)}
    assert len(list((tmp_path / "ray_runs").glob("*/seeds_lr/*/seed=*/final.pt"))) == 4


def _training_workers(measurement: str) -> list[int]:
    found = subprocess.run(["pgrep", "-f", f"ray::train {measurement} "], capture_output=True,
                           text=True).stdout.split()
    return [int(pid) for pid in found]


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[str]:
    """The address of a local Ray cluster that runs as long as this module's tests: the runs that
    join it with --ray-address pay for no cluster start of their own. Shut down with the module
    (ray.shutdown stops what this process started, and nothing else)."""
    import ray

    ray.init(include_dashboard=False, log_to_driver=False, num_cpus=2)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


@pytest.mark.slow
def test_a_killed_ray_worker_leaves_a_consistent_database_and_resume_runs_only_what_is_missing(tmp_path, ray_cluster):
    # a measurement name of its own: its workers are the ones this test may kill
    spec = dict(TINY, measurements=[dict(TINY["measurements"][0], name="killed_lr", total_transitions=800, seeds=2)],
                verdicts=[dict(TINY["verdicts"][0], measurement="killed_lr")])
    path = write(tmp_path, spec)
    db = tmp_path / "results.duckdb"
    # both runs join one cluster, as a user's runs join theirs: the kill and the resume on the same workers' node
    child = subprocess.Popen([sys.executable, "-m", "runner", "run", str(path), "--db", str(db), "--no-report",
                              "--executor", "ray", "--ray-address", ray_cluster, "--ray-retries", "0"], cwd=tmp_path,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_rows(db, "SELECT count(*) FROM train_results", timeout=400)
        deadline = time.monotonic() + 60
        while not (workers := _training_workers("killed_lr")) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert workers, "no Ray worker was running a training"
        os.kill(workers[0], signal.SIGKILL)
        out, err = child.communicate(timeout=600)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode != 0
    assert "trainings failed on Ray" in err and "`runner run --resume`" in err
    assert "Traceback" not in err
    db_rows = {table: rows(db, table) for table in DETERMINISTIC}
    stored = {r[:2] for r in db_rows["train_results"]}
    assert 1 <= len(stored) < 4
    # a training is stored whole or not at all
    for table, found in db_rows.items():
        assert {r[:2] for r in found} == stored, table

    done = runner("run", str(path), "--db", str(db), "--no-report", "--resume", "--executor", "ray",
                  "--ray-address", ray_cluster, cwd=tmp_path, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    after = {table: rows(db, table) for table in DETERMINISTIC}
    assert {r[:2] for r in after["train_results"]} == {
        (t, s) for t in ("learning_rate=0.0001", "learning_rate=0.0002") for s in (3, 4)}
    for table in DETERMINISTIC:  # what was stored is kept, once: the resume trained only the missing trainings
        assert set(db_rows[table]) <= set(after[table]), table
        assert len(after[table]) == len(set(after[table])), table
    assert done.stdout.count("verdict") == 1


# -- verdict rules -------------------------------------------------------------------------------

@pytest.mark.slow
def test_one_training_seed_per_arm_reads_inconclusive(tmp_path):
    spec = dict(TINY, measurements=[dict(TINY["measurements"][0], total_transitions=300, learning_starts=100,
                                         seeds=None)])
    done = runner("run", str(write(tmp_path, spec)), "--db", "results.duckdb", "--no-report", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    with duckdb.connect(str(tmp_path / "results.duckdb"), read_only=True) as con:
        outcome, reason = con.execute("SELECT outcome, reason FROM verdicts").fetchone()
        seeds = con.execute("SELECT DISTINCT training_seed FROM train_episodes").fetchall()
    assert outcome == "inconclusive" and reason.startswith("one training seed per arm")
    assert seeds == [(3,)]


@pytest.mark.parametrize("change, message", [
    ({"verdicts": [dict(TINY["verdicts"][0], deployment_worthy_when={"score_mean_diff": "> 0"})]},
     "score_mean_diff is one difference between single draws: judge its interval over training seeds"),
    ({"verdicts": [dict(TINY["verdicts"][0], deployment_worthy_when={"last20_mean_diff": "> 0"})]},
     "last20_mean_diff is one difference between single draws, and training episodes have no interval over "
     "training seeds: judge the greedy scores', score_mean_diff_ci_low or score_iqm_diff_ci_low"),
    ({"measurements": [dict(TINY["measurements"][0], score_seeds=None)]},
     "judges scores over training seeds: give measurement 'seeds_lr' `score_seeds`"),
    ({"measurements": [dict(TINY["measurements"][0], sweep={"seed": [1, 2]})], "verdicts": []},
     "list the training seeds once, in `seeds`"),
    ({"measurements": [dict(TINY["measurements"][0], seeds=[5, 5])]}, "training seeds must be distinct"),
])
def test_spec_mistakes_get_one_line_errors(tmp_path, change, message):
    done = runner("validate", str(write(tmp_path, dict(TINY, **change))), cwd=tmp_path)
    assert done.returncode != 0 and message in done.stdout + done.stderr
    assert "Traceback" not in done.stderr


def test_ray_address_needs_the_ray_executor(tmp_path):
    done = runner("run", str(write(tmp_path, TINY)), "--ray-address", "auto", cwd=tmp_path)
    assert done.returncode == 2 and "needs --executor ray" in done.stderr
