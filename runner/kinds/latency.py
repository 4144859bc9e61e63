"""`latency` (Days 24-26): inference latency per runtime and batch size, every sample stored.

Each runtime is loaded first (load time recorded in runtime_status, never timed here),
then each series is `warmup` untimed calls followed by timed calls of runtime.infer on
the same input, through breakout_core.latency.measure_latency (perf_counter_ns around each
call), through each runtime's timed_runs(): the browser runtime overrides it to time
session.run in the page with performance.now(), the way a page sees its latency, and its
series records that timer and its resolution. With `rounds` > 1 the runtimes take turns, round by round,
so a slow drift of the machine (another job starting) falls on all of them alike; each round has its own warm-up.
Fewer than 64 timed calls per series is refused when the spec is validated.

`latency_samples` holds every sample; `latency_series` the timer, its resolution and the
settings; view `latency_summary` the P50/P90/P95/P99 (quantile_cont: linear interpolation,
numpy's default), mean, std, min, max; `latency_pairs` their ratios between runtimes.
"""

from __future__ import annotations

import contextlib
import re
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from runner.compare.rows import (
    Row,
    RunSide,
    differences,
    percentile,
    quantile_row,
    runtime_problem,
    samples_row,
    unavailable_rows,
)
from runner.kinds.kind import Kind
from runner.kinds.shared.runtime_lifecycle import load_states, open_runtime
from runner.kinds.shared.runtime_metrics import LATENCY_METRIC_NAMES as METRIC_NAMES
from runner.kinds.shared.runtime_metrics import latency_pair_metrics
from runner.kinds.shared.runtime_status import runtime_sections, with_unavailable
from runner.report.section import Section
from runner.run.context import RunContext
from runner.spec.fields import Name
from runner.spec.runtimes import RuntimeMeasurement

MIN_SAMPLES = 64  # breakout_core.latency.MIN_TIMED_CALLS; a tail percentile from fewer means nothing


class LatencyMeasurement(RuntimeMeasurement):
    kind: Literal["latency"]
    name: Name
    batch_sizes: list[int] = Field(default_factory=lambda: [1], min_length=1)
    warmup: int = Field(default=20, ge=0, le=100_000, description="untimed calls before each round's timed ones")
    iterations: int = Field(default=200, ge=MIN_SAMPLES, le=1_000_000,
                            description="timed calls per runtime and batch size")
    rounds: int = Field(default=1, ge=1, le=1000, description="runtimes take turns this many times")
    fixed_states: Name | None = Field(default=None, description="artifact: inputs are its first states; "
                                      "None: a seeded random uint8 batch")
    verdict_batch_size: int | None = Field(default=None, description="batch size verdicts use; default: the first")

    @model_validator(mode="after")
    def _consistent(self) -> "LatencyMeasurement":
        if len(set(self.batch_sizes)) != len(self.batch_sizes) or any(b < 1 or b > 4096 for b in self.batch_sizes):
            raise ValueError("batch_sizes must be distinct, each 1..4096")
        if self.iterations % self.rounds:
            raise ValueError(f"iterations ({self.iterations}) must be a multiple of rounds ({self.rounds})")
        if self.iterations // self.rounds < MIN_SAMPLES:
            raise ValueError(f"each round needs >= {MIN_SAMPLES} timed calls: iterations / rounds = "
                             f"{self.iterations // self.rounds}")
        if self.verdict_batch_size is not None and self.verdict_batch_size not in self.batch_sizes:
            raise ValueError(f"verdict_batch_size {self.verdict_batch_size} is not one of batch_sizes")
        return self

    @property
    def decisive_batch_size(self) -> int:
        return self.verdict_batch_size or self.batch_sizes[0]

    def references(self):
        refs = super().references()
        if self.fixed_states is not None:
            refs.append((("fixed_states",), "artifact:fixed_states", self.fixed_states))
        return refs


MIGRATIONS = [
    (
        "0430_latency",
        """
        CREATE TABLE latency_samples (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, runtime VARCHAR NOT NULL,
            batch_size INTEGER NOT NULL, round INTEGER NOT NULL, sample INTEGER NOT NULL, ms DOUBLE NOT NULL
        );
        CREATE TABLE latency_series (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, runtime VARCHAR NOT NULL,
            batch_size INTEGER NOT NULL, warmup INTEGER NOT NULL, iterations INTEGER NOT NULL, rounds INTEGER NOT NULL,
            timer VARCHAR NOT NULL, timer_resolution_s DOUBLE NOT NULL, timer_implementation VARCHAR NOT NULL,
            percentile_method VARCHAR NOT NULL, input VARCHAR NOT NULL
        );
        """,
    )
]

VIEWS = [
    """
    CREATE OR REPLACE VIEW latency_summary AS
    SELECT run_id, measurement, runtime, batch_size, count(*) AS n,
           quantile_cont(ms, 0.5) AS p50_ms, quantile_cont(ms, 0.9) AS p90_ms, quantile_cont(ms, 0.95) AS p95_ms,
           quantile_cont(ms, 0.99) AS p99_ms, avg(ms) AS mean_ms, stddev_samp(ms) AS std_ms,
           min(ms) AS min_ms, max(ms) AS max_ms
    FROM latency_samples GROUP BY run_id, measurement, runtime, batch_size
    """,
    """
    CREATE OR REPLACE VIEW latency_pairs AS
    SELECT c.run_id, c.measurement, c.runtime AS candidate, b.runtime AS baseline, c.batch_size,
           c.p50_ms / b.p50_ms AS p50_ratio, c.p95_ms / b.p95_ms AS p95_ratio, c.p99_ms / b.p99_ms AS p99_ratio,
           c.mean_ms / b.mean_ms AS mean_ratio
    FROM latency_summary c JOIN latency_summary b
      ON b.run_id = c.run_id AND b.measurement = c.measurement AND b.batch_size = c.batch_size
     AND b.runtime <> c.runtime
    """,
]



def _inputs(m: LatencyMeasurement, ctx: RunContext) -> tuple[dict[int, np.ndarray], str]:
    if m.fixed_states is not None:
        states, path, sha = load_states(ctx, m.fixed_states)
        pool, what = states.obs, f"fixed states {path} (sha256 {sha[:12]})"
    else:
        pool = np.random.default_rng(0).integers(0, 256, size=(max(m.batch_sizes), 4, 84, 84), dtype=np.uint8)
        what = "seeded random uint8 (numpy default_rng(0))"
    batches = {}
    for b in m.batch_sizes:
        idx = np.arange(b) % len(pool)  # more states than the file holds: cycle through them
        batches[b] = np.ascontiguousarray(pool[idx])
    return batches, f"{what}, first b states"


def execute(m: LatencyMeasurement, ctx: RunContext) -> None:
    import pyarrow as pa

    if ctx.already_stored("latency_series", m.name):
        return
    batches, input_text = _inputs(m, ctx)
    per_round = m.iterations // m.rounds
    with contextlib.ExitStack() as stack:
        loaded = {}
        for name in m.ordered_runtimes():  # load everything first: loading is never timed
            runtime = stack.enter_context(open_runtime(ctx, m.name, name))
            if runtime is not None:
                loaded[name] = runtime
        task = ctx.progress.add_task(f"{m.name} · latency", total=len(loaded) * len(m.batch_sizes) * m.rounds,
                                     unit="series")
        samples: dict[tuple[str, int], list[np.ndarray]] = {(n, b): [] for n in loaded for b in m.batch_sizes}
        last = {}
        for _ in range(m.rounds):
            for name, runtime in loaded.items():
                for b in m.batch_sizes:
                    result = runtime.timed_runs(batches[b], m.warmup, per_round)
                    samples[(name, b)].append(result.samples_ms)
                    last[(name, b)] = result
                    ctx.progress.advance(task)
    for (name, b), parts in samples.items():
        ms = np.concatenate(parts)
        rounds = np.repeat(np.arange(m.rounds), per_round)
        ctx.store.append_arrow("latency_samples", pa.table({
            "run_id": [ctx.run_id] * len(ms), "measurement": [m.name] * len(ms), "runtime": [name] * len(ms),
            "batch_size": np.full(len(ms), b, dtype=np.int32), "round": rounds.astype(np.int32),
            "sample": np.arange(len(ms), dtype=np.int32), "ms": ms}))
        r = last[(name, b)]
        ctx.store.append_rows("latency_series", [{
            "run_id": ctx.run_id, "measurement": m.name, "runtime": name, "batch_size": b, "warmup": m.warmup,
            "iterations": m.iterations, "rounds": m.rounds, "timer": r.timer,
            "timer_resolution_s": r.timer_resolution_s,
            "timer_implementation": r.timer_implementation, "percentile_method": r.percentile_method,
            "input": input_text}])




def metrics(con, run_id: str, m: LatencyMeasurement, candidate: str, baseline: str) -> dict:
    found = latency_pair_metrics(con, run_id, m.name, candidate, baseline, m.decisive_batch_size)
    return with_unavailable(found, con, run_id, [m.name], [candidate, baseline])


def report(con, run_id: str, m: LatencyMeasurement) -> list[Section]:
    from runner.report.charts import log_histogram, ratio_dots
    from runner.report.html import MAX_CHART_POINTS, altair, table_html

    alt = altair()
    sections = runtime_sections(con, run_id, m.name)
    summary = con.execute("SELECT runtime, batch_size, n, p50_ms, p90_ms, p95_ms, p99_ms, mean_ms, std_ms, min_ms, "
                          "max_ms FROM latency_summary WHERE run_id = ? AND measurement = ? "
                          "ORDER BY batch_size, runtime",
                          [run_id, m.name]).df()
    series = con.execute("SELECT DISTINCT timer, timer_resolution_s, timer_implementation, percentile_method, warmup, "
                         "iterations, rounds, input FROM latency_series WHERE run_id = ? AND measurement = ?",
                         [run_id, m.name]).df()
    if summary.empty:
        sections.append(Section(f"{m.name}: latency", html="<p>No runtime could run here.</p>"))
        return sections
    sections.append(Section(f"{m.name}: latency per call (ms; warm-up and model load excluded)",
                            html=table_html(summary, float_format="{:.4f}")
                            + table_html(series, float_format="{:.3g}")))
    pairs = con.execute("SELECT candidate, baseline, batch_size, p50_ratio, p95_ratio, p99_ratio, mean_ratio "
                        "FROM latency_pairs WHERE run_id = ? AND measurement = ? AND baseline = ? "
                        "ORDER BY batch_size, candidate",
                        [run_id, m.name, m.baseline_runtime]).df()
    if not pairs.empty:
        dots = pairs.melt(id_vars=["candidate", "batch_size"], value_vars=["p50_ratio", "p95_ratio", "p99_ratio",
                                                                          "mean_ratio"], var_name="statistic",
                          value_name="ratio")
        dots["pair"] = dots["candidate"] + " b=" + dots["batch_size"].astype(str)
        dots["statistic"] = dots["statistic"].str.removesuffix("_ratio")
        chart = ratio_dots(dots, subject="pair", statistic="statistic", ratio="ratio",
                           title=f"candidate ÷ {m.baseline_runtime} (log scale; < 1: faster, dashed: same)")
        sections.append(Section(f"{m.name}: ratios to {m.baseline_runtime} (< 1: faster)", html=table_html(pairs),
                                charts=[chart]))
    samples = con.execute("SELECT runtime, batch_size, round, sample, ms FROM latency_samples WHERE run_id = ? "
                          "AND measurement = ? ORDER BY runtime, batch_size, sample LIMIT ?",
                          [run_id, m.name, MAX_CHART_POINTS]).df()
    samples["series"] = samples["runtime"] + " b=" + samples["batch_size"].astype(str)
    summary["series"] = summary["runtime"] + " b=" + summary["batch_size"].astype(str)
    x = alt.X("ms:Q", scale=alt.Scale(type="log"), title="ms per call (log scale)")
    strip = alt.Chart(samples).mark_tick(opacity=0.35, thickness=1).encode(
        x=x, y=alt.Y("series:N", title=None), tooltip=["runtime", "batch_size", "round", "sample", "ms"])
    p50 = alt.Chart(summary).mark_tick(color="black", thickness=3, size=22).encode(
        x="p50_ms:Q", y="series:N", tooltip=["series", "p50_ms"])
    p95 = alt.Chart(summary).mark_tick(color="red", thickness=3, size=22).encode(
        x="p95_ms:Q", y="series:N", tooltip=["series", "p95_ms"])
    sections.append(Section(f"{m.name}: every sample (ticks), P50 in black, P95 in red; and the distribution",
                            charts=[(strip + p50 + p95).properties(width=640).to_dict(), log_histogram(samples)]))
    return sections


# -- runner compare ---------------------------------------------------------------------------

def compare_latency(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    name = m_a["name"]
    samples, series = {}, {}
    for label, side in (("A", a), ("B", b)):
        for runtime, batch, ms in con.execute(
                "SELECT runtime, batch_size, list(ms ORDER BY sample) FROM latency_samples WHERE run_id = ? "
                "AND measurement = ? GROUP BY ALL", [side.run_id, name]).fetchall():
            samples[(label, runtime, batch)] = np.asarray(ms, dtype=np.float64)
        cursor = con.execute("SELECT * EXCLUDE (run_id, measurement) FROM latency_series WHERE run_id = ? "
                             "AND measurement = ?", [side.run_id, name])
        columns = [d[0] for d in cursor.description]
        for values in cursor.fetchall():
            settings = dict(zip(columns, values))
            settings["input"] = _by_content(settings["input"])
            series[(label, settings.pop("runtime"), settings.pop("batch_size"))] = settings
    statistics = judged_statistics(a.asked)
    rows = []
    for runtime, batch in sorted({(r, n) for _, r, n in samples}):
        subject = f"{runtime} b={batch}"
        sa, sb = samples.get(("A", runtime, batch)), samples.get(("B", runtime, batch))
        if sa is None or sb is None:
            problem = (runtime_problem(con, a, b, name, [runtime])
                       or f"measured only in run {'A' if sb is None else 'B'}")
            rows += [Row(name, subject, metric, _statistic(sa, metric), _statistic(sb, metric), True, "", None,
                         machine_bound=True, problem=problem) for metric in statistics]
            continue
        settings = differences(series.get(("A", runtime, batch)), series.get(("B", runtime, batch)),
                                {"timer_resolution_s"})
        problem = (f"series settings differ: {'; '.join(settings)}" if settings
                   else runtime_problem(con, a, b, name, [runtime]))
        for metric in statistics:
            row = _statistic_row(name, subject, metric, sa, sb)
            row.problem = problem
            rows.append(row)
    return rows + unavailable_rows(con, a, b, name, "p50_ms", {r for _, r, _ in samples})


# the latency statistics compare can judge, by row metric: a percentile, or None for the mean
STATISTICS = {"p50_ms": 50, "p95_ms": 95, "p99_ms": 99, "mean_ms": None}
ALWAYS_JUDGED = ("p50_ms", "p95_ms")


def judged_statistics(asked: frozenset[str]) -> list[str]:
    """P50 and P95 always; P99 and the mean where a verdict or the user names them (as a verdict
    metric, `latency_p99_ratio`, or as a row metric, `p99_ms`)."""
    pattern = r"(?:latency_)?(p\d\d|mean)_(?:ms|ratio)"
    named = {f"{m.group(1)}_ms" for name in asked if (m := re.fullmatch(pattern, name))}
    return [metric for metric in STATISTICS if metric in ALWAYS_JUDGED or metric in named]


def _statistic(values: np.ndarray | None, metric: str) -> float | None:
    if values is None:
        return None
    q = STATISTICS[metric]
    return float(np.mean(values)) if q is None else percentile(values, q)


def _statistic_row(name: str, subject: str, metric: str, sa: np.ndarray, sb: np.ndarray) -> Row:
    """P50 by asv's rank test on the whole samples; a tail percentile by a bootstrap of its own
    difference; the mean by Welch's t."""
    from breakout_core.stats import sample_shift

    q = STATISTICS[metric]
    if q == 50:
        shift = sample_shift(sa, sb)
        return Row(name, subject, metric, percentile(sa, 50), percentile(sb, 50), True, shift.method,
                   shift.significant, machine_bound=True)
    if q is None:
        return samples_row(name, subject, metric, sa, sb, lower_is_better=True, machine_bound=True)
    return quantile_row(name, subject, metric, sa, sb, q, machine_bound=True)

def _by_content(input_text: str) -> str:
    """A latency input as recorded ("fixed states PATH (sha256 ...), ...") without its path: the same
    states read from another folder are the same input."""
    return re.sub(r"^fixed states .*? \(sha256", "fixed states (sha256", input_text)


KIND = Kind(
    name="latency",
    model=LatencyMeasurement,
    migrations=MIGRATIONS,
    views=VIEWS,
    execute=execute,
    participants=lambda m: list(m.runtimes),
    metric_names=METRIC_NAMES,
    metrics=metrics,
    report=report,
    references=LatencyMeasurement.references,
    compare=compare_latency,
    not_settings=frozenset({"runtimes", "baseline", "batch_sizes", "verdict_batch_size"}),
)
