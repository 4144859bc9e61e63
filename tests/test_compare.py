"""`runner compare` on synthetic runs written through the store into a real DuckDB file."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from test_json_output import assert_documented

from runner.cli.commands import main
from runner.compare.runs import (
    BETTER,
    DIFFERENT_MACHINE,
    NO_CHANGE,
    NOT_COMPARABLE,
    NOT_TESTABLE,
    SETTINGS_FILLED,
    WORSE,
    CompareError,
    compare_runs,
)
from runner.spec.document import settings_as_written
from runner.store.database import Store, utcnow

SHA = "a" * 64


def latency_spec(runtimes: list[str], iterations: int = 200, rounds: int = 1) -> str:
    lines = ["name: lat", "contract: {name: breakout-v2}", "artifacts:", "  onnx_fp32: {path: m.onnx}", "runtimes:"]
    lines += [f"  {r}: {{runtime: onnxruntime, provider: cpu, intra_op_threads: 1, artifact: onnx_fp32}}"
              for r in runtimes]
    lines += ["measurements:", "  - kind: latency", "    name: lat", f"    runtimes: [{', '.join(runtimes)}]",
              f"    iterations: {iterations}", f"    rounds: {rounds}"]
    return "\n".join(lines) + "\n"


def eval_spec(policies: list[str]) -> str:
    lines = ["name: ev", "policies:"] + [f"  {p}: {{type: random}}" for p in policies]
    lines += ["measurements:", "  - kind: evaluate", "    name: ev", f"    policies: [{', '.join(policies)}]",
              "    seeds: {start: 0, count: 30}"]
    return "\n".join(lines) + "\n"


def add_run(store: Store, run_id: str, spec_text: str, *, host: str = "box", contract: str = "c2",
            packages: dict | None = None, commit: str = "abc", settings: dict | None = None) -> str:
    """A finished run; `settings` is the spec as it ran, stored as a runner that keeps it does
    (None: a run stored before settings were kept)."""
    name = spec_text.split("\n", 1)[0].removeprefix("name: ")
    store.begin_run({"run_id": run_id, "spec_name": name, "spec_hash": "h", "spec_text": spec_text,
                     "spec_settings": None if settings is None else json.dumps(settings),
                     "contract_hash": contract, "host": host, "cpu": "cpu x", "gpu": "none",
                     "packages": json.dumps(packages or {"onnxruntime": "1.0"}), "git_commit": commit})
    store.finish_run(run_id, "done")
    return run_id


def add_latency(store: Store, run_id: str, samples: dict[str, np.ndarray], *, sha: str = SHA, rounds: int = 1,
                states: str = "fixed states models/s.npz (sha256 1e79a8ca5dce), first b states") -> None:
    """Each runtime's samples in `rounds` rounds of equal length, in order."""
    import pyarrow as pa

    n = sum(len(ms) for ms in samples.values())
    store.append_arrow("latency_samples", pa.table({
        "run_id": [run_id] * n, "measurement": ["lat"] * n,
        "runtime": [r for r, ms in samples.items() for _ in ms], "batch_size": np.ones(n, dtype=np.int32),
        "round": np.concatenate([np.arange(len(ms)) * rounds // len(ms) for ms in samples.values()]).astype(np.int32),
        "sample": np.concatenate([np.arange(len(ms)) for ms in samples.values()]
                                                                       ).astype(np.int32),
        "ms": np.concatenate(list(samples.values()))}))
    store.append_rows("latency_series", [{
        "run_id": run_id, "measurement": "lat", "runtime": r, "batch_size": 1, "warmup": 20, "iterations": len(ms),
        "rounds": rounds, "timer": "perf_counter_ns", "timer_resolution_s": 1e-9,
        "timer_implementation": "clock_gettime",
        "percentile_method": "linear", "input": states} for r, ms in samples.items()])
    store.append_rows("runtime_status", [{
        "run_id": run_id, "measurement": "lat", "runtime": r, "backend": "onnxruntime", "artifact": "m.onnx",
        "artifact_sha256": sha, "precision": "fp32", "requested": "{}", "available": True, "reason": None,
        "runtime_describe": None, "load_s": 0.1, "recorded_at": utcnow()} for r in samples])


def add_episodes(store: Store, run_id: str, scores: dict[str, np.ndarray]) -> None:
    store.append_rows("episodes", [{
        "run_id": run_id, "measurement": "ev", "policy": p, "seed": seed, "score": float(s), "steps": 100,
        "frames": 400, "ended_by": "game_over", "action_noop": 25, "action_fire": 25, "action_right": 25,
        "action_left": 25, "wall_s": 0.1, "contract_hash": "c2"}
        for p, v in scores.items() for seed, s in enumerate(v)])


def latencies(rng: np.random.Generator, scale: float = 1.0, n: int = 200, load: np.ndarray | None = None
              ) -> np.ndarray:
    """n calls; `load`, the machine's slowdown in each round (n split evenly among them)."""
    calls = scale * rng.lognormal(mean=0.0, sigma=0.1, size=n)
    return calls if load is None else calls * np.repeat(load, n // len(load))


def latency_pair(store: Store, run_id: str, scale: float, rng: np.random.Generator, *, rounds: int = 10,
                 calls: int = 100, spec: str | None = None) -> None:
    """A run of `ort` against the baseline `ref`, `ort` `scale` times slower, under a load that
    changes from round to round (and between runs) on both alike."""
    load = rng.lognormal(0.0, 0.5, rounds)
    n = rounds * calls
    add_latency(store, add_run(store, run_id, spec or latency_spec(["ref", "ort"], n, rounds)),
                {"ref": latencies(rng, n=n, load=load), "ort": latencies(rng, scale, n=n, load=load)}, rounds=rounds)


def only(comparison, metric: str):
    (row,) = [r for r in comparison.rows if r.metric == metric]
    return row


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "r.duckdb")


@pytest.mark.parametrize("scale, mark", [(1.3, WORSE), (0.7, BETTER), (1.0, NO_CHANGE)])
def test_latency_shift_is_found(store, scale, mark):
    """Judged as the ratio to the baseline in the same round, over rounds; the absolute times,
    which the load between runs moves, are shown and not judged."""
    rng = np.random.default_rng(1)
    latency_pair(store, "A", 1.0, rng)
    latency_pair(store, "B", scale, rng)
    comparison = compare_runs(store, "A", "B")
    row = only(comparison, "p50_ratio")
    assert row.subject == "ort b=1 ÷ ref" and row.mark == mark
    assert row.test.startswith("per-round P50 ratio over 10/10 rounds (rounds, not calls)")
    assert row.ratio == pytest.approx(scale, rel=0.05)
    absolute = [r for r in comparison.rows if r.metric == "p50_ms"]
    assert len(absolute) == 2 and all(r.mark == NOT_TESTABLE and "load" in r.test for r in absolute)


def test_significant_change_within_the_factor_is_no_change(store):
    rng = np.random.default_rng(2)
    latency_pair(store, "A", 1.0, rng, rounds=20)
    latency_pair(store, "B", 1.05, rng, rounds=20)
    row = only(compare_runs(store, "A", "B"), "p50_ratio")
    assert row.significant and row.mark == NO_CHANGE and "within the factor 1.1" in row.note
    assert row.ratio_interval[0] > 1.02
    assert only(compare_runs(store, "A", "B", factor=1.02), "p50_ratio").mark == WORSE


def test_the_gate_fails_only_when_the_whole_interval_is_beyond_the_factor(store):
    """A ratio whose point is beyond the factor but whose interval is not: significant, not worse."""
    rng = np.random.default_rng(12)
    latency_pair(store, "A", 1.0, rng, rounds=3, calls=64)
    add_latency(store, add_run(store, "B", latency_spec(["ref", "ort"], 192, 3)),
                {"ref": latencies(rng, n=192), "ort": latencies(rng, n=192) * np.repeat([1.05, 1.25, 1.3], 64)},
                rounds=3)
    row = only(compare_runs(store, "A", "B"), "p50_ratio")
    assert row.ratio > 1.1 and row.ratio_interval[0] < 1.1 and row.mark != WORSE


def test_fail_on_regression_exits_nonzero_only_beyond_its_factor(store):
    rng = np.random.default_rng(3)
    latency_pair(store, "A", 1.0, rng)
    latency_pair(store, "B", 1.3, rng)
    cli = CliRunner()
    args = ["compare", "A", "B", "--db", str(store.path), "--no-report"]
    assert cli.invoke(main, args + ["--fail-on-regression", "1.1"]).exit_code == 1
    assert cli.invoke(main, args + ["--fail-on-regression", "1.5"]).exit_code == 0
    assert cli.invoke(main, args).exit_code == 0


def test_a_regression_gate_does_not_pass_on_no_evidence(store):
    """A gate whose every row is not comparable (here a contract that changed) has compared
    nothing: it fails with the reason, where it would otherwise pass; a factor must be finite."""
    rng = np.random.default_rng(3)
    add_latency(store, add_run(store, "A", latency_spec(["ort"])), {"ort": latencies(rng)})
    add_latency(store, add_run(store, "B", latency_spec(["ort"]), contract="c3"), {"ort": latencies(rng)})
    cli = CliRunner()
    args = ["compare", "A", "B", "--db", str(store.path), "--no-report"]
    gated = cli.invoke(main, args + ["--fail-on-regression", "1.1"])
    assert gated.exit_code == 1 and "no metric of the two runs could be judged" in gated.output
    assert cli.invoke(main, args).exit_code == 0  # without a gate the comparison is shown, and that is all
    for option in ("--factor", "--fail-on-regression"):
        for number in ("nan", "inf"):
            refused = cli.invoke(main, args + [option, number])
            assert refused.exit_code == 2 and "is not a finite number" in refused.output, (option, number)


def test_the_terminal_shows_stored_text_as_written(store):
    """Brackets in a verdict's reason, a run's spec or a row are text, not rich markup: shown
    whole, never dropped or failed on, and a long cell is not cut in a pipe."""
    add_run(store, "A", eval_spec(["dqn"]))
    reason = "worse [/] than [bold]before[/bold] " + "x" * 200
    store.append_rows("verdicts", [{
        "run_id": "A", "verdict": "v", "measurement": "ev", "candidate": "dqn", "baseline": "random",
        "outcome": "rejected", "reason": reason, "evidence": "{}", "decided_at": utcnow()}])
    cli = CliRunner()
    shown = cli.invoke(main, ["sql", "SELECT reason, '[/x]' AS closing, 123456789.0::DOUBLE AS big FROM verdicts",
                              "--db", str(store.path)])
    assert shown.exit_code == 0, shown.output
    assert reason in shown.output and "[/x]" in shown.output and "123456789" in shown.output
    verdicts = cli.invoke(main, ["report", "--verdicts", "--db", str(store.path), "--reports", str(store.path.parent)])
    assert verdicts.exit_code == 0, verdicts.output
    assert reason in verdicts.output


@pytest.mark.slow
def test_null_latency_trials_are_flagged_no_more_often_than_the_stated_rate(store):
    """100 runtimes against a baseline, each drawn from one distribution in both runs, under a
    load that changes from round to round and between the runs: a 95% interval leaves out 1 in
    about 5 of 100 rows (more than 12 with probability < 0.002), and none is worse or better
    beyond the factor."""
    trials = ["base"] + [f"r{i}" for i in range(100)]
    rng = np.random.default_rng(4)
    for run_id in ("A", "B"):
        load = rng.lognormal(0.0, 0.5, 10)
        add_latency(store, add_run(store, run_id, latency_spec(trials, 1000, 10)),
                    {r: latencies(rng, n=1000, load=load) for r in trials}, rounds=10)
    rows = compare_runs(store, "A", "B").rows
    for metric in ("p50_ratio", "p95_ratio"):
        judged = [r for r in rows if r.metric == metric]
        assert len(judged) == 100
        assert sum(r.significant for r in judged) <= 12
        assert not any(r.mark in (BETTER, WORSE) for r in judged)


def test_null_score_trials_are_flagged_no_more_often_than_the_stated_rate(store):
    """200 policies, 30 seeds each, the same score distribution in both runs: a 95% interval
    excludes 0 in about 5% (10 of 200); more than 20 would happen by chance with probability < 0.001.
    (The percentile bootstrap runs a little above its nominal rate at 30 seeds: 5.5-7% measured.)"""
    policies = [f"p{i}" for i in range(200)]
    rng = np.random.default_rng(5)
    for run_id in ("A", "B"):
        add_run(store, run_id, eval_spec(policies))
        add_episodes(store, run_id, {p: rng.poisson(12, size=30) for p in policies})
    rows = compare_runs(store, "A", "B").rows
    assert len(rows) == 200 and all("paired bootstrap" in r.test for r in rows)
    assert sum(r.significant for r in rows) <= 20


def test_known_score_shift_is_found_paired_by_seed(store):
    rng = np.random.default_rng(6)
    base = rng.poisson(12, size=30).astype(float)
    add_run(store, "A", eval_spec(["dqn"]))
    add_episodes(store, "A", {"dqn": base})
    add_run(store, "B", eval_spec(["dqn"]))
    add_episodes(store, "B", {"dqn": base + rng.integers(2, 6, size=30)})
    row = only(compare_runs(store, "A", "B"), "mean_score")
    assert row.mark == BETTER and "paired" in row.test and row.value_b > row.value_a


def test_changed_model_file_reads_not_comparable(store):
    rng = np.random.default_rng(7)
    add_latency(store, add_run(store, "A", latency_spec(["ort"])), {"ort": latencies(rng)})
    add_latency(store, add_run(store, "B", latency_spec(["ort"])), {"ort": latencies(rng, 1.5)}, sha="b" * 64)
    comparison = compare_runs(store, "A", "B")
    row = only(comparison, "p50_ms")
    assert row.mark == NOT_COMPARABLE and "model file of ort differs" in row.problem
    assert comparison.regressions(1.1) == []


def test_a_stored_spec_that_is_no_spec_is_one_line(store):
    add_run(store, "A", eval_spec(["dqn"]), settings={"measurements": 5})
    add_run(store, "B", eval_spec(["dqn"]), settings=settings_as_written(eval_spec(["dqn"])))
    with pytest.raises(CompareError, match="run A: its stored spec cannot be compared "
                                           r"\(measurements is not a list of named measurements, each of a kind\)"):
        compare_runs(store, "A", "B")


def test_a_run_without_seeds_against_one_with_them_is_compared_seed_by_seed(store):
    """A training of one seed against a study over seeds: each agent is compared with its own
    seed's, in either order, never with two seeds' agents pooled."""
    plain = "name: tr\nmeasurements:\n  - kind: train\n    name: tr\n    total_transitions: 2000\n"
    for run_id, spec, seeds in (("A", plain, (42,)), ("B", plain + "    seeds: 2\n", (42, 43))):
        add_run(store, run_id, spec)
        store.append_rows("train_scores", [{
            "run_id": run_id, "measurement": "tr", "trial": "base", "training_seed": seed, "transition": 2000,
            "checkpoint": "final.pt", "eval_seed": k, "score": float(k + seed), "steps": 100, "ended_by": "game_over"}
            for seed in seeds for k in (1, 2, 3)])
    for a, b in (("A", "B"), ("B", "A")):
        rows = {r.subject: r for r in compare_runs(store, a, b).rows if r.metric == "final_score"}
        assert sorted(rows) == ["trial base,seed=42", "trial base,seed=43"]
        assert rows["trial base,seed=42"].value_a == rows["trial base,seed=42"].value_b == 44.0
        assert rows["trial base,seed=43"].problem == f"scored only in run {b}"
    # a sweep over seed and a study over `seeds:` name the same agents alike
    add_run(store, "C", plain + "    sweep: {seed: [42, 43]}\n")
    store.append_rows("train_scores", [{
        "run_id": "C", "measurement": "tr", "trial": f"seed={seed}", "training_seed": seed, "transition": 2000,
        "checkpoint": "final.pt", "eval_seed": k, "score": float(k + seed), "steps": 100, "ended_by": "game_over"}
        for seed in (42, 43) for k in (1, 2, 3)])
    rows = {r.subject: r for r in compare_runs(store, "C", "B").rows if r.metric == "final_score"}
    assert sorted(rows) == ["trial base,seed=42", "trial base,seed=43"]
    assert all(r.problem is None for r in rows.values())


def test_scores_that_do_not_vary_show_no_significance(store):
    """Under breakout-v2 thirty seeds can replay one game: every seed then moves by the same
    amount, and an interval of zero width is no evidence of a change."""
    add_episodes(store, add_run(store, "A", eval_spec(["dqn"])), {"dqn": np.full(30, 11.0)})
    add_episodes(store, add_run(store, "B", eval_spec(["dqn"])), {"dqn": np.full(30, 9.0)})
    row = only(compare_runs(store, "A", "B"), "mean_score")
    assert row.mark == NOT_TESTABLE and row.test.startswith("every seed moved by -2 (30 seeds)")


def test_export_sizes_are_exact_and_judged_beyond_the_factor(store):
    """A file's size has no noise: the same size is no change, and a gate can pass on it; a
    larger file is worse only beyond the factor."""
    spec = ("name: ex\nartifacts:\n  ck: {path: m.pt}\n  onnx: {path: m.onnx, made_by: ex}\nmeasurements:\n"
            "  - kind: export\n    name: ex\n    checkpoint: ck\n    onnx: onnx\n")
    for run_id, size in (("A", 1000), ("B", 1000), ("C", 1200)):
        add_run(store, run_id, spec)
        store.append_rows("export_files", [{"run_id": run_id, "measurement": "ex", "artifact": "onnx", "path": "m.onnx",
                                            "format": "onnx", "bytes": size, "sha256": "s", "checkpoint_sha256": "c"}])
    assert only(compare_runs(store, "A", "B"), "bytes").mark == NO_CHANGE
    assert only(compare_runs(store, "A", "C"), "bytes").mark == WORSE
    gate = ["compare", "A", "B", "--db", str(store.path), "--no-report", "--fail-on-regression", "1.1"]
    assert CliRunner().invoke(main, gate).exit_code == 0


def test_a_run_that_did_not_finish_carries_a_caution(store):
    rng = np.random.default_rng(4)
    add_latency(store, add_run(store, "A", latency_spec(["ort"])), {"ort": latencies(rng)})
    add_latency(store, add_run(store, "B", latency_spec(["ort"])), {"ort": latencies(rng)})
    assert compare_runs(store, "A", "B").caution is None
    with store.writer() as con:
        con.execute("UPDATE runs SET status = 'interrupted' WHERE run_id = 'B'")
    assert compare_runs(store, "A", "B").caution == "run B is interrupted: its rows may stop short of the spec"


def test_a_checkpoint_policy_whose_file_changed_reads_not_comparable(store):
    """The same path with other bytes is another agent: its scores are not comparable. A run
    stored before the files were recorded says so in a note, and stays comparable."""
    spec = ("name: ev\npolicies:\n  dqn: {type: checkpoint, path: m.pt}\nmeasurements:\n  - kind: evaluate\n"
            "    name: ev\n    policies: [dqn]\n    seeds: {start: 0, count: 30}\n")
    rng = np.random.default_rng(9)
    for run_id, sha in (("A", "a" * 64), ("B", "b" * 64), ("C", "a" * 64), ("D", None)):
        add_run(store, run_id, spec)
        add_episodes(store, run_id, {"dqn": rng.integers(0, 20, 30)})
        if sha:
            store.append_rows("policy_files", [{"run_id": run_id, "measurement": "ev", "policy": "dqn",
                                                "path": "/x/m.pt", "sha256": sha}])
    changed = only(compare_runs(store, "A", "B"), "mean_score")
    assert changed.mark == NOT_COMPARABLE and changed.problem == ("model file of policy dqn differs: sha256 "
                                                                  "aaaaaaaaaaaa… → bbbbbbbbbbbb…")
    assert only(compare_runs(store, "A", "C"), "mean_score").problem is None
    unknown = only(compare_runs(store, "A", "D"), "mean_score")
    assert unknown.problem is None and "sha256 is not recorded in run B" in unknown.note
    with store.writer() as con:  # as in an older runner's database that this one may read but not migrate
        con.execute("DROP TABLE policy_files")
    assert "not recorded in run A or B" in only(compare_runs(store, "A", "B"), "mean_score").note


def test_changed_contract_or_settings_read_not_comparable(store):
    rng = np.random.default_rng(8)
    add_latency(store, add_run(store, "A", latency_spec(["ort"])), {"ort": latencies(rng)})
    add_latency(store, add_run(store, "B", latency_spec(["ort"]), contract="c3"), {"ort": latencies(rng)})
    add_latency(store, add_run(store, "C", latency_spec(["ort"], 400)), {"ort": latencies(rng, n=400)})
    assert "contract differs" in only(compare_runs(store, "A", "B"), "p50_ms").problem
    row = only(compare_runs(store, "A", "C"), "p50_ms")
    assert row.mark == NOT_COMPARABLE and "iterations 200 → 400" in row.problem


def test_settings_are_read_as_the_runs_stored_them(store):
    """Two runs of one spec text whose defaults differed when they ran (here the iterations, as
    a runner whose default changed would have filled them in) answer different questions."""
    rng = np.random.default_rng(9)
    text = latency_spec(["ort"])
    ran_with_400 = settings_as_written(text)
    ran_with_400["measurements"][0]["iterations"] = 400
    add_latency(store, add_run(store, "A", text, settings=settings_as_written(text)), {"ort": latencies(rng)})
    add_latency(store, add_run(store, "B", text, commit="def", settings=ran_with_400), {"ort": latencies(rng)})
    comparison = compare_runs(store, "A", "B")
    row = only(comparison, "p50_ms")
    assert row.mark == NOT_COMPARABLE and "iterations 200 → 400" in row.problem
    assert ("settings", "as run", "as run", False) in comparison.environment and comparison.caution is None


@pytest.mark.parametrize("commit_b", ["abc", "def"])
def test_runs_stored_before_settings_were_kept_carry_a_caution_across_commits(store, tmp_path, commit_b):
    """Without stored settings both specs are read from their text with this runner's defaults,
    which cannot show a default that changed between two commits: the comparison says so, in
    the terminal and the HTML report."""
    rng = np.random.default_rng(10)
    text = latency_spec(["ort"])
    add_latency(store, add_run(store, "A", text), {"ort": latencies(rng)})
    add_latency(store, add_run(store, "B", text, commit=commit_b, settings=settings_as_written(text)),
                {"ort": latencies(rng)})
    comparison = compare_runs(store, "A", "B")
    assert ("settings", SETTINGS_FILLED, SETTINGS_FILLED, False) in comparison.environment
    assert only(comparison, "p50_ms").problem is None
    if commit_b == "abc":
        assert comparison.caution is None
        return
    assert "between commits abc and def does not show" in comparison.caution
    shown = CliRunner().invoke(main, ["compare", "A", "B", "--db", str(store.path), "--reports", str(tmp_path)])
    assert shown.exit_code == 0, shown.output
    assert "caution: settings are read from both runs' spec text with this runner's defaults" in \
        " ".join(shown.output.split())
    assert "Caution" in next(tmp_path.glob("compare-*.html")).read_text()


def test_a_stored_spec_is_read_as_its_file_was():
    """`1e-2` is a number in a spec file (YAML 1.2), so it is one in the stored text too: such a
    spec runs, and reads the same as one that writes 0.01."""
    from runner.compare.runs import _spec_trees

    text = ("name: ev\npolicies:\n  p: {type: checkpoint, path: m.pt, epsilon: 1e-2}\nmeasurements:\n"
            "  - kind: evaluate\n    name: ev\n    policies: [p]\n    seeds: {start: 0, count: 2}\n")
    assert settings_as_written(text)["policies"]["p"]["epsilon"] == 0.01
    a, b, read = _spec_trees(text, text.replace("1e-2", "0.01"))
    assert a == b and read == SETTINGS_FILLED


def test_latency_inputs_are_compared_by_content_not_path(store):
    rng = np.random.default_rng(11)
    add_latency(store, add_run(store, "A", latency_spec(["ort"])), {"ort": latencies(rng)})
    add_latency(store, add_run(store, "B", latency_spec(["ort"])), {"ort": latencies(rng)},
                states="fixed states /elsewhere/s.npz (sha256 1e79a8ca5dce), first b states")
    add_latency(store, add_run(store, "C", latency_spec(["ort"])), {"ort": latencies(rng)},
                states="fixed states models/s.npz (sha256 0123456789ab), first b states")
    assert only(compare_runs(store, "A", "B"), "p50_ms").problem is None
    row = only(compare_runs(store, "A", "C"), "p50_ms")
    assert row.mark == NOT_COMPARABLE and "0123456789ab" in row.problem


def test_mixed_hosts_are_flagged_and_timings_not_judged(store):
    rng = np.random.default_rng(9)
    add_latency(store, add_run(store, "A", latency_spec(["ort"])), {"ort": latencies(rng)})
    add_latency(store, add_run(store, "B", latency_spec(["ort"]), host="other", packages={"onnxruntime": "2.0"}),
                {"ort": latencies(rng, 2.0)})
    comparison = compare_runs(store, "A", "B")
    assert not comparison.same_machine
    flagged = {what for what, _, _, f in comparison.environment if f}
    assert flagged == {"host", "onnxruntime"}
    row = only(comparison, "p50_ms")
    assert row.mark == DIFFERENT_MACHINE
    assert comparison.regressions(1.1) == []


def test_one_value_per_run_cannot_show_significance(store):
    spec = ("name: tp\nmeasurements:\n  - kind: throughput\n    name: tp\n    total_transitions: 2000\n"
            "    warmup_transitions: 100\n")
    for run_id, tps in (("A", 100.0), ("B", 200.0)):
        add_run(store, run_id, spec)
        store.append_rows("throughput_trials", [{
            "run_id": run_id, "measurement": "tp", "trial": "base", "mode": "full", "settings": "{}",
            "warmup_transitions": 100, "transitions_per_s": tps}])
    row = only(compare_runs(store, "A", "B"), "transitions_per_s")
    assert row.mark == NOT_TESTABLE and "one sample per run cannot show significance" in row.test
    assert row.ratio == 2.0


def test_parity_change_beyond_tolerance_is_worse(store):
    spec = ("name: par\ncontract: {name: breakout-v2}\nartifacts:\n  onnx_fp32: {path: m.onnx}\n"
            "  fixed_states: {path: s.npz}\nruntimes:\n"
            "  ref: {runtime: onnxruntime, provider: cpu, artifact: onnx_fp32}\n"
            "  cand: {runtime: onnxruntime, provider: cpu, intra_op_threads: 1, artifact: onnx_fp32}\n"
            "measurements:\n  - kind: parity\n    name: par\n    fixed_states: fixed_states\n"
            "    runtimes: [ref, cand]\n")
    q = np.array([[1.0, 2.0, 3.0, 0.5], [0.2, 0.1, 0.4, 0.3]])
    for run_id, delta in (("A", 1e-7), ("B", 1e-3)):
        add_run(store, run_id, spec)
        store.append_rows("parity_q", [
            {"run_id": run_id, "measurement": "par", "runtime": r, "batch_size": 1, "state": i,
             "q_noop": v[0], "q_fire": v[1], "q_right": v[2], "q_left": v[3], "action": int(np.argmax(v))}
            for r, qs in (("ref", q), ("cand", q + delta)) for i, v in enumerate(qs)])
        store.append_rows("parity_settings", [{
            "run_id": run_id, "measurement": "par", "runtime": r, "precision": "fp32", "atol": 1e-5, "rtol": 1e-5,
            "tolerance_from": "default", "states_path": "s.npz", "states_sha256": SHA, "n_states": 2}
            for r in ("ref", "cand")])
    comparison = compare_runs(store, "A", "B")
    assert only(comparison, "max_abs_dq").mark == WORSE
    assert only(comparison, "action_agreement").mark == NO_CHANGE
    assert comparison.regressions(10.0)  # a deterministic change is no matter of a noise factor


def test_user_mistakes_are_one_line_and_exit_2(store):
    add_latency(store, add_run(store, "A", latency_spec(["ort"])), {"ort": latencies(np.random.default_rng(0))})
    add_run(store, "E", eval_spec(["dqn"]))
    cli = CliRunner()
    db = ["--db", str(store.path), "--no-report"]
    for args, message in ((["A", "nope"], "no run 'nope'"), (["A", "E"], "runs of different specs"),
                          (["--spec", "lat"], "spec 'lat' has 1 finished run(s)"), (["A"], "name two runs")):
        result = cli.invoke(main, ["compare", *args, *db])
        assert result.exit_code == 2, result.output
        assert result.output.strip().startswith("error: ") and message in result.output
        assert len(result.output.strip().splitlines()) == 1 and "Traceback" not in result.output
    with pytest.raises(CompareError):
        compare_runs(store, "A", "A")


@pytest.mark.slow
def test_spec_shorthand_and_html_report(store, tmp_path):
    rng = np.random.default_rng(10)
    for run_id in ("A", "B", "C"):
        latency_pair(store, run_id, 1.0, rng)
    result = CliRunner().invoke(main, ["compare", "--spec", "lat", "--db", str(store.path),
                                       "--reports", str(tmp_path / "reports")])
    assert result.exit_code == 0, result.output
    assert "A: B " in result.output and "B: C " in result.output  # the last two runs, older first
    page = (tmp_path / "reports" / "compare-lat-B-C.html").read_text()
    assert "vegaEmbed" in page and "no significant change" in page and "Same machine" in page


def test_verdicts_are_grouped_by_host_and_contract(store, tmp_path):
    from runner.report.run_report import build_verdicts_report

    for run_id, host, contract, outcome in (("A", "box", "c2", "rejected"), ("B", "other", "c2", "deployment-worthy"),
                                            ("C", "box", "c3", "inconclusive")):
        add_run(store, run_id, eval_spec(["dqn"]), host=host, contract=contract)
        store.append_rows("verdicts", [{
            "run_id": run_id, "verdict": "v", "measurement": "ev", "candidate": "dqn", "baseline": "random",
            "outcome": outcome, "reason": "r", "evidence": "{}", "decided_at": utcnow()}])
    path, frame = build_verdicts_report(store, tmp_path)
    assert sorted(zip(frame["host"], frame["contract_hash"], frame["outcome"])) == [
        ("box", "c2", "rejected"), ("box", "c3", "inconclusive"), ("other", "c2", "deployment-worthy")]
    page = path.read_text()
    assert all(t in page for t in ("host box · contract c2", "host box · contract c3", "host other · contract c2",
                                   "Grouped by host and contract hash"))
    result = CliRunner().invoke(main, ["report", "--verdicts", "--db", str(store.path), "--reports", str(tmp_path)])
    assert result.exit_code == 0 and "grouped by host and contract hash" in result.output
    assert result.output.count("host box · contract") == 2


def test_a_few_seeds_that_agree_in_sign_are_not_a_certain_change(store):
    """Over a seed sweep both runs trained, the same-seed differences are judged by a paired t
    interval, and only from 3 seeds on: two seeds of one sign (+20, +49 transitions/s) are not
    testable, where a bootstrap would have called the change certain (its interval is their
    range); equal differences give no interval either; 3 varying ones get a wide t interval.
    Runs that trained different seeds are compared by Welch's interval under the same rules."""
    def compared(rates_a, rates_b, first_seed_b=1):
        for run_id, rates, first in (("A", rates_a, 1), ("B", rates_b, first_seed_b)):
            seeds = range(first, first + len(rates))
            spec = ("name: tr\nmeasurements:\n  - kind: train\n    name: tr\n    total_transitions: 2000\n"
                    f"    sweep: {{seed: {list(seeds)}}}\n")
            add_run(store, run_id, spec)
            store.append_rows("train_results", [{
                "run_id": run_id, "measurement": "tr", "trial": f"seed={seed}", "attempt": 0, "transitions": 2000,
                "updates": 250, "target_syncs": 2, "wall_s": 2000 / rate, "transitions_per_s": rate}
                for seed, rate in zip(seeds, rates)])
        row = next(r for r in compare_runs(store, "A", "B").rows
                   if r.subject == f"base over {len(rates_a)} seeds" and r.metric == "transitions_per_s")
        with store.writer() as con:
            con.execute("DELETE FROM train_results")
            con.execute("DELETE FROM runs")
        return row

    two = compared((100.0, 101.0), (120.0, 150.0))
    assert two.test == "2 seeds: an interval over seeds needs at least 3" and two.mark == NOT_TESTABLE
    equal = compared((100.0, 110.0, 120.0), (130.0, 140.0, 150.0))
    assert equal.test.startswith("every seed moved by 30 (3 seeds)") and equal.mark == NOT_TESTABLE
    three = compared((100.0, 101.0, 102.0), (120.0, 150.0, 104.0))
    assert three.test.startswith("paired Student t 95% CI of the mean same-seed difference B − A [")
    assert "(3 seeds)" in three.test and three.mark == NO_CHANGE
    # runs that trained other seeds: Welch's interval, under the same rules
    other_two = compared((100.0, 101.0), (120.0, 150.0), first_seed_b=11)
    assert other_two.test == "2 vs 2 seeds: an interval over seeds needs at least 3 in each run"
    assert other_two.mark == NOT_TESTABLE
    flat = compared((100.0, 100.0, 100.0), (130.0, 130.0, 130.0), first_seed_b=11)
    assert flat.test == "neither run's seeds vary: a t interval has no width (3 vs 3 seeds)"
    assert flat.mark == NOT_TESTABLE


def test_a_sweep_over_seeds_gives_training_its_repeats(store):
    spec = ("name: tr\nmeasurements:\n  - kind: train\n    name: tr\n    total_transitions: 2000\n"
            "    sweep: {seed: [1, 2, 3, 4, 5]}\n")
    rng = np.random.default_rng(12)
    for run_id, rate, ret in (("A", 100.0, 10.0), ("B", 150.0, 15.0)):
        add_run(store, run_id, spec)
        for seed in range(1, 6):
            trial = f"seed={seed}"
            store.append_rows("train_results", [{
                "run_id": run_id, "measurement": "tr", "trial": trial, "attempt": 0, "transitions": 2000,
                "updates": 250, "target_syncs": 2, "wall_s": 2000 / rate, "transitions_per_s": rate + rng.normal()}])
            store.append_rows("train_episodes", [{
                "run_id": run_id, "measurement": "tr", "trial": trial, "attempt": 0, "env_index": 0,
                "transition": 100 * i, "episode_return": ret + rng.normal(), "length": 100, "ended_by": "game_over"}
                for i in range(20)])
    rows = compare_runs(store, "A", "B").rows
    per_trial = [r for r in rows if r.subject.startswith("trial ") and r.metric == "transitions_per_s"]
    assert len(per_trial) == 5 and {r.mark for r in per_trial} == {NOT_TESTABLE}
    over = {r.metric: r for r in rows if r.subject == "base over 5 seeds"}
    assert over["transitions_per_s"].mark == BETTER and "5 seeds" in over["transitions_per_s"].test
    assert over["last20_mean"].mark == BETTER and over["last20_mean"].ratio == pytest.approx(1.5, rel=0.1)


def test_training_scores_are_compared_per_agent_and_over_seeds(store):
    """The final checkpoints' greedy scores, which training verdicts judge, are compared too: each
    (trial, seed) agent's episodes, and each trial over its training seeds, paired by seed."""
    spec = ("name: tr\nmeasurements:\n  - kind: train\n    name: tr\n    total_transitions: 2000\n"
            "    seeds: 3\n    score_seeds: {start: 5000, count: 10}\n")
    rng = np.random.default_rng(13)
    for run_id, level in (("A", 20.0), ("B", 10.0)):
        add_run(store, run_id, spec)
        store.append_rows("train_scores", [{
            "run_id": run_id, "measurement": "tr", "trial": "base", "training_seed": seed, "transition": 2000,
            "checkpoint": "final.pt", "eval_seed": 5000 + k, "score": level + seed - 42 + rng.normal(), "steps": 100,
            "ended_by": "game_over"} for seed in (42, 43, 44) for k in range(10)])
    rows = compare_runs(store, "A", "B").rows
    per_agent = [r for r in rows if r.metric == "final_score"]
    assert sorted(r.subject for r in per_agent) == [f"trial base,seed={s}" for s in (42, 43, 44)]
    assert {r.mark for r in per_agent} == {WORSE} and "one training seed's agent" in per_agent[0].note
    assert per_agent[0].test.startswith("paired bootstrap 95% CI of the mean same-seed difference")  # same eval seeds
    (over,) = [r for r in rows if r.metric == "score_mean"]
    assert over.subject == "base over 3 seeds" and over.mark == WORSE
    assert over.test.startswith("paired Student t 95% CI") and over.ratio == pytest.approx(11 / 21, abs=0.05)


def test_the_run_report_reads_a_stored_spec_as_its_file_was(store, tmp_path):
    """A spec that writes `1e-2` validates in its run's report, which then draws its measurements."""
    from runner.report.run_report import build_run_report

    text = ("name: ev\npolicies:\n  p: {type: checkpoint, path: m.pt, epsilon: 1e-2}\nmeasurements:\n"
            "  - kind: evaluate\n    name: ev\n    policies: [p]\n    seeds: {start: 0, count: 2}\n")
    add_run(store, "R", text, settings=settings_as_written(text))
    page = build_run_report(store, tmp_path, "R").read_text()
    assert "no longer validates" not in page


# -- tails, verdicts side by side, --metric and --json --------------------------------------------

def add_verdict(store: Store, run_id: str, outcome: str, verdict: str = "fast") -> None:
    store.append_rows("verdicts", [{
        "run_id": run_id, "verdict": verdict, "measurement": "lat", "candidate": "ort", "baseline": "ref",
        "outcome": outcome, "reason": "r", "evidence": "{}", "decided_at": utcnow()}])


def with_verdict(spec_text: str, metric: str) -> str:
    return spec_text + ("verdicts:\n  - name: fast\n    measurement: lat\n    candidate: ort\n    baseline: ref\n"
                        f"    deployment_worthy_when: {{{metric}: '< 1.0'}}\n")


def test_a_tail_that_grew_under_an_unchanged_median_is_worse_and_fails_the_gate(store):
    """One call in eight three times slower: the median holds, P95 triples; P95 is judged by its own
    interval and the gate fails on it."""
    rng = np.random.default_rng(5)
    latency_pair(store, "A", 1.0, rng)
    load = rng.lognormal(0.0, 0.5, 10)
    ort = latencies(rng, n=1000, load=load)
    ort[::8] *= 3
    add_latency(store, add_run(store, "B", latency_spec(["ref", "ort"], 1000, 10)),
                {"ref": latencies(rng, n=1000, load=load), "ort": ort}, rounds=10)
    comparison = compare_runs(store, "A", "B")
    assert only(comparison, "p50_ratio").mark != WORSE
    p95 = only(comparison, "p95_ratio")
    assert p95.mark == WORSE and p95.ratio > 2 and p95.test.startswith("per-round P95 ratio over 10/10 rounds")
    result = CliRunner().invoke(main, ["compare", "A", "B", "--db", str(store.path), "--no-report",
                                       "--fail-on-regression", "1.1"])
    assert result.exit_code == 1 and "regression: lat ort b=1 ÷ ref p95_ratio" in result.output
    assert "1 worse, 0 better, 1 unchanged, 4 not comparable; verdicts: 0 of 0 flipped" in result.output


def test_statistics_a_verdict_uses_or_the_user_names_are_judged(store):
    rng = np.random.default_rng(6)
    spec = with_verdict(latency_spec(["ref", "ort"], 200, 2), "latency_p99_ratio_ci_high")
    for run_id in ("A", "B"):
        latency_pair(store, run_id, 1.0, rng, rounds=2, spec=spec)
    statistics = {"p50_ms", "p95_ms", "p99_ms", "p50_ratio", "p95_ratio", "p99_ratio"}
    assert {r.metric for r in compare_runs(store, "A", "B").rows} == statistics
    named = compare_runs(store, "A", "B", metrics=("mean_ms",))
    assert {r.metric for r in named.rows} == statistics | {"mean_ms", "mean_ratio"}
    assert only(named, "mean_ratio").test.startswith("per-round mean ratio over 2/2 rounds (rounds, not calls)")
    assert only(named, "p99_ratio").test == "per-round P99 ratio: rounds of 100 calls; a round's P99 needs >= 500"
    result = CliRunner().invoke(main, ["compare", "A", "B", "--db", str(store.path), "--no-report",
                                       "--metric", "p42_ms"])
    assert result.exit_code == 2
    assert result.output == ("error: --metric p42_ms: not a metric of lat's runs; they have p50_ms, p50_ratio, "
                             "p95_ms, p95_ratio, p99_ms, p99_ratio\n")


def test_a_verdict_that_flipped_is_shown_and_fails_the_gate(store):
    """Unchanged timings, but the verdict was deployment-worthy in A and rejected in B: the gate fails
    on the flip alone; a verdict that became worthy is marked but does not fail it."""
    rng = np.random.default_rng(7)
    for run_id, outcomes in (("A", ("deployment-worthy", "rejected")), ("B", ("rejected", "deployment-worthy"))):
        add_latency(store, add_run(store, run_id, with_verdict(latency_spec(["ort", "ref"]),
                                                               "latency_p95_ratio_ci_high")),
                    {"ort": latencies(rng), "ref": latencies(rng)})
        add_verdict(store, run_id, outcomes[0], "fast")
        add_verdict(store, run_id, outcomes[1], "other")
    comparison = compare_runs(store, "A", "B")
    flips = {v.verdict: (v.outcome_a, v.outcome_b, v.flipped, v.regressed) for v in comparison.verdicts}
    assert flips == {"fast": ("deployment-worthy", "rejected", True, True),
                     "other": ("rejected", "deployment-worthy", True, False)}
    result = CliRunner().invoke(main, ["compare", "A", "B", "--db", str(store.path), "--no-report",
                                       "--fail-on-regression", "1.1"])
    assert result.exit_code == 1
    assert "verdict flipped: fast (ort vs ref): deployment-worthy → rejected" in result.output
    assert "verdicts: 2 of 2 flipped (1 from deployment-worthy to rejected)" in result.output


def test_compare_json_is_one_document_with_its_documented_fields(store, tmp_path):
    from pathlib import Path

    rng = np.random.default_rng(8)
    for run_id, outcome in (("A", "deployment-worthy"), ("B", "inconclusive")):
        latency_pair(store, run_id, 1.0, rng, rounds=2,
                     spec=with_verdict(latency_spec(["ref", "ort"], 200, 2), "latency_p50_ratio_ci_high"))
        add_verdict(store, run_id, outcome)
    result = CliRunner().invoke(main, ["compare", "A", "B", "--db", str(store.path), "--json",
                                                       "--reports", str(tmp_path / "reports"),
                                                       "--fail-on-regression", "1.1"])
    assert result.exit_code == 0  # worthy to inconclusive: flipped, but no evidence of worse
    document = json.loads(result.stdout)  # stdout holds the document and nothing else
    assert_documented(document, "compare")
    assert document["a"]["run_id"] == "A" and document["b"]["run_id"] == "B"
    assert document["totals"] == {"worse": 0, "better": 0, "unchanged": 2, "not_comparable": 4}
    assert document["verdicts"] == [{"verdict": "fast", "measurement": "lat", "candidate": "ort", "baseline": "ref",
                                     "a": "deployment-worthy", "b": "inconclusive", "flipped": True,
                                     "regressed": False}]
    assert {(r["subject"], r["metric"]) for r in document["rows"]} == {
        (s, m) for s in ("ort b=1", "ref b=1") for m in ("p50_ms", "p95_ms")} | {
        ("ort b=1 ÷ ref", m) for m in ("p50_ratio", "p95_ratio")}
    assert Path(document["report"]).is_file() and "wrote" in result.stderr
