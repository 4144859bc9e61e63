"""Parity math on hand-made Q arrays with known answers, and the latency harness."""

from __future__ import annotations

import time

import numpy as np
import pytest

from breakout_core.diagnosis.latency import MIN_TIMED_CALLS, latency_result, measure_latency
from breakout_core.diagnosis.parity import (
    FP16_TOLERANCE,
    FP32_TOLERANCE,
    compare_q,
    default_tolerance,
    first_divergence,
    greedy_actions,
    top2_margin,
)

BASELINE = np.array(
    [
        [1.0, 2.0, 3.0, 0.0],  # clear winner (action 2), margin 1.0
        [0.5, 0.50001, 0.0, 0.0],  # near tie between actions 0 and 1, margin 1e-5
        [0.0, 0.0, 0.0, 4.0],  # action 3
    ],
    dtype=np.float32,
)


def test_identical_arrays_pass_everything():
    result = compare_q(BASELINE, BASELINE.copy())
    assert result.max_abs_diff == 0.0 and result.mean_abs_diff == 0.0
    assert result.elements_pass == 12 and result.elements_fail == 0 and result.allclose
    assert result.action_agreement == 3 and result.action_agreement_fraction == 1.0
    assert result.near_tie_states == () and result.disagreeing_states == ()
    assert (result.atol, result.rtol) == FP32_TOLERANCE


def test_known_differences_counts_and_near_ties():
    candidate = BASELINE.astype(np.float64).copy()
    candidate[0, 2] += 0.25  # big change, same action
    candidate[1, 0] += 3e-5  # flips the near tie: action 0 now wins
    candidate[2, 0] += 1e-6  # within atol
    result = compare_q(BASELINE, candidate)
    assert result.max_abs_diff == pytest.approx(0.25)
    assert result.mean_abs_diff == pytest.approx((0.25 + 3e-5 + 1e-6) / 12)
    assert result.elements_fail == 2 and result.elements_pass == 10
    assert result.states_fail == 2 and result.states_pass == 1
    assert result.baseline_actions.tolist() == [2, 1, 3]
    assert result.candidate_actions.tolist() == [2, 0, 3]
    assert result.action_agreement == 2
    assert result.action_agreement_fraction == pytest.approx(2 / 3)
    assert result.disagreeing_states == (1,)
    # state 1: margin 1e-5 < its max |dQ| 3e-5; state 0: margin 1.0 > 0.25; state 2: 4.0 > 1e-6
    assert result.near_tie_states == (1,)
    np.testing.assert_allclose(result.per_state_max_abs_diff, [0.25, 3e-5, 1e-6], rtol=1e-3)
    np.testing.assert_allclose(result.baseline_top2_margin, [1.0, 1e-5, 4.0], rtol=1e-2)


def test_polygraphy_convention_relative_to_baseline():
    # |a - b| <= atol + rtol * |b|: with atol=0, rtol=0.1 a diff of 0.5 passes at |b|=10 only
    baseline = np.array([[10.0, 0.0, 0.0, 0.0]])
    candidate = np.array([[10.5, 0.5, 0.0, 0.0]])
    result = compare_q(baseline, candidate, atol=0.0, rtol=0.1)
    assert (result.elements_pass, result.elements_fail) == (3, 1)
    # the reference is the baseline: 0.5 <= 0.095 * 5.5 passes, 0.5 <= 0.095 * 5.0 does not
    assert compare_q(np.array([[5.0, 0, 0, 0]]), np.array([[5.5, 0, 0, 0]]), atol=0.0, rtol=0.095).elements_fail == 1
    assert compare_q(np.array([[5.5, 0, 0, 0]]), np.array([[5.0, 0, 0, 0]]), atol=0.0, rtol=0.095).allclose
    edge = compare_q(np.array([[1.0, 0, 0, 0]]), np.array([[1.0 + 1.5e-5, 0, 0, 0]]))
    assert edge.allclose  # 1.5e-5 <= 1e-5 + 1e-5 * 1.0
    far = compare_q(np.array([[0.0, 1, 0, 0]]), np.array([[1.5e-5, 1, 0, 0]]))
    assert not far.allclose  # 1.5e-5 > 1e-5 + 1e-5 * 0.0


def test_fp16_and_int8_defaults_and_unknown_precision():
    assert default_tolerance("fp16") == FP16_TOLERANCE == (1e-3, 1e-3)
    assert default_tolerance("int8") == (5e-2, 5e-2)
    candidate = BASELINE + np.float32(5e-4)
    assert compare_q(BASELINE, candidate, precision="fp16").allclose
    assert not compare_q(BASELINE, candidate).allclose
    with pytest.raises(ValueError, match="unknown precision"):
        default_tolerance("int4")


def test_nonfinite_candidate_fails_and_is_not_hidden():
    candidate = BASELINE.copy()
    candidate[2, 3] = np.nan
    result = compare_q(BASELINE, candidate)
    assert result.candidate_nonfinite == 1
    assert result.max_abs_diff == np.inf
    assert result.elements_fail == 1
    assert result.candidate_actions[2] == -1 and 2 in result.disagreeing_states


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="differ in shape"):
        compare_q(BASELINE, BASELINE[:2])
    with pytest.raises(ValueError, match="non-empty"):
        compare_q(BASELINE[0], BASELINE[0])
    with pytest.raises(ValueError, match="finite"):
        compare_q(np.full((1, 4), np.nan), np.zeros((1, 4)))


def test_greedy_ties_go_to_lowest_index_and_margins():
    q = np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 2.0, 2.0, 1.0]])
    assert greedy_actions(q).tolist() == [0, 1]
    assert top2_margin(q).tolist() == [0.0, 0.0]


def test_first_divergence():
    assert first_divergence([0, 1, 2, 3], [0, 1, 2, 3]) is None
    assert first_divergence([0, 1, 2, 3], [0, 1, 3, 3]) == 2
    assert first_divergence([1], [0]) == 0
    assert first_divergence([0, 1], [0, 1, 2]) == 2  # one trajectory went on
    assert first_divergence(np.array([], dtype=int), np.array([], dtype=int)) is None


def test_latency_refuses_fewer_than_64_timed_calls():
    assert MIN_TIMED_CALLS == 64
    with pytest.raises(ValueError, match=">= 64"):
        measure_latency(lambda: None, iterations=63)
    with pytest.raises(ValueError, match=">= 64"):
        latency_result(np.ones(10))


def test_latency_harness_keeps_every_sample():
    calls = []
    result = measure_latency(calls.append, 1, warmup=3, iterations=64)
    assert len(calls) == 3 + 64  # warm-up calls made, not timed
    assert result.n == 64 and result.warmup == 3
    assert result.samples_ms.dtype == np.float64 and np.all(result.samples_ms >= 0)
    assert result.min_ms <= result.p50_ms <= result.p90_ms <= result.p95_ms <= result.p99_ms <= result.max_ms
    assert result.percentile_method == "linear"
    assert result.timer == "time.perf_counter_ns"
    assert result.timer_resolution_s == time.get_clock_info("perf_counter").resolution > 0
    assert set(result.summary()) >= {"p50_ms", "p95_ms", "p99_ms", "mean_ms", "timer", "percentile_method"}


def test_latency_statistics_on_known_samples():
    result = latency_result(np.arange(1, 101, dtype=float))  # 1..100 ms
    assert result.p50_ms == pytest.approx(50.5)
    assert result.p90_ms == pytest.approx(90.1)
    assert result.p95_ms == pytest.approx(95.05)
    assert result.p99_ms == pytest.approx(99.01)
    assert result.mean_ms == pytest.approx(50.5)


def test_latency_of_a_sleep_is_measured_in_ms():
    result = measure_latency(time.sleep, 0.001, warmup=1, iterations=64)
    assert result.p50_ms >= 1.0  # a 1 ms sleep never returns early
    assert result.p50_ms < 50.0
