"""Latency judged over interleaved rounds: each round's statistic of each runtime, their ratios
round by round, and a t interval over the rounds.

Calls are not independent: a shared machine's load changes over seconds, so a call's time
tells much about its neighbours'. A test over calls (a rank test, a bootstrap of calls) takes
thousands of correlated calls for thousands of independent ones and calls an unchanged
runtime different most of the time. A round, in which every runtime takes its turn on the
same input, is the unit here: each round gives one ratio of a statistic (its P50, P95, P99
or mean, candidate over baseline), and the interval is Student's t on the logarithms of those
ratios (breakout_core.statistics.stats.paired_ratio_interval). The order of the runtimes within each
round is drawn from a seed, so neither always goes first (after the other's cache traffic,
or first after a pause); the order is recorded with the samples.

A tail statistic needs enough calls above it in each round: MIN_TAIL_CALLS calls beyond the
quantile, so a round's P95 rests on 100 calls and its P99 on 500. Its interval needs
MIN_TAIL_ROUNDS rounds, a P50's or mean's MIN_ROUNDS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from breakout_core.statistics.stats import PERCENTILE_METHOD, geometric_mean_ratio, paired_ratio_interval

MIN_TIMED_CALLS = 64  # fewer samples make P95/P99 mostly the largest sample or two
# name: the percentile, or None for the mean
ROUND_STATISTICS: dict[str, int | None] = {"p50": 50, "p95": 95, "p99": 99, "mean": None}
TAIL_STATISTICS = ("p95", "p99")
MIN_TAIL_CALLS = 5  # calls beyond a round's tail quantile: fewer, and it is the largest call or two
MIN_ROUNDS = 2  # a t interval needs two ratios
MIN_TAIL_ROUNDS = 10  # a round's tail swings more than its median: fewer rounds leave the interval near useless
RATIO_CONFIDENCE = 0.95
ORDER_SEED = 0  # the default seed of the runtimes' order within rounds


def min_calls_per_round(statistic: str) -> int:
    """The fewest timed calls per round and runtime a rule on `statistic` rests on."""
    q = ROUND_STATISTICS[statistic]
    if q is None or q == 50:
        return MIN_TIMED_CALLS
    return max(MIN_TIMED_CALLS, math.ceil(MIN_TAIL_CALLS / (1 - q / 100) - 1e-9))


def min_rounds(statistic: str) -> int:
    """The fewest rounds the interval of a rule on `statistic` rests on."""
    return MIN_TAIL_ROUNDS if statistic in TAIL_STATISTICS else MIN_ROUNDS


def round_order(names: list[str], seed: int, round_index: int) -> list[str]:
    """The order the runtimes take their turns in round `round_index`: a permutation drawn from
    (seed, round), the same for the same seed whatever else the run does."""
    rng = np.random.default_rng([seed, round_index])
    return [names[i] for i in rng.permutation(len(names))]


def round_statistic(samples: np.ndarray, statistic: str) -> float:
    """One round's statistic of its calls (milliseconds)."""
    q = ROUND_STATISTICS[statistic]
    samples = np.asarray(samples, dtype=np.float64)
    return float(samples.mean()) if q is None else float(np.percentile(samples, q, method=PERCENTILE_METHOD))


@dataclass(frozen=True)
class RoundRatio:
    """A statistic's ratio, candidate over baseline, from the rounds both ran in."""

    ratio: float  # the geometric mean of the per-round ratios
    ci_low: float | None  # None with fewer than MIN_ROUNDS rounds
    ci_high: float | None
    rounds: int


def round_ratio(candidate: np.ndarray, baseline: np.ndarray, *,
                confidence: float = RATIO_CONFIDENCE) -> RoundRatio:
    """The ratio of per-round statistics, candidate's over baseline's in the same round, and its
    t interval over the rounds (paired by round: the drift interleaving put on both cancels)."""
    candidate, baseline = np.asarray(candidate, dtype=np.float64), np.asarray(baseline, dtype=np.float64)
    if candidate.shape != baseline.shape or candidate.size == 0:
        raise ValueError(f"need one statistic per round of each runtime, got {candidate.size} and {baseline.size}")
    point = geometric_mean_ratio(candidate, baseline)
    if candidate.size < MIN_ROUNDS:
        return RoundRatio(point, None, None, int(candidate.size))
    if np.ptp(np.log(candidate / baseline)) == 0:  # every round the same ratio: no spread to widen it
        return RoundRatio(point, point, point, int(candidate.size))
    low, high = paired_ratio_interval(candidate, baseline, confidence=confidence)
    return RoundRatio(point, low, high, int(candidate.size))


def round_level(values: np.ndarray, *, confidence: float = RATIO_CONFIDENCE) -> RoundRatio:
    """One runtime's own per-round statistic over its rounds: their geometric mean and its t
    interval on the logarithms (ratio, ci_low and ci_high in milliseconds). What a fixed budget on
    a runtime's tail (a 60 Hz frame) is judged by, the rounds' spread standing for the load's."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("need one statistic per round")
    return round_ratio(values, np.ones_like(values), confidence=confidence)


def run_ratio(run_a: np.ndarray, run_b: np.ndarray, *, confidence: float = RATIO_CONFIDENCE) -> RoundRatio:
    """The ratio of one runtime's per-round statistic between two runs (run B's over run A's):
    the ratio of their geometric means over rounds, and Welch's t interval on the logarithms
    (the runs' rounds are not paired). Fewer than MIN_ROUNDS rounds in either run: no interval."""
    from breakout_core.statistics.stats import geometric_mean_ratio_interval

    run_a, run_b = np.asarray(run_a, dtype=np.float64), np.asarray(run_b, dtype=np.float64)
    point = float(np.exp(np.log(run_b).mean() - np.log(run_a).mean()))
    rounds = int(min(run_a.size, run_b.size))
    if rounds < MIN_ROUNDS:
        return RoundRatio(point, None, None, rounds)
    ci = geometric_mean_ratio_interval(run_b, run_a, confidence=confidence)
    return RoundRatio(point, ci.low, ci.high, rounds)
