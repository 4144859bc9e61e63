"""`runner compare` of two runs' latency measurements, on their rounds.

A run's calls are not independent samples: a shared machine's load changes over seconds, and a
test over calls (a rank test, a bootstrap of calls) took two unchanged runs for different most
of the time. Nor are two runs' absolute times: taken minutes apart, they carry whatever else
the machine did then, which neither run measures (the same file, timed in consecutive windows
under a load that rose from 1 to 11, was "significantly" slower or faster at P95 in over half
of them). What two runs can judge is each runtime against the measurement's baseline in the
same round, where the load falls on both alike: each round's ratio of a statistic (P50, P95,
P99 or mean of the round's calls, on each clock: wall time, and `cpu_`, the calling thread's
CPU time), run B's ratios against run A's by the ratio of their geometric means and Welch's t
interval on their logarithms (breakout_core.statistics.latency_rounds.run_ratio). A row is significant
when the interval leaves out 1, worse or better beyond a factor only when the whole interval
lies beyond it. Each runtime's absolute statistics are shown beside them, not judged; a run of
one round, or a tail from too few calls per round, cannot be judged and says why.
"""

from __future__ import annotations

import re

import numpy as np

from breakout_core.statistics.latency_rounds import MIN_ROUNDS, min_calls_per_round, run_ratio
from runner.compare.rows import Row, RunSide, differences, runtime_problem, unavailable_rows
from runner.kinds.shared.runtime_metrics import round_statistics

# row metric: (clock, round statistic); each also as `..._ratio`, to the baseline in the same round
STATISTICS = {f"{prefix}{s}": (clock, s) for clock, prefix in (("wall", ""), ("cpu", "cpu_"))
              for s in ("p50", "p95", "p99", "mean")}
ALWAYS_JUDGED = ("p50", "p95")
NOT_JUDGED = ("absolute times of two runs taken at different times carry the machine's load, which neither run "
              "measures: judged as the ratio to {baseline} in the same round")


def judged_statistics(asked: frozenset[str]) -> list[str]:
    """P50 and P95 on both clocks always; P99 and the mean where a verdict or the user names them
    (as a verdict metric, `latency_p99_ratio_ci_high`, or as a row metric, `p99_ms`, `p99_ratio`)."""
    pattern = r"(?:latency_|cpu_time_|cpu_)?(p\d\d|mean)_(?:ms|ratio)(?:_ci_(?:low|high))?"
    named = {m.group(1) for name in asked if (m := re.fullmatch(pattern, name))}
    return [metric for metric, (_, s) in STATISTICS.items() if s in ALWAYS_JUDGED or s in named]


def compare_latency(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    name = m_a["name"]
    baseline = m_a.get("baseline") or m_a["runtimes"][0]
    rounds, series = {}, {}
    for label, side in (("A", a), ("B", b)):
        for runtime, batch in con.execute("SELECT DISTINCT runtime, batch_size FROM latency_samples WHERE run_id = ? "
                                          "AND measurement = ?", [side.run_id, name]).fetchall():
            rounds[(label, runtime, batch)] = round_statistics(con, side.run_id, name, runtime, batch)
        cursor = con.execute("SELECT * EXCLUDE (run_id, measurement) FROM latency_series WHERE run_id = ? "
                             "AND measurement = ?", [side.run_id, name])
        columns = [d[0] for d in cursor.description]
        for values in cursor.fetchall():
            settings = dict(zip(columns, values))
            settings["input"] = _by_content(settings["input"])
            series[(label, settings.pop("runtime"), settings.pop("batch_size"))] = settings
    statistics = judged_statistics(a.asked)
    rows = []
    for runtime, batch in sorted({(r, n) for _, r, n in rounds}):
        subject = f"{runtime} b={batch}"
        ra, rb = rounds.get(("A", runtime, batch)), rounds.get(("B", runtime, batch))
        if ra is None or rb is None:
            problem = (runtime_problem(con, a, b, name, [runtime])
                       or f"measured only in run {'A' if rb is None else 'B'}")
            rows += [Row(name, subject, f"{metric}_ms", None, None, True, "", None, machine_bound=True,
                         problem=problem) for metric in statistics if STATISTICS[metric][0] == "wall"]
            continue
        settings = differences(series.get(("A", runtime, batch)), series.get(("B", runtime, batch)),
                               {"timer_resolution_s", "order_seed"})
        problem = (f"series settings differ: {'; '.join(settings)}" if settings
                   else runtime_problem(con, a, b, name, [runtime, baseline]))
        base_a, base_b = rounds.get(("A", baseline, batch)), rounds.get(("B", baseline, batch))
        for metric in statistics:
            key = STATISTICS[metric]
            if key not in ra or key not in rb:
                continue  # no CPU time where a page timed the calls
            rows.append(Row(name, subject, f"{metric}_ms", _geometric_mean(ra[key]), _geometric_mean(rb[key]), True,
                            NOT_JUDGED.format(baseline=baseline), None, machine_bound=True, problem=problem))
            if runtime != baseline and base_a and base_b and key in base_a and key in base_b:
                row = ratio_row(name, f"{subject} ÷ {baseline}", f"{metric}_ratio", ra, base_a, rb, base_b, key)
                row.problem = problem
                rows.append(row)
    return rows + unavailable_rows(con, a, b, name, "p50_ms", {r for _, r, _ in rounds})


def _geometric_mean(values) -> float:
    return float(np.exp(np.log(np.asarray(values, dtype=np.float64)).mean()))


def ratio_row(name: str, subject: str, metric: str, runtime_a: dict, baseline_a: dict, runtime_b: dict,
              baseline_b: dict, key: tuple[str, str]) -> Row:
    """One statistic of a runtime relative to the baseline in the same round, in both runs (each
    side's round_statistics), judged over the rounds, never over calls."""
    statistic = key[1]
    if len(runtime_a[key]) != len(baseline_a[key]) or len(runtime_b[key]) != len(baseline_b[key]):
        return Row(name, subject, metric, None, None, True, "", None, machine_bound=True,
                   problem="the runtime and the baseline ran different rounds")
    per_round_a = np.asarray(runtime_a[key], dtype=np.float64) / np.asarray(baseline_a[key], dtype=np.float64)
    per_round_b = np.asarray(runtime_b[key], dtype=np.float64) / np.asarray(baseline_b[key], dtype=np.float64)
    ratio = run_ratio(per_round_a, per_round_b)
    row = Row(name, subject, metric, _geometric_mean(per_round_a), _geometric_mean(per_round_b), True, "", None,
              machine_bound=True)
    counts = f"{len(per_round_a)}/{len(per_round_b)} rounds"
    calls = min(runtime_a[("calls", None)], runtime_b[("calls", None)], baseline_a[("calls", None)],
                baseline_b[("calls", None)])
    needed = min_calls_per_round(statistic)
    what = f"per-round {statistic.upper() if statistic != 'mean' else 'mean'} ratio"
    if calls < needed:
        row.test = f"{what}: rounds of {calls} calls; a round's {statistic.upper()} needs >= {needed}"
    elif ratio.ci_low is None:
        row.test = f"{what} over {counts}: judged over rounds, and an interval needs >= {MIN_ROUNDS} in each run"
    else:
        row.test = (f"{what} over {counts} (rounds, not calls): B/A {ratio.ratio:.4g}, Welch t 95% CI "
                    f"[{ratio.ci_low:.4g}, {ratio.ci_high:.4g}]")
        row.significant = ratio.ci_low > 1 or ratio.ci_high < 1
        row.ratio_interval = (ratio.ci_low, ratio.ci_high)
    return row


def _by_content(input_text: str) -> str:
    """A latency input as recorded ("fixed states PATH (sha256 ...), ...") without its path: the same
    states read from another folder are the same input."""
    return re.sub(r"^fixed states .*? \(sha256", "fixed states (sha256", input_text)
