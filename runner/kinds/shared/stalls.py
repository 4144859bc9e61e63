"""The stalls verdict's metrics: games run to the time limit by a candidate against its
baseline on the same seeds, from the shared `episodes` table (breakout_core.statistics.stalls holds
the test). Every kind that plays paired games offers them.

A verdict asks one question (specs/check_onnx.yaml), `stall_excess_ci_high: "<= 0.1"`: passed
where the games bound the excess share of games to the time limit at 10 points or less,
rejected only where the low bound shows it above 10 points, inconclusive between.
"""

from __future__ import annotations

STALLS_CONFIDENCE = 0.95  # of each one-sided bound: the stated error of a rejection is 5%

METRIC_NAMES = ("stall_excess_ci_low", "stall_excess_ci_high", "stalls_more_p_value")


def stall_metrics(con, run_id: str, measurement: str, candidate: str, baseline: str) -> dict:
    """The stall test on every seed both played ({} where none pairs up)."""
    from breakout_core.statistics.stalls import stall_test

    pairs = con.execute(
        "SELECT c.ended_by = 'time_limit' AS candidate_stalled, b.ended_by = 'time_limit' AS baseline_stalled "
        "FROM episodes c JOIN episodes b ON c.run_id = b.run_id AND c.measurement = b.measurement AND c.seed = b.seed "
        "WHERE c.run_id = ? AND c.measurement = ? AND c.policy = ? AND b.policy = ? ORDER BY c.seed",
        [run_id, measurement, candidate, baseline]).fetchnumpy()
    if len(pairs["candidate_stalled"]) == 0:
        return {}
    test = stall_test(pairs["candidate_stalled"], pairs["baseline_stalled"], confidence=STALLS_CONFIDENCE)
    return {"stall_excess_ci_low": test.excess_low, "stall_excess_ci_high": test.excess_high,
            "stalls_more_p_value": test.p_value, "candidate_time_limit_games": float(test.candidate_stalls),
            "baseline_time_limit_games": float(test.baseline_stalls),
            "time_limit_only_candidate": float(test.only_candidate),
            "time_limit_only_baseline": float(test.only_baseline), "stall_method": test.described()}
