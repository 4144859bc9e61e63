"""`latency` (Days 24-26): inference latency per runtime and batch size, every sample stored.

Each runtime is loaded first (load time recorded in runtime_status, never timed here),
then each series is `warmup` untimed calls followed by timed calls of runtime.infer on
the same input, through breakout_core.diagnosis.latency.measure_latency (perf_counter_ns around each
call), through each runtime's timed_runs(): the browser runtime overrides it to time
session.run in the page with performance.now(), the way a page sees its latency, and its
series records that timer and its resolution. Each call's thread CPU time is kept beside its
wall time (none where a page times the call). With `rounds` > 1 the runtimes take turns, round
by round, in an order drawn for each round from `order_seed` (recorded as each sample's `turn`),
so a slow drift of the machine (another job starting) falls on all of them alike; each round has
its own warm-up. Fewer than 64 timed calls per round is refused when the spec is validated.

Verdicts judge a ratio by its interval over rounds (breakout_core.statistics.latency_rounds): a rule on a
ratio's point estimate is refused when the spec loads, and a rule on a tail's interval with too
few calls per round or too few rounds for it (min_calls_per_round, min_rounds) too.

`latency_samples` holds every sample; `latency_series` the timer, its resolution and the
settings; view `latency_summary` the P50/P90/P95/P99 (quantile_cont: linear interpolation,
numpy's default), mean, std, min, max, and the CPU time's; `latency_rounds` each round's;
`latency_pairs` the pooled ratios between runtimes.
"""

from __future__ import annotations

import contextlib
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from breakout_core.statistics.latency_rounds import (
    MIN_TIMED_CALLS,
    ORDER_SEED,
    min_calls_per_round,
    min_rounds,
    round_order,
)
from runner.kinds.kind import Kind
from runner.kinds.shared.latency_compare import compare_latency
from runner.kinds.shared.runtime_lifecycle import load_states, open_runtime
from runner.kinds.shared.runtime_metrics import LATENCY_METRIC_NAMES as METRIC_NAMES
from runner.kinds.shared.runtime_metrics import (
    latency_interval_needs,
    latency_pair_metrics,
    latency_rule_problem,
)
from runner.kinds.shared.runtime_status import runtime_sections, with_unavailable
from runner.kinds.shared.verdict_words import latency_words
from runner.report.section import Section
from runner.run.context import RunContext
from runner.spec.fields import Name
from runner.spec.runtimes import RuntimeMeasurement


class LatencyMeasurement(RuntimeMeasurement):
    kind: Literal["latency"]
    name: Name
    batch_sizes: list[int] = Field(default_factory=lambda: [1], min_length=1)
    warmup: int = Field(default=20, ge=0, le=100_000, description="untimed calls before each round's timed ones")
    iterations: int = Field(default=200, ge=MIN_TIMED_CALLS, le=1_000_000,
                            description="timed calls per runtime and batch size")
    rounds: int = Field(default=1, ge=1, le=1000, description="runtimes take turns this many times")
    order_seed: int = Field(default=ORDER_SEED, ge=0, description="seed of the runtimes' order in each round")
    fixed_states: Name | None = Field(default=None, description="artifact: inputs are its first states; "
                                      "None: a seeded random uint8 batch")
    verdict_batch_size: int | None = Field(default=None, description="batch size verdicts use; default: the first")

    @model_validator(mode="after")
    def _consistent(self) -> "LatencyMeasurement":
        if len(set(self.batch_sizes)) != len(self.batch_sizes) or any(b < 1 or b > 4096 for b in self.batch_sizes):
            raise ValueError("batch_sizes must be distinct, each 1..4096")
        if self.iterations % self.rounds:
            raise ValueError(f"iterations ({self.iterations}) must be a multiple of rounds ({self.rounds})")
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

    def metric_problem(self, metric: str) -> str | None:
        return latency_rule_problem(metric)


def spec_problems(m: LatencyMeasurement, spec, context: dict) -> list[tuple[tuple, str]]:
    """Rules that judge this measurement's interval of a statistic (its own verdicts', and those of a
    measurement that names it as its `latency:`) that its rounds cannot carry: each round needs
    min_calls_per_round calls of the statistic, the interval min_rounds rounds; and, rules or
    none, a round of fewer than MIN_TIMED_CALLS calls."""
    names = {other.name for other in spec.measurements
             if other.name == m.name or getattr(other, "latency", None) == m.name}
    per_round = m.iterations // m.rounds
    problems: list[tuple[tuple, str]] = []
    for verdict in spec.verdicts:
        if verdict.measurement not in names:
            continue
        for metric in verdict.deployment_worthy_when:
            statistic = latency_interval_needs(metric)
            if statistic is None:
                continue
            calls, rounds = min_calls_per_round(statistic), min_rounds(statistic)
            if per_round < calls:
                problems.append((("iterations",), f"verdict {verdict.name!r} judges {metric}: each round needs >= "
                                                  f"{calls} timed calls for its {statistic.upper()}, "
                                                  f"iterations / rounds = {per_round}"))
            elif m.rounds < rounds:
                problems.append((("rounds",), f"verdict {verdict.name!r} judges {metric}: its interval needs "
                                              f"rounds >= {rounds}, got {m.rounds}"))
    if per_round < MIN_TIMED_CALLS and not any(loc == ("iterations",) for loc, _ in problems):
        # said here, beside the rules' own needs, so that one pass names the largest
        problems.append((("iterations",), f"each round needs >= {MIN_TIMED_CALLS} timed calls: iterations / rounds = "
                                          f"{per_round}"))
    return problems


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
    ),
    (
        "0431_latency_cpu_time",
        """
        ALTER TABLE latency_samples ADD COLUMN cpu_ms DOUBLE;
        ALTER TABLE latency_samples ADD COLUMN turn INTEGER;
        ALTER TABLE latency_series ADD COLUMN order_seed INTEGER;
        """,
    ),
]

VIEWS = [
    """
    CREATE OR REPLACE VIEW latency_summary AS
    SELECT run_id, measurement, runtime, batch_size, count(*) AS n,
           quantile_cont(ms, 0.5) AS p50_ms, quantile_cont(ms, 0.9) AS p90_ms, quantile_cont(ms, 0.95) AS p95_ms,
           quantile_cont(ms, 0.99) AS p99_ms, avg(ms) AS mean_ms, stddev_samp(ms) AS std_ms,
           min(ms) AS min_ms, max(ms) AS max_ms, quantile_cont(cpu_ms, 0.5) AS cpu_p50_ms,
           quantile_cont(cpu_ms, 0.95) AS cpu_p95_ms, quantile_cont(cpu_ms, 0.99) AS cpu_p99_ms,
           avg(cpu_ms) AS cpu_mean_ms
    FROM latency_samples GROUP BY run_id, measurement, runtime, batch_size
    """,
    """
    CREATE OR REPLACE VIEW latency_rounds AS
    SELECT run_id, measurement, runtime, batch_size, round, min(turn) AS turn, count(*) AS n,
           quantile_cont(ms, 0.5) AS p50_ms, quantile_cont(ms, 0.95) AS p95_ms, quantile_cont(ms, 0.99) AS p99_ms,
           avg(ms) AS mean_ms, quantile_cont(cpu_ms, 0.5) AS cpu_p50_ms, quantile_cont(cpu_ms, 0.95) AS cpu_p95_ms,
           quantile_cont(cpu_ms, 0.99) AS cpu_p99_ms, avg(cpu_ms) AS cpu_mean_ms
    FROM latency_samples GROUP BY run_id, measurement, runtime, batch_size, round
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
        cpu: dict[tuple[str, int], list[np.ndarray]] = {key: [] for key in samples}
        turns: dict[tuple[str, int], list[int]] = {key: [] for key in samples}
        last = {}
        for r in range(m.rounds):
            for turn, name in enumerate(round_order(list(loaded), m.order_seed, r)):
                for b in m.batch_sizes:
                    result = loaded[name].timed_runs(batches[b], m.warmup, per_round)
                    samples[(name, b)].append(result.samples_ms)
                    cpu[(name, b)].append(np.full(per_round, np.nan) if result.cpu_ms is None else result.cpu_ms)
                    turns[(name, b)].append(turn)
                    last[(name, b)] = result
                    ctx.progress.advance(task)
    for (name, b), parts in samples.items():
        ms, cpu_ms = np.concatenate(parts), np.concatenate(cpu[(name, b)])
        rounds = np.repeat(np.arange(m.rounds), per_round)
        ctx.store.append_arrow("latency_samples", pa.table({
            "run_id": [ctx.run_id] * len(ms), "measurement": [m.name] * len(ms), "runtime": [name] * len(ms),
            "batch_size": np.full(len(ms), b, dtype=np.int32), "round": rounds.astype(np.int32),
            "sample": np.arange(len(ms), dtype=np.int32), "ms": ms,
            "cpu_ms": pa.array(cpu_ms, mask=np.isnan(cpu_ms)),
            "turn": np.repeat(np.asarray(turns[(name, b)], dtype=np.int32), per_round)}))
        r = last[(name, b)]
        ctx.store.append_rows("latency_series", [{
            "run_id": ctx.run_id, "measurement": m.name, "runtime": name, "batch_size": b, "warmup": m.warmup,
            "iterations": m.iterations, "rounds": m.rounds, "timer": r.timer,
            "timer_resolution_s": r.timer_resolution_s,
            "timer_implementation": r.timer_implementation, "percentile_method": r.percentile_method,
            "input": input_text, "order_seed": m.order_seed}])




def metrics(con, run_id: str, m: LatencyMeasurement, candidate: str, baseline: str) -> dict:
    found = latency_pair_metrics(con, run_id, m.name, candidate, baseline, m.decisive_batch_size)
    return with_unavailable(found, con, run_id, [m.name], [candidate, baseline])


def report(con, run_id: str, m: LatencyMeasurement) -> list[Section]:
    from runner.report.charts import log_histogram, ratio_dots
    from runner.report.html import MAX_CHART_POINTS, altair, blank_nulls, table_html

    alt = altair()
    sections = runtime_sections(con, run_id, m.name)
    summary = con.execute("SELECT runtime, batch_size, n, p50_ms, p90_ms, p95_ms, p99_ms, mean_ms, std_ms, min_ms, "
                          "max_ms, cpu_p50_ms, cpu_p95_ms, cpu_p99_ms, cpu_mean_ms FROM latency_summary "
                          "WHERE run_id = ? AND measurement = ? "
                          "ORDER BY batch_size, runtime",
                          [run_id, m.name]).df()
    series = con.execute("SELECT DISTINCT timer, timer_resolution_s, timer_implementation, percentile_method, warmup, "
                         "iterations, rounds, order_seed, input FROM latency_series "
                         "WHERE run_id = ? AND measurement = ?",
                         [run_id, m.name]).df()
    if summary.empty:
        sections.append(Section(f"{m.name}: latency", html="<p>No runtime could run here.</p>"))
        return sections
    sections.append(Section(f"{m.name}: latency per call (ms, wall time and cpu_: the calling thread's CPU time; "
                            "warm-up and model load excluded)",
                            html=table_html(blank_nulls(summary), float_format="{:.4f}")
                            + table_html(series, float_format="{:.3g}")))
    pairs = _ratio_table(con, run_id, m)
    if not pairs.empty:
        dots = pairs.copy()
        dots["pair"] = dots["candidate"] + " b=" + dots["batch_size"].astype(str)
        dots["statistic"] = dots["clock"] + " " + dots["statistic"]
        chart = ratio_dots(dots, subject="pair", statistic="statistic", ratio="ratio",
                           title=f"candidate ÷ {m.baseline_runtime} (log scale; < 1: faster, dashed: same)")
        sections.append(Section(f"{m.name}: ratios to {m.baseline_runtime} over {m.rounds} rounds (< 1: faster; "
                                "wall time and the calling thread's CPU time)",
                                html="<p>Each ratio is the geometric mean of the per-round ratios (candidate over "
                                     "baseline in the same round); its 95% interval is Student's t over the rounds, "
                                     "and it is what a verdict judges. A tail's interval needs enough calls per "
                                     "round.</p>" + table_html(blank_nulls(pairs), float_format="{:.4f}"),
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
    metric_problem=LatencyMeasurement.metric_problem,
    spec_problems=spec_problems,
    compare=compare_latency,
    not_settings=frozenset({"runtimes", "baseline", "batch_sizes", "verdict_batch_size"}),
    in_words=latency_words,
)


def _ratio_table(con, run_id: str, m: LatencyMeasurement):
    """Each candidate's ratios to the baseline, per batch size, clock and statistic, with their
    intervals over rounds (as verdicts read them)."""
    import pandas as pd

    from runner.kinds.shared.runtime_metrics import CLOCK_PREFIXES

    rows = []
    for b in m.batch_sizes:
        for candidate in m.ordered_runtimes()[1:]:
            found = latency_pair_metrics(con, run_id, m.name, candidate, m.baseline_runtime, b)
            for clock, prefix in CLOCK_PREFIXES.items():
                for statistic in ("p50", "p95", "p99", "mean"):
                    name = f"{prefix}_{statistic}_ratio"
                    if name in found:
                        rows.append({"candidate": candidate, "batch_size": b, "clock": clock, "statistic": statistic,
                                     "ratio": found[name], "ci_low": found.get(f"{name}_ci_low"),
                                     "ci_high": found.get(f"{name}_ci_high"),
                                     "rounds": int(found.get("latency_rounds", 0))})
    return pd.DataFrame(rows)
