"""Statistics for score comparisons: percentiles and paired bootstrap intervals."""

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
