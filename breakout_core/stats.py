"""Statistics for score comparisons: percentiles, paired and unpaired bootstrap intervals, and the
shift test between two runs' samples."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PERCENTILE_METHOD = "linear"  # numpy's default; DuckDB's quantile_cont interpolates the same way
BOOTSTRAP_METHOD = "percentile"  # robust when every difference is equal (BCa returns NaN there)
BOOTSTRAP_MAX_N = 5_000  # above this the mean is normal to within the bootstrap's own noise, at no cost


@dataclass(frozen=True)
class Interval:
    low: float
    high: float
    confidence: float
    method: str
    n_resamples: int
    seed: int


def summarize(values: np.ndarray) -> dict[str, float]:
    """Mean, median, sample std (ddof=1), P10, P90, min, max of a sample."""
    values = np.asarray(values, dtype=np.float64)
    if values.size == 0:
        raise ValueError("cannot summarize an empty sample")
    p10, median, p90 = np.percentile(values, [10, 50, 90], method=PERCENTILE_METHOD)
    return {
        "n": int(values.size),
        "mean": float(values.mean()),
        "median": float(median),
        "std": float(values.std(ddof=1)) if values.size > 1 else float("nan"),
        "p10": float(p10),
        "p90": float(p90),
        "min": float(values.min()),
        "max": float(values.max()),
    }


def paired_bootstrap_ci(
    differences: np.ndarray,
    *,
    confidence: float = 0.95,
    n_resamples: int = 10_000,
    seed: int = 0,
) -> Interval:
    """Bootstrap CI of the mean of per-seed differences (candidate - baseline, same seed).

    Resampling the paired differences keeps each seed's two episodes together, which is
    what makes the comparison paired. scipy.stats.bootstrap with a fixed seed.
    """
    from scipy import stats

    differences = np.asarray(differences, dtype=np.float64)
    if differences.size < 2:
        raise ValueError("a bootstrap interval needs at least 2 paired differences")
    if differences.size > BOOTSTRAP_MAX_N:
        half = stats.norm.ppf(0.5 + confidence / 2) * differences.std(ddof=1) / np.sqrt(differences.size)
        mean = float(differences.mean())
        return Interval(mean - half, mean + half, confidence, f"normal approximation (n > {BOOTSTRAP_MAX_N})", 0, seed)
    result = stats.bootstrap(
        (differences,),
        np.mean,
        confidence_level=confidence,
        n_resamples=n_resamples,
        method=BOOTSTRAP_METHOD,
        rng=np.random.default_rng(seed),
    )
    return Interval(
        low=float(result.confidence_interval.low),
        high=float(result.confidence_interval.high),
        confidence=confidence,
        method=BOOTSTRAP_METHOD,
        n_resamples=n_resamples,
        seed=seed,
    )


# -- shifts between two independent samples (cross-run comparison) -----------------------------

RANK_TEST_ALPHA = 0.002  # asv compare: a two-sided Mann-Whitney U below this is a significant change
FALLBACK_CONFIDENCE = 0.99  # asv's fallback: non-overlapping 99% intervals of the median


@dataclass(frozen=True)
class ShiftTest:
    significant: bool
    method: str  # what was done, with its figures, for a reader of the comparison
    p_value: float | None = None


def smallest_rank_test_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided p an exact Mann-Whitney U can give for these sample sizes:
    2 / C(n_a + n_b, n_a), reached when the two samples do not overlap at all."""
    from math import comb

    return min(1.0, 2 / comb(n_a + n_b, n_a))


def median_interval(values: np.ndarray, *, confidence: float = FALLBACK_CONFIDENCE, n_resamples: int = 10_000,
                    seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median (scipy.stats.bootstrap, fixed seed)."""
    from scipy import stats

    values = np.asarray(values, dtype=np.float64)
    if values.size < 2:
        raise ValueError("an interval of the median needs at least 2 values")
    result = stats.bootstrap((values,), np.median, confidence_level=confidence, n_resamples=n_resamples,
                             method=BOOTSTRAP_METHOD, rng=np.random.default_rng(seed))
    return float(result.confidence_interval.low), float(result.confidence_interval.high)


def sample_shift(a: np.ndarray, b: np.ndarray, *, alpha: float = RANK_TEST_ALPHA, seed: int = 0) -> ShiftTest:
    """Whether samples a and b (e.g. latencies of two runs) differ, as asv compare decides.

    A two-sided Mann-Whitney U on the raw samples, significant when p < alpha. When the
    samples are too small for the test ever to reach alpha, the 99% bootstrap intervals of
    the two medians are compared instead: significant when they do not overlap."""
    from scipy import stats

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.size < 2 or b.size < 2:
        raise ValueError("a shift test needs at least 2 values in each sample")
    if smallest_rank_test_p(a.size, b.size) < alpha:
        p = float(stats.mannwhitneyu(a, b, alternative="two-sided").pvalue)
        return ShiftTest(p < alpha, f"Mann-Whitney U p={p:.2g} (n {a.size}/{b.size})", p)
    low_a, high_a = median_interval(a, seed=seed)
    low_b, high_b = median_interval(b, seed=seed)
    apart = high_a < low_b or high_b < low_a
    return ShiftTest(apart, f"{FALLBACK_CONFIDENCE:.0%} CIs of the median [{low_a:.4g}, {high_a:.4g}] vs "
                            f"[{low_b:.4g}, {high_b:.4g}] (n {a.size}/{b.size}, too few for the rank test)")


def unpaired_bootstrap_ci(a: np.ndarray, b: np.ndarray, *, confidence: float = 0.95, n_resamples: int = 10_000,
                          seed: int = 0) -> Interval:
    """Bootstrap CI of mean(b) - mean(a) for two independent samples, each resampled on its own."""
    return independent_bootstrap_ci((a, b), lambda x, y, axis=-1: mean_difference(y, x, axis), confidence=confidence,
                                    n_resamples=n_resamples, seed=seed, min_size=2)


# -- aggregates over training seeds (the rliable way) -----------------------------------------
# A percentile bootstrap over one value is that value, and over two it takes only three values:
# far too narrow to cover. Three is the least that gives an interval worth reading.
MIN_SEEDS_FOR_INTERVAL = 3
# Each statistic takes `axis` so scipy.stats.bootstrap can evaluate all resamples at once.

def iqm(values: np.ndarray, axis: int = -1) -> np.ndarray | float:
    """Interquartile mean: the mean of the middle 50% (scipy.stats.trim_mean, 25% cut each side),
    rliable's aggregate_iqm for one task."""
    from scipy import stats

    return stats.trim_mean(np.asarray(values, dtype=np.float64), proportiontocut=0.25, axis=axis)


def probability_of_improvement(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray | float:
    """P(X > Y) + P(X = Y) / 2 for one draw of each: the Mann-Whitney U of x over y divided by
    len(x) * len(y), rliable's probability_of_improvement for one task."""
    x = np.moveaxis(np.asarray(x, dtype=np.float64), axis, -1)[..., :, None]
    y = np.moveaxis(np.asarray(y, dtype=np.float64), axis, -1)[..., None, :]
    wins = (x > y).astype(np.float64) + 0.5 * (x == y)
    return wins.mean(axis=(-2, -1))


def mean_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray | float:
    return np.mean(x, axis=axis) - np.mean(y, axis=axis)


def iqm_difference(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray | float:
    return iqm(x, axis=axis) - iqm(y, axis=axis)


def ratio_of_means(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray | float:
    """mean(x) / mean(y): a speed-up when x and y are rates."""
    return np.mean(x, axis=axis) / np.mean(y, axis=axis)


def independent_bootstrap_ci(samples: tuple[np.ndarray, ...], statistic, *, confidence: float = 0.95,
                             n_resamples: int = 5_000, seed: int = 0,
                             min_size: int = MIN_SEEDS_FOR_INTERVAL) -> Interval:
    """Percentile bootstrap CI of statistic(*samples), each sample resampled on its own
    (rliable's stratified bootstrap, one task), by scipy.stats.bootstrap with a fixed seed."""
    from scipy import stats

    samples = tuple(np.asarray(s, dtype=np.float64) for s in samples)
    if min(s.size for s in samples) < min_size:
        raise ValueError(f"a bootstrap interval needs at least {min_size} values per sample, "
                         f"got {', '.join(str(s.size) for s in samples)}")
    result = stats.bootstrap(samples, statistic, confidence_level=confidence, n_resamples=n_resamples,
                             method=BOOTSTRAP_METHOD, rng=np.random.default_rng(seed), paired=False,
                             vectorized=True)
    return Interval(float(result.confidence_interval.low), float(result.confidence_interval.high), confidence,
                    BOOTSTRAP_METHOD, n_resamples, seed)


def _log_ratios(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return np.log(np.asarray(x, dtype=np.float64) / np.asarray(y, dtype=np.float64))


def geometric_mean_ratio(x: np.ndarray, y: np.ndarray) -> float:
    """The geometric mean of x_i / y_i: the speed-up of rates timed side by side in pairs."""
    return float(np.exp(_log_ratios(x, y).mean()))


def paired_ratio_interval(x: np.ndarray, y: np.ndarray, *, confidence: float = 0.95) -> tuple[float, float]:
    """The CI of geometric_mean_ratio(x, y) for rates timed side by side in
    pairs (a repeat of an interleaved benchmark): a Student t interval on the mean log ratio.
    With a handful of repeats a percentile bootstrap covers far less than it claims (about 77%
    for a nominal 95% at three), while t accounts for the few values; pairing by repeat takes
    out the drift that interleaving put on both rates alike."""
    from scipy import stats

    logs = _log_ratios(x, y)
    if logs.size < 2:
        raise ValueError(f"a ratio interval needs at least 2 pairs, got {logs.size}")
    centre, half = logs.mean(), stats.t.ppf(0.5 + confidence / 2, logs.size - 1) * stats.sem(logs)
    return float(np.exp(centre - half)), float(np.exp(centre + half))


SINGLE_ARM_STATISTICS = {"mean": np.mean, "iqm": iqm}
TWO_ARM_STATISTICS = {"mean_diff": mean_difference, "iqm_diff": iqm_difference,
                      "probability_of_improvement": probability_of_improvement, "speedup": ratio_of_means}


def seed_statistics(candidate: np.ndarray, baseline: np.ndarray | None = None, *,
                    comparisons: tuple[str, ...] = tuple(TWO_ARM_STATISTICS), seed: int = 0) -> dict[str, float]:
    """Point estimates and 95% percentile bootstrap CIs over seeds, as flat names: `mean`,
    `mean_ci_low`, `mean_ci_high`, `iqm`, ... for the candidate alone, and with a baseline each
    of `comparisons` (keys of TWO_ARM_STATISTICS) with its `_ci_low` / `_ci_high`. An interval
    needs MIN_SEEDS_FOR_INTERVAL values in each sample; with fewer only point estimates appear."""
    x = np.asarray(candidate, dtype=np.float64)
    pairs = [(name, (x,), f) for name, f in SINGLE_ARM_STATISTICS.items()]
    if baseline is not None:
        y = np.asarray(baseline, dtype=np.float64)
        pairs += [(name, (x, y), TWO_ARM_STATISTICS[name]) for name in comparisons
                  if not (name == "speedup" and y.mean() == 0)]
    found: dict[str, float] = {}
    for name, samples, statistic in pairs:
        found[name] = float(statistic(*samples))
        if min(s.size for s in samples) >= MIN_SEEDS_FOR_INTERVAL:
            ci = independent_bootstrap_ci(samples, statistic, seed=seed)
            found[f"{name}_ci_low"], found[f"{name}_ci_high"] = ci.low, ci.high
    return found
