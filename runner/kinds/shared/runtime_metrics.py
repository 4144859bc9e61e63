"""The metrics of a runtime measured against a baseline, read from the views of the parity and
latency kinds: the parity and latency measurements use them, and so does an episodes
measurement that names one of each (Day 26)."""

from __future__ import annotations

PARITY_METRIC_NAMES = ("action_agreement", "action_disagreements", "max_abs_dq", "mean_abs_dq", "allclose",
                       "elements_fail", "near_ties", "batch_invariance_max_abs_dq", "decisive_action_agreement",
                       "decisive_states")

LATENCY_METRIC_NAMES = ("latency_p50_ms", "latency_p95_ms", "latency_p99_ms", "latency_p50_ratio", "latency_p95_ratio",
                        "latency_p99_ratio", "latency_mean_ratio", "latency_p50_ratio_ci_low",
                        "latency_p50_ratio_ci_high")
RATIO_CONFIDENCE = 0.95  # of the P50 ratio's interval over interleaved rounds


def parity_pair_metrics(con, run_id: str, measurement: str, candidate: str, baseline: str) -> dict:
    """Parity of candidate against baseline over every batch size: the worst batch size decides."""
    row = con.execute(
        "SELECT count(*), min(action_agreement_fraction), max(n_states - action_agreement), max(max_abs_dq), "
        "max(mean_abs_dq), bool_and(allclose), max(elements_fail), max(near_ties), "
        "min(decisive_agreement_fraction), min(decisive_states) FROM parity_summary "
        "WHERE run_id = ? AND measurement = ? AND candidate = ? AND baseline = ?",
        [run_id, measurement, candidate, baseline]).fetchone()
    if not row or not row[0]:
        return {}
    found = {
        "action_agreement": row[1], "action_disagreements": float(row[2]), "max_abs_dq": row[3],
        "mean_abs_dq": row[4], "allclose": float(row[5]), "elements_fail": float(row[6]), "near_ties": float(row[7]),
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


def latency_pair_metrics(con, run_id: str, measurement: str, candidate: str, baseline: str,
                         batch_size: int | None) -> dict:
    """Latency of candidate and its ratios to baseline at `batch_size` (None: the smallest measured)."""
    if batch_size is None:
        batch_size = con.execute("SELECT min(batch_size) FROM latency_samples WHERE run_id = ? AND measurement = ?",
                                 [run_id, measurement]).fetchone()[0]
    found = {}
    row = con.execute("SELECT p50_ms, p95_ms, p99_ms FROM latency_summary WHERE run_id = ? AND measurement = ? "
                      "AND runtime = ? AND batch_size = ?", [run_id, measurement, candidate, batch_size]).fetchone()
    if row:
        found.update(latency_p50_ms=row[0], latency_p95_ms=row[1], latency_p99_ms=row[2])
    if baseline is not None:
        row = con.execute("SELECT p50_ratio, p95_ratio, p99_ratio, mean_ratio FROM latency_pairs WHERE run_id = ? AND "
                          "measurement = ? AND candidate = ? AND baseline = ? AND batch_size = ?",
                          [run_id, measurement, candidate, baseline, batch_size]).fetchone()
        if row:
            found.update(latency_p50_ratio=row[0], latency_p95_ratio=row[1], latency_p99_ratio=row[2],
                         latency_mean_ratio=row[3])
            found.update(_p50_ratio_interval(con, run_id, measurement, candidate, baseline, batch_size))
    if found:
        found["latency_batch_size"] = float(batch_size)
    return found


def _p50_ratio_interval(con, run_id: str, measurement: str, candidate: str, baseline: str, batch_size: int) -> dict:
    """The interval of the P50 ratio from the interleaved rounds: each round's P50 of the
    candidate over the baseline's in the same round, a t interval on their logarithms
    (breakout_core.stats.paired_ratio_interval). The spread between rounds, where a shared
    machine's load shows, is what it measures; one round gives none."""
    from breakout_core.stats import paired_ratio_interval

    rows = con.execute(
        "SELECT round, quantile_cont(ms, 0.5) FILTER (WHERE runtime = ?) AS c, "
        "quantile_cont(ms, 0.5) FILTER (WHERE runtime = ?) AS b FROM latency_samples "
        "WHERE run_id = ? AND measurement = ? AND batch_size = ? AND runtime IN (?, ?) GROUP BY round ORDER BY round",
        [candidate, baseline, run_id, measurement, batch_size, candidate, baseline]).fetchall()
    pairs = [(c, b) for _, c, b in rows if c is not None and b is not None]
    if len(pairs) < 2:
        return {"inconclusive_reason": f"{len(pairs)} interleaved latency round(s): the P50 ratio's interval "
                                       "needs rounds >= 2"}
    low, high = paired_ratio_interval(*map(list, zip(*pairs)), confidence=RATIO_CONFIDENCE)
    return {"latency_p50_ratio_ci_low": low, "latency_p50_ratio_ci_high": high, "latency_rounds": float(len(pairs))}
