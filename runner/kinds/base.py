"""What a measurement kind provides to the generic runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import duckdb
    from rich.progress import Progress

    from breakout_core.contract import Contract
    from runner.store import Store


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


@dataclass
class Section:
    """One part of a report page: a title, optional HTML and Vega-Lite chart specs."""

    title: str
    html: str = ""
    charts: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class Kind:
    name: str
    model: type
    migrations: list[tuple[str, str]]  # (ordered unique name, SQL)
    views: list[str]  # CREATE OR REPLACE VIEW statements
    execute: Callable[[Any, RunContext], None]
    participants: Callable[[Any], list[str]]  # names a verdict may use as candidate/baseline
    metric_names: tuple[str, ...]
    metrics: Callable[["duckdb.DuckDBPyConnection", str, Any, str, str], dict[str, float]]  # con, run_id, measurement, candidate, baseline
    report: Callable[["duckdb.DuckDBPyConnection", str, Any], list[Section]]
    needs_baseline: bool = True  # False: a verdict may judge one participant alone (a health check)
    comparison_metrics: tuple[str, ...] = ()  # metrics that need a baseline even where the kind does not
