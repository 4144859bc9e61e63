"""A kind defined only here, registered for a while, validates, runs, stores, reports and
compares with no edit anywhere in runner/: everything the runner asks of a kind is its Kind."""

from __future__ import annotations

import io
from dataclasses import replace
from typing import Literal

import numpy as np
from rich.console import Console

from runner.compare.rows import Row, samples_row
from runner.compare.runs import compare_runs
from runner.kinds.kind import Kind, nothing_to_compare
from runner.kinds.registry import KINDS, registered
from runner.report.run_report import build_run_report
from runner.report.section import Section
from runner.run.execute import run_spec
from runner.spec.document import load_spec
from runner.spec.fields import Name, StrictModel
from runner.store.database import Store


class CoinMeasurement(StrictModel):
    kind: Literal["coin"]
    name: Name
    flips: int = 10
    label: str = ""  # shown only: not a setting


def execute(m: CoinMeasurement, ctx) -> None:
    heads = np.random.default_rng(m.flips).integers(0, 2, m.flips)
    ctx.store.append_rows("coin_flips", [{"run_id": ctx.run_id, "measurement": m.name, "flip": i, "heads": int(h)}
                                         for i, h in enumerate(heads)])


def metrics(con, run_id: str, m: CoinMeasurement, candidate: str, baseline: str) -> dict[str, float]:
    return {"heads_fraction": con.execute("SELECT avg(heads) FROM coin_flips WHERE run_id = ? AND measurement = ?",
                                          [run_id, m.name]).fetchone()[0]}


def report(con, run_id: str, m: CoinMeasurement) -> list[Section]:
    return [Section(f"{m.name}: coin flips", html="<p>coin flips were stored</p>")]


def compare(con, a, b, m_a: dict, m_b: dict) -> list[Row]:
    values = [np.asarray([v for (v,) in con.execute("SELECT heads FROM coin_flips WHERE run_id = ?",
                                                    [side.run_id]).fetchall()], dtype=float) for side in (a, b)]
    return [samples_row(m_a["name"], "coin", "heads", *values, lower_is_better=False, machine_bound=False)]


def coin_kind(**declared) -> Kind:
    """Made when a test asks: making a Kind declares its tables, which only the registering test's
    databases may have. `declared` replaces what the kind declares (e.g. no comparer)."""
    return replace(Kind(name="coin", model=CoinMeasurement,
                migrations=[("9990_test_coin_flips",
                             "CREATE TABLE coin_flips "
                             "(run_id VARCHAR, measurement VARCHAR, flip INTEGER, heads INTEGER)")],
                views=[], execute=execute, participants=lambda m: ["coin"], metric_names=("heads_fraction",),
                metrics=metrics, report=report, needs_baseline=False, compare=compare,
                not_settings=frozenset({"label"})), **declared)


SPEC = """\
name: coin_question
measurements:
  - {kind: coin, name: flips, flips: 40, label: LABEL}
verdicts:
  - name: fair_enough
    measurement: flips
    candidate: coin
    deployment_worthy_when:
      heads_fraction: ">= 0.2"
"""


def test_a_kind_defined_in_a_test_validates_runs_stores_reports_and_compares(tmp_path, write_spec):
    store = Store(tmp_path / "r.duckdb")
    console = Console(file=io.StringIO())
    with registered(coin_kind()):
        run_ids = []
        for label in ("first", "second"):
            loaded = load_spec(write_spec(SPEC.replace("LABEL", label)))
            run_id, verdicts = run_spec(loaded, store, tmp_path / "reports", console, runs_dir=tmp_path / "runs")
            assert [v["outcome"] for v in verdicts] == ["deployment-worthy"]
            run_ids.append(run_id)
        with store.reader() as con:
            assert con.execute("SELECT count(*) FROM coin_flips").fetchone()[0] == 80
        page = build_run_report(store, tmp_path / "reports", run_id=run_ids[0]).read_text()
        assert "flips: coin flips" in page
        comparison = compare_runs(store, *run_ids)
        [row] = comparison.rows
        assert row.metric == "heads" and row.problem is None and row.value_a == row.value_b  # same seed, same flips
    assert "coin" not in KINDS


def test_a_kind_that_declares_no_comparer_is_listed_as_not_compared(tmp_path, write_spec):
    store = Store(tmp_path / "r.duckdb")
    console = Console(file=io.StringIO())
    with registered(coin_kind(compare=nothing_to_compare)):
        run_ids = [run_spec(load_spec(write_spec(SPEC.replace("LABEL", label))), store, tmp_path / "reports", console,
                            runs_dir=tmp_path / "runs")[0] for label in ("first", "second")]
        [row] = compare_runs(store, *run_ids).rows
    assert row.measurement == "flips" and "does not judge coin measurements" in row.problem  # never silently empty
