"""What a measurement kind provides to the generic runner: the `Kind` contract.

A kind is one module under runner/kinds/ that builds one `Kind` and one line in
runner/kinds/__init__.py. It declares the tables and views it owns (its part of the
schema, registered with runner.schema when the Kind is made); tables several kinds write
belong to one shared module (runner.episode_scores, runner.runtime_status). The optional
hooks have defaults here, so the generic code calls them on every kind alike.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import duckdb
    from rich.progress import Progress

    from breakout_core.contract import Contract
    from runner.pair_executors import Executor
    from runner.store import Store

References = list[tuple[tuple, str, str]]  # (location in the measurement, what is named, the name)


@dataclass
class RunContext:
    """Everything a kind's execute() needs; it writes through `store`, never holding it open."""

    run_id: str
    spec: Any  # runner.spec.Spec
    contract: "Contract"
    store: "Store"
    reports_dir: Path
    progress: "Progress"
    artifacts_dir: Path  # runs/<run_id>: checkpoints and other files a run makes
    resume: bool = False  # continuing an unfinished run: kinds skip or go on with finished work
    executor: "Executor | None" = None  # where training pairs run; None: in this process

    def already_stored(self, table: str, measurement: str, **columns: Any) -> bool:
        """On --resume: whether `table` holds rows of this run's `measurement` where each of
        `columns` equals its value (the work they come from is done); always False otherwise."""
        if not self.resume:
            return False
        where = "".join(f" AND {column} = ?" for column in columns)
        with self.store.reader() as con:
            return con.execute(f"SELECT count(*) > 0 FROM {table} WHERE run_id = ? AND measurement = ?{where}",
                               [self.run_id, measurement, *columns.values()]).fetchone()[0]


@dataclass
class Section:
    """One part of a report page: a title, optional HTML and Vega-Lite chart specs."""

    title: str
    html: str = ""
    charts: list[dict] = field(default_factory=list)


def no_references(measurement: Any) -> References:
    return []


def no_outputs(measurement: Any) -> list[str]:
    return []


def no_metric_problem(measurement: Any, metric: str) -> str | None:
    return None


def no_resume_problem(measurement: Any, store: "Store", run_id: str) -> str | None:
    return None


@dataclass(frozen=True)
class Kind:
    name: str
    model: type
    migrations: list[tuple[str, str]]  # the tables this kind owns: (globally unique, ordered name, SQL)
    views: list[str]  # CREATE OR REPLACE VIEW statements over its tables (and shared ones)
    execute: Callable[[Any, RunContext], None]
    participants: Callable[[Any], list[str]]  # names a verdict may use as candidate/baseline
    metric_names: tuple[str, ...]
    metrics: Callable[["duckdb.DuckDBPyConnection", str, Any, str, str], dict[str, float]]  # con, run_id, measurement, candidate, baseline
    report: Callable[["duckdb.DuckDBPyConnection", str, Any], list[Section]]
    needs_baseline: bool = True  # False: a verdict may judge one participant alone (a health check)
    comparison_metrics: tuple[str, ...] = ()  # metrics that need a baseline even where the kind does not
    # hooks the spec's cross-checks call (runner.deploy_checks):
    references: Callable[[Any], References] = no_references  # runtimes, artifacts, measurements it names
    outputs: Callable[[Any], list[str]] = no_outputs  # artifacts it writes
    metric_problem: Callable[[Any, str], str | None] = no_metric_problem  # why a verdict may not use a metric here
    # why `runner run --resume` may not go on with what the run stored for it (asked of every
    # measurement before any of them resumes)
    resume_problem: Callable[[Any, "Store", str], str | None] = no_resume_problem

    def __post_init__(self) -> None:
        from runner import schema

        schema.declare(f"kind {self.name}", self.migrations, self.views)
