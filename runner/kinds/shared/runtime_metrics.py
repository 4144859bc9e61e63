"""The metrics of a runtime measured against a baseline, read from the views of the parity and
latency kinds: the parity and latency measurements use them, and so does an episodes
measurement that names one of each (Day 26)."""

from __future__ import annotations

PARITY_METRIC_NAMES = ("action_agreement", "action_disagreements", "max_abs_dq", "mean_abs_dq", "allclose",
                       "elements_fail", "near_ties", "batch_invariance_max_abs_dq", "decisive_action_agreement",
                       "decisive_states")

# each statistic of a round (breakout_core.statistics.latency_rounds.ROUND_STATISTICS) on both clocks: wall time
# (`latency_`) and the calling thread's CPU time (`cpu_time_`); a ratio's point estimate is shown,
# its interval over rounds decides
CLOCK_PREFIXES = {"wall": "latency", "cpu": "cpu_time"}
_STATISTICS = ("p50", "p95", "p99", "mean")
LATENCY_RATIO_POINTS = tuple(f"{prefix}_{s}_ratio" for prefix in CLOCK_PREFIXES.values() for s in _STATISTICS)
# a runtime's own times: its quantiles over all its calls, and the geometric mean of its per-round
# values with that mean's interval over rounds (`..._ms_ci_high`); shown, never a rule
LATENCY_LEVEL_POINTS = tuple(f"{prefix}_{s}_ms" for prefix in CLOCK_PREFIXES.values() for s in ("p50", "p95", "p99"))
LATENCY_LEVELS = LATENCY_LEVEL_POINTS + tuple(f"{p}_ci_{end}" for p in LATENCY_LEVEL_POINTS for end in ("low", "high"))
LATENCY_METRIC_NAMES = (
    LATENCY_LEVELS
    + LATENCY_RATIO_POINTS
    + tuple(f"{point}_ci_{end}" for point in LATENCY_RATIO_POINTS for end in ("low", "high")))
# why a runtime's own time decides nothing: measured on tests/data/latency_aa_rounds.csv
# (docs/statistics.md, "A runtime's own time")
OWN_TIME_REASON = ("a runtime's own time carries the machine's load at the moment, which no round of the run "
                   "measures apart (on the shipped A/A recording, a runtime whose P95 over the hour was at a "
                   "budget passed `latency_p95_ms_ci_high < budget` in 29% of 10-round windows)")


def parity_pair_metrics(con, run_id: str, measurement: str, candidate: str, baseline: str) -> dict:
    """Parity of candidate against baseline over every batch size: the worst batch size decides."""
    row = con.execute(
        "SELECT count(*), min(action_agreement_fraction), max(n_states - action_agreement), max(max_abs_dq), "
        "max(mean_abs_dq), bool_and(allclose), max(elements_fail), max(near_ties), "
        "min(decisive_agreement_fraction), min(decisive_states), max(n_states) FROM parity_summary "
        "WHERE run_id = ? AND measurement = ? AND candidate = ? AND baseline = ?",
        [run_id, measurement, candidate, baseline]).fetchone()
    if not row or not row[0]:
        return {}
    found = {
        "action_agreement": row[1], "action_disagreements": float(row[2]), "max_abs_dq": row[3],
        "mean_abs_dq": row[4], "allclose": float(row[5]), "elements_fail": float(row[6]), "near_ties": float(row[7]),
        "parity_states": float(row[10]),
    }
    if row[8] is not None:  # none where no state is decisive, or the rows predate the margin
        found["decisive_action_agreement"] = row[8]
    if row[9] is not None:
        found["decisive_states"] = float(row[9])
    invariance = con.execute("SELECT max(max_abs_dq) FROM parity_batch_consistency WHERE run_id = ? "
                             "AND measurement = ? AND runtime = ?", [run_id, measurement, candidate]).fetchone()[0]
    if invariance is not None:
        found["batch_invariance_max_abs_dq"] = invariance
    return found


def latency_rule_problem(metric: str) -> str | None:
    """Why a verdict may not judge `metric`: a ratio's point estimate swings with a shared
    machine's load (the same file against itself gave P95 ratios of 0.54 to 1.43 in five
    rounds), so a rule judges the interval over rounds instead; a runtime's own time, interval
    or not, is the load of the moment (OWN_TIME_REASON), so it is shown and judges nothing."""
    if metric in LATENCY_RATIO_POINTS:
        return (f"{metric} is a point estimate that swings with the machine's load: judge its interval over "
                f"rounds, {metric}_ci_high (or {metric}_ci_low)")
    if metric in LATENCY_LEVELS:
        return (f"{metric} is shown, never a rule: {OWN_TIME_REASON}; judge a ratio to a runtime timed in the same "
                "rounds, e.g. latency_p95_ratio_ci_high")
    return None


def latency_interval_needs(metric: str) -> str | None:
    """The round statistic (p50, p95, p99, mean) whose interval over rounds `metric` is, or None."""
    for prefix in CLOCK_PREFIXES.values():
        for statistic in _STATISTICS:
            if metric in (f"{prefix}_{statistic}_ratio_ci_low", f"{prefix}_{statistic}_ratio_ci_high"):
                return statistic
    return None


def latency_pair_metrics(con, run_id: str, measurement: str, candidate: str, baseline: str,
                         batch_size: int | None) -> dict:
    """Latency of candidate and its ratios to baseline at `batch_size` (None: the smallest measured),
    on both clocks: each statistic's ratio is the geometric mean of its per-round ratios (candidate
    over baseline in the same round) and its interval a t interval over the rounds
    (breakout_core.statistics.latency_rounds.round_ratio). A tail statistic gets an interval only where each
    round holds enough calls for it (min_calls_per_round); the spec refuses a rule on one without."""
    if batch_size is None:
        batch_size = con.execute("SELECT min(batch_size) FROM latency_samples WHERE run_id = ? AND measurement = ?",
                                 [run_id, measurement]).fetchone()[0]
    found = {}
    row = con.execute("SELECT p50_ms, p95_ms, p99_ms, cpu_p50_ms, cpu_p95_ms, cpu_p99_ms FROM latency_summary "
                      "WHERE run_id = ? AND measurement = ? AND runtime = ? AND batch_size = ?",
                      [run_id, measurement, candidate, batch_size]).fetchone()
    if row:
        found.update(latency_p50_ms=row[0], latency_p95_ms=row[1], latency_p99_ms=row[2])
        if row[3] is not None:
            found.update(cpu_time_p50_ms=row[3], cpu_time_p95_ms=row[4], cpu_time_p99_ms=row[5])
    found.update(round_level_metrics(round_statistics(con, run_id, measurement, candidate, batch_size)))
    if baseline is not None:
        found.update(_round_ratios(con, run_id, measurement, candidate, baseline, batch_size))
    if found:
        found["latency_batch_size"] = float(batch_size)
    return found


def round_statistics(con, run_id: str, measurement: str, runtime: str, batch_size: int) -> dict:
    """{(clock, statistic): per-round values in round order} of one runtime's series, with
    ("calls", None): the fewest calls in a round; {} where it has no rows."""
    columns = [f"{clock_column}{s}_ms" for clock_column in ("", "cpu_") for s in _STATISTICS]
    rows = con.execute(f"SELECT n, {', '.join(columns)} FROM latency_rounds WHERE run_id = ? AND measurement = ? "
                       "AND runtime = ? AND batch_size = ? ORDER BY round",
                       [run_id, measurement, runtime, batch_size]).fetchall()
    if not rows:
        return {}
    values = list(zip(*rows))
    found: dict = {("calls", None): min(values[0])}
    for (clock, statistic), column in zip([(c, s) for c in CLOCK_PREFIXES for s in _STATISTICS], values[1:]):
        if all(v is not None for v in column):  # CPU time is not read where a page times its calls
            found[(clock, statistic)] = column
    return found


def round_level_metrics(statistics: dict) -> dict:
    """A runtime's own P50, P95 and P99 over its rounds, on both clocks, from its round_statistics:
    the interval of the geometric mean of its per-round values (`latency_p95_ms_ci_high`, ...),
    where the rounds hold enough calls for the statistic; {} with fewer than two rounds. Shown
    beside the ratios, never a rule (OWN_TIME_REASON)."""
    from breakout_core.statistics.latency_rounds import min_calls_per_round, round_level

    found: dict = {}
    for (clock, statistic), values in statistics.items():
        if clock == "calls" or statistic == "mean" or len(values) < 2:
            continue
        if statistics[("calls", None)] >= min_calls_per_round(statistic):
            level = round_level(values)
            name = f"{CLOCK_PREFIXES[clock]}_{statistic}_ms"
            found[f"{name}_ci_low"], found[f"{name}_ci_high"] = level.ci_low, level.ci_high
    return found


def _round_ratios(con, run_id: str, measurement: str, candidate: str, baseline: str, batch_size: int) -> dict:
    c = round_statistics(con, run_id, measurement, candidate, batch_size)
    b = round_statistics(con, run_id, measurement, baseline, batch_size)
    return round_ratio_metrics(c, b) if c and b else {}


def round_ratio_metrics(candidate: dict, baseline: dict) -> dict:
    """Every statistic's ratio over the rounds both runtimes ran, on both clocks, from their
    round_statistics. The spread between rounds, where a shared machine's load shows, is what
    the interval measures; one round gives none."""
    from breakout_core.statistics.latency_rounds import min_calls_per_round, round_ratio

    rounds = len(candidate[("wall", "p50")])
    if len(baseline[("wall", "p50")]) != rounds:
        return {"inconclusive_reason": f"the runtimes ran {rounds} and {len(baseline[('wall', 'p50')])} rounds: "
                                       "a ratio over rounds needs both in every round"}
    calls = min(candidate[("calls", None)], baseline[("calls", None)])
    found: dict = {}
    for (clock, statistic), values in candidate.items():
        if clock == "calls" or (clock, statistic) not in baseline:
            continue
        ratio = round_ratio(values, baseline[(clock, statistic)])
        name = f"{CLOCK_PREFIXES[clock]}_{statistic}_ratio"
        found[name] = ratio.ratio
        if ratio.ci_low is not None and calls >= min_calls_per_round(statistic):
            found[f"{name}_ci_low"], found[f"{name}_ci_high"] = ratio.ci_low, ratio.ci_high
    found["latency_rounds"] = float(rounds)
    if rounds < 2:
        found["inconclusive_reason"] = (f"{rounds} interleaved latency round(s): a ratio's interval over rounds "
                                        "needs rounds >= 2")
    return found
