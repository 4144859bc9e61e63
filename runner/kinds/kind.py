"""What a measurement kind provides to the generic runner: the `Kind` contract.

A kind is one module (or one subpackage) under runner/kinds/ that builds one `Kind`, and one
line in runner/kinds/registry.py. The Kind declares everything the rest of the runner asks
of it: the spec model of its measurements, the tables and views it owns (its part of the
schema, registered with runner.store.schema when the Kind is made), how it executes, which
names a verdict may use, its metrics, its report sections, how `runner compare` reads its
rows, and which of its fields are not settings. Tables several kinds write belong to one
module of runner/kinds/shared/. The optional hooks have defaults here, so the generic code
calls them on every kind alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    import duckdb

    from runner.compare.rows import Row, RunSide
    from runner.report.section import Section
    from runner.run.context import RunContext
    from runner.store.database import Store

References = list[tuple[tuple, str, str]]  # (location in the measurement, what is named, the name)
SeedLists = list[tuple[tuple, list[int]]]  # (location in the measurement, episode seeds)
Problems = list[tuple[tuple, str]]  # (location in the measurement, message)
# con, run A, run B, measurement A's and B's settings as stored -> one compare row per metric
Comparer = Callable[["duckdb.DuckDBPyConnection", "RunSide", "RunSide", dict, dict], list["Row"]]


def no_references(measurement: Any) -> References:
    return []


def no_outputs(measurement: Any) -> list[str]:
    return []


def no_seeds(measurement: Any) -> SeedLists:
    return []


def no_spec_problems(measurement: Any, spec: Any, context: dict) -> Problems:
    return []


def no_metric_problem(measurement: Any, metric: str) -> str | None:
    return None


def no_resume_problem(measurement: Any, store: "Store", run_id: str) -> str | None:
    return None


def no_words(found: dict, ruled: set[str]) -> str | None:
    return None


def nothing_to_compare(con: "duckdb.DuckDBPyConnection", a: "RunSide", b: "RunSide", m_a: dict, m_b: dict
                       ) -> list["Row"]:
    return []


@dataclass(frozen=True)
class Kind:
    name: str
    model: type
    migrations: list[tuple[str, str]]  # the tables this kind owns: (globally unique, ordered name, SQL)
    views: list[str]  # CREATE OR REPLACE VIEW statements over its tables (and shared ones)
    execute: Callable[[Any, "RunContext"], None]
    participants: Callable[[Any], list[str]]  # names a verdict may use as candidate/baseline
    metric_names: tuple[str, ...]
    # con, run_id, measurement, candidate, baseline -> metric values
    metrics: Callable[["duckdb.DuckDBPyConnection", str, Any, str, str], dict[str, float]]
    report: Callable[["duckdb.DuckDBPyConnection", str, Any], list["Section"]]
    compare: Comparer = nothing_to_compare  # how `runner compare` judges two runs' rows of a measurement
    # a verdict's metrics and the names its rules judge -> what they show, in a user's words (or None)
    in_words: Callable[[dict, set[str]], str | None] = no_words
    # fields of its measurements that are not settings: a difference in them does not make
    # two runs not comparable (a GIF's seed, a progress batch)
    not_settings: frozenset[str] = frozenset()
    needs_baseline: bool = True  # False: a verdict may judge one participant alone (a health check)
    comparison_metrics: tuple[str, ...] = ()  # metrics that need a baseline even where the kind does not
    # hooks the spec's cross-checks call (runner.spec.deploy_checks):
    references: Callable[[Any], References] = no_references  # runtimes, artifacts, measurements it names
    outputs: Callable[[Any], list[str]] = no_outputs  # artifacts it writes
    metric_problem: Callable[[Any, str], str | None] = no_metric_problem  # why a verdict may not use a metric here
    # the one way a kind takes part in the held-out check: `episode_seeds`, every seeded game it
    # plays or captures states from (each field that names seeds, wherever it lies in the
    # model); `held_out_seeds`, seeds no game of the spec may be (calibration games). An
    # overlap, or a held-out seed some fixed-states file was captured from, is refused at the
    # held-out field (its list entry)
    episode_seeds: Callable[[Any], SeedLists] = no_seeds
    held_out_seeds: Callable[[Any], SeedLists] = no_seeds
    # problems only the whole spec shows (the backends of the runtimes it names, node names
    # in a file): (location in the measurement, message) each;
    # `context` is the validation's (check_files: False means files are not read)
    spec_problems: Callable[[Any, Any, dict], Problems] = no_spec_problems
    # why `runner run --resume` may not go on with what the run stored for it (asked of every
    # measurement before any of them resumes)
    resume_problem: Callable[[Any, "Store", str], str | None] = no_resume_problem

    def __post_init__(self) -> None:
        from runner.store import schema

        schema.declare(f"kind {self.name}", self.migrations, self.views)
