"""Verdict rules and the statistics behind them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from breakout_core.statistics.stats import paired_bootstrap_ci, summarize
from runner.run.verdicts import decide
from runner.spec.fields import VerdictSpec, parse_rule


def verdict(**rules: str) -> VerdictSpec:
    return VerdictSpec(name="v", measurement="m", candidate="cand", baseline="base", deployment_worthy_when=rules)


CI_RULE = {"paired_score_diff_ci_low": ">= -1.0"}


def test_all_rules_pass_is_deployment_worthy():
    outcome, reason, evidence = decide(
        verdict(candidate_mean_score=">= 10", **CI_RULE),
        {"candidate_mean_score": 12.0, "paired_score_diff_ci_low": -0.5, "paired_score_diff_ci_high": 2.0},
    )
    assert outcome == "deployment-worthy"
    assert "candidate_mean_score = 12 >= 10" in reason
    assert "paired_score_diff_ci_low = -0.5 >= -1.0" in reason
    assert [r["passed"] for r in evidence["rules"]] == [True, True]


def test_plain_metric_failing_is_rejected_with_its_numbers():
    outcome, reason, evidence = decide(
        verdict(candidate_mean_score=">= 10", candidate_time_limit_fraction="<= 0.1"),
        {"candidate_mean_score": 8.25, "candidate_time_limit_fraction": 0.0},
    )
    assert outcome == "rejected"
    assert reason == "candidate_mean_score = 8.25 (needs >= 10)"  # only the failed rule, with both numbers
    assert evidence["rules"][0] == {"metric": "candidate_mean_score", "rule": ">= 10", "value": 8.25, "passed": False}


def test_interval_straddling_the_threshold_is_inconclusive():
    outcome, reason, _ = decide(
        verdict(**CI_RULE), {"paired_score_diff_ci_low": -2.5, "paired_score_diff_ci_high": 1.5}
    )
    assert outcome == "inconclusive"
    assert "paired_score_diff_ci_low = -2.5 (needs >= -1)" in reason
    assert "paired_score_diff_ci_high = 1.5" in reason and "straddles" in reason


def test_upper_bound_rule_straddling_is_inconclusive():
    outcome, _, _ = decide(
        verdict(paired_score_diff_ci_high="<= 1.0"), {"paired_score_diff_ci_low": 0.5, "paired_score_diff_ci_high": 2.0}
    )
    assert outcome == "inconclusive"


def test_whole_interval_on_the_wrong_side_is_rejected():
    outcome, reason, _ = decide(
        verdict(**CI_RULE), {"paired_score_diff_ci_low": -5.0, "paired_score_diff_ci_high": -2.0}
    )
    assert outcome == "rejected"
    assert reason == "paired_score_diff_ci_low = -5 (needs >= -1)"


def test_a_plain_failure_outweighs_an_inconclusive_interval():
    outcome, reason, _ = decide(
        verdict(candidate_mean_score=">= 10", **CI_RULE),
        {"candidate_mean_score": 3.0, "paired_score_diff_ci_low": -2.0, "paired_score_diff_ci_high": 1.0},
    )
    assert outcome == "rejected"
    assert "candidate_mean_score = 3" in reason


@pytest.mark.parametrize("found", [{}, {"candidate_mean_score": float("nan")}], ids=["missing", "nan"])
def test_missing_metric_is_unavailable(found):
    outcome, reason, evidence = decide(verdict(candidate_mean_score=">= 10"), found)
    assert outcome == "unavailable"
    assert "candidate_mean_score" in reason
    assert evidence["rules"] == [{"metric": "candidate_mean_score", "rule": ">= 10", "value": None, "passed": None}]


def test_unavailable_reason_wins():
    outcome, reason, _ = decide(verdict(candidate_mean_score=">= 10"), {"candidate_mean_score": 99.0}, "no GPU here")
    assert (outcome, reason) == ("unavailable", "no GPU here")


@pytest.mark.parametrize("text, parsed", [(">= 1.0", (">=", 1.0)), ("<-2", ("<", -2.0)), (" != 1e-3 ", ("!=", 0.001))])
def test_parse_rule(text, parsed):
    assert parse_rule(text) == parsed


@pytest.mark.parametrize("text", ["import os", ">= x", "1 >= 2", ">= 1; import os", "=> 1", ""])
def test_parse_rule_refuses_anything_but_a_comparison(text):
    with pytest.raises(ValueError, match="is not '<op> <number>'"):
        parse_rule(text)


SAMPLE = np.array([3.0, -1.0, 0.0, 4.0, 2.0, -2.0, 5.0, 1.0, 0.0, 6.0, -3.0, 2.0])


@pytest.mark.parametrize("confidence, n_resamples, seed", [(0.95, 2000, 0), (0.9, 5000, 123)])
def test_paired_bootstrap_ci_equals_scipy(confidence, n_resamples, seed):
    interval = paired_bootstrap_ci(SAMPLE, confidence=confidence, n_resamples=n_resamples, seed=seed)
    direct = stats.bootstrap(
        (SAMPLE,), np.mean, confidence_level=confidence, n_resamples=n_resamples,
        method="percentile", rng=np.random.default_rng(seed),
    ).confidence_interval
    assert interval.low == pytest.approx(direct.low, abs=1e-12)
    assert interval.high == pytest.approx(direct.high, abs=1e-12)
    assert interval.low < SAMPLE.mean() < interval.high
    assert (interval.confidence, interval.n_resamples, interval.seed, interval.method) == (
        confidence, n_resamples, seed, "percentile")


def test_paired_bootstrap_ci_needs_two_differences():
    with pytest.raises(ValueError, match="at least 2"):
        paired_bootstrap_ci(np.array([1.0]))


def test_paired_bootstrap_ci_of_equal_differences_is_a_point():
    interval = paired_bootstrap_ci(np.full(10, 2.0), n_resamples=1000)
    assert interval.low == pytest.approx(2.0) and interval.high == pytest.approx(2.0)


def test_summarize_known_values():
    s = summarize(np.arange(10))
    assert s["n"] == 10
    assert s["mean"] == pytest.approx(4.5)
    assert s["median"] == pytest.approx(4.5)
    assert s["p10"] == pytest.approx(0.9)  # linear interpolation: 0.1 * (10 - 1)
    assert s["p90"] == pytest.approx(8.1)
    assert s["std"] == pytest.approx(math.sqrt(82.5 / 9))  # sum of squared deviations 82.5, ddof=1
    assert (s["min"], s["max"]) == (0.0, 9.0)


def test_summarize_edge_cases():
    assert math.isnan(summarize(np.array([7.0]))["std"])
    with pytest.raises(ValueError, match="empty"):
        summarize(np.array([]))


def test_paired_ratio_interval_is_the_t_interval_of_the_log_ratios():
    from breakout_core.statistics.stats import geometric_mean_ratio, paired_ratio_interval

    x, y = np.array([113.0, 122.0, 105.0, 118.0]), np.array([159.0, 141.0, 139.0, 150.0])
    ci = stats.ttest_1samp(np.log(x / y), 0.0).confidence_interval(0.95)
    assert paired_ratio_interval(x, y) == pytest.approx((math.exp(ci.low), math.exp(ci.high)))
    assert geometric_mean_ratio(x, y) == pytest.approx(math.exp(np.log(x / y).mean()))
    with pytest.raises(ValueError, match="at least 2 pairs"):
        paired_ratio_interval(x[:1], y[:1])


def test_paired_ratio_interval_covers_as_claimed_at_three_repeats():
    """Three repeats with 10% timing noise on each rate: the 95% interval holds the true ratio
    in about 95% of 2,000 simulated benchmarks."""
    from breakout_core.statistics.stats import paired_ratio_interval

    rng = np.random.default_rng(0)
    true_ratio, covered = 0.8, 0
    for _ in range(2_000):
        bound = 150.0 * rng.lognormal(0.0, 0.1, 3)
        full = true_ratio * 150.0 * rng.lognormal(0.0, 0.1, 3)
        low, high = paired_ratio_interval(full, bound)
        covered += low <= true_ratio <= high
    assert 0.93 <= covered / 2_000 <= 0.97


@pytest.mark.parametrize("full, outcome", [([100.0, 104.0, 101.0], "rejected"), ([170.0, 150.0, 196.0], "inconclusive"),
                                           ([100.0], "inconclusive")])
def test_full_rate_against_its_learner_bound_is_judged_over_repeats(tmp_path, full, outcome):
    """A setting's full rate over its learner bound, paired by repeat, with its interval over
    the repeats; an interval across 0.9 cannot decide, and one timing per mode gives none."""
    from runner.kinds.throughput import ThroughputMeasurement, metrics
    from runner.store.database import Store

    store = Store(tmp_path / "r.duckdb")
    repeats = len(full)
    m = ThroughputMeasurement(kind="throughput", name="tp", total_transitions=2000, warmup_transitions=100,
                              modes=["full", "learner"], repeats=repeats)
    rates = {"full": full, "learner": [200.0, 205.0, 196.0][:repeats]}
    store.append_rows("throughput_trials", [
        {"run_id": "A", "measurement": "tp", "trial": "base", "mode": mode, "repeat": repeat, "settings": "{}",
         "warmup_transitions": 100, "transitions_per_s": tps}
        for mode, values in rates.items() for repeat, tps in enumerate(values)])
    with store.reader() as con:
        found = metrics(con, "A", m, "base", None)
    ratios = np.array(rates["full"]) / np.array(rates["learner"])
    assert found["full_over_learner_bound"] == pytest.approx(math.exp(np.log(ratios).mean()))
    rule = VerdictSpec(name="v", measurement="tp", candidate="base",
                       deployment_worthy_when={"full_over_learner_bound_ci_low": ">= 0.9"})
    decided, reason, _ = decide(rule, found)
    assert decided == outcome
    if repeats == 1:
        assert reason.startswith("one timing per setting")
    elif outcome == "inconclusive":
        assert "straddles" in reason


def test_a_note_on_how_to_read_the_numbers_ends_the_reason_whatever_the_outcome():
    note = "browser_webgpu ran on webgpu software adapter (SwiftShader, runs on the CPU): its times are not a GPU's"
    for value, outcome in ((20.0, "rejected"), (5.0, "deployment-worthy")):
        found, reason, _ = decide(verdict(candidate_game_call_p95_ms="< 16.7"),
                                  {"candidate_game_call_p95_ms": value, "note": note})
        assert found == outcome and reason.startswith("candidate_game_call_p95_ms") and reason.endswith("; " + note)
