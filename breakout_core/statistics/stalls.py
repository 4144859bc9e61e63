"""Does a candidate run more games to the time limit than its baseline on the same seeds?

A game that reaches the contract's frame cap without ending (`ended_by == "time_limit"`) is
a stall: the agent keeps the ball alive, or stops serving, without scoring. Paired by seed,
each game is one of four cells: `b` games where the candidate alone stalled, `c` where the
baseline alone did. The question is one non-inferiority hypothesis about the excess, the
candidate's share of games to the time limit minus the baseline's (pi_b - pi_c): is it under
a tolerance? Two exact one-sided bounds answer it, each at `confidence`:

- high: the excess is at most pi_b, whose exact (Clopper-Pearson) upper bound is taken. It
  never reads tighter than b of n games allow: with no candidate-only stall in 30 games it
  is 9.5% at 95%.
- low: the excess is at least pi_b's exact lower bound minus pi_c's exact upper bound, each
  at half the error (so both hold together at `confidence`, by the union bound).

A rule `stall_excess_ci_high <= t` passes where the games show the excess is at most t, and
rejects only where the low bound shows it above t; between the two the data cannot decide.
The exact one-sided McNemar p-value (more stalls at all, at any size) is kept as a figure.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StallTest:
    games: int  # paired games
    candidate_stalls: int
    baseline_stalls: int
    only_candidate: int  # b: the candidate alone ran to the time limit
    only_baseline: int  # c: the baseline alone did
    p_value: float  # exact one-sided McNemar, P(X >= b | b + c, 1/2); 1 with no discordant game
    excess_low: float  # lower bound of the candidate's excess share of games to the time limit
    excess_high: float  # upper bound of the same
    confidence: float  # of each bound, one-sided

    def described(self) -> str:
        return (f"exact one-sided {self.confidence:.0%} bounds (Clopper-Pearson) on the excess share of "
                f"{self.games} paired games run to the time limit, {self.only_candidate} by the candidate alone "
                f"and {self.only_baseline} by the baseline alone (McNemar's p for more stalls at all: "
                f"{self.p_value:.3g}, a figure)")


def stall_test(candidate_stalled: np.ndarray, baseline_stalled: np.ndarray, *, confidence: float = 0.95) -> StallTest:
    """The exact bounds of the candidate's excess stalls over paired games (the two arrays:
    whether each game on the same seed ran to the time limit)."""
    from scipy.stats import binom

    candidate_stalled = np.asarray(candidate_stalled, dtype=bool)
    baseline_stalled = np.asarray(baseline_stalled, dtype=bool)
    if candidate_stalled.shape != baseline_stalled.shape or candidate_stalled.ndim != 1:
        raise ValueError("stalls are paired by seed: give two 1-D arrays of the same length")
    n = len(candidate_stalled)
    if n == 0:
        raise ValueError("no paired games to test")
    if not 0.5 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
    alpha = 1.0 - confidence
    b = int((candidate_stalled & ~baseline_stalled).sum())
    c = int((baseline_stalled & ~candidate_stalled).sum())
    d = b + c
    p_value = float(binom.sf(b - 1, d, 0.5)) if d else 1.0
    return StallTest(games=n, candidate_stalls=int(candidate_stalled.sum()),
                     baseline_stalls=int(baseline_stalled.sum()), only_candidate=b, only_baseline=c,
                     p_value=p_value, excess_low=share_low(b, n, alpha / 2) - share_high(c, n, alpha / 2),
                     excess_high=share_high(b, n, alpha), confidence=confidence)


def share_high(k: int, n: int, alpha: float) -> float:
    """Exact one-sided upper bound, at error `alpha`, of a share seen k times in n."""
    from scipy.stats import beta

    return 1.0 if k == n else float(beta.ppf(1 - alpha, k + 1, n - k))


def share_low(k: int, n: int, alpha: float) -> float:
    """Exact one-sided lower bound, at error `alpha`, of a share seen k times in n."""
    from scipy.stats import beta

    return 0.0 if k == 0 else float(beta.ppf(alpha, k, n - k + 1))


@dataclass(frozen=True)
class StallRuleRates:
    """How often the rule `stall_excess_ci_high <= tolerance` ends each way, exactly."""

    deployment_worthy: float
    rejected: float

    @property
    def inconclusive(self) -> float:
        return 1.0 - self.deployment_worthy - self.rejected


def stall_rule_rates(games: int, only_candidate: float, only_baseline: float, *, tolerance: float = 0.1,
                     confidence: float = 0.95) -> StallRuleRates:
    """The rule's outcome rates over every outcome of `games` paired games, summed exactly over
    the trinomial where each game is a candidate-only stall with chance `only_candidate` and a
    baseline-only stall with chance `only_baseline` (the true excess is their difference)."""
    from scipy.special import gammaln

    if not (0 <= only_candidate and 0 <= only_baseline and only_candidate + only_baseline <= 1):
        raise ValueError("the chances of a candidate-only and a baseline-only stall are shares summing to at most 1")
    alpha, k = 1.0 - confidence, np.arange(games + 1)
    b, c = np.meshgrid(k, k, indexing="ij")
    possible = (b + c <= games) & ((b == 0) | (only_candidate > 0)) & ((c == 0) | (only_baseline > 0))
    rest = np.where(possible, games - b - c, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_p = (gammaln(games + 1) - gammaln(b + 1) - gammaln(c + 1) - gammaln(rest + 1)
                 + np.where(b > 0, b * np.log(only_candidate), 0.0) + np.where(c > 0, c * np.log(only_baseline), 0.0)
                 + np.where(rest > 0, rest * np.log1p(-only_candidate - only_baseline), 0.0))
    p = np.where(possible, np.exp(log_p), 0.0)
    high = np.array([share_high(i, games, alpha) for i in k])
    low = (np.array([share_low(i, games, alpha / 2) for i in k])[:, None]
           - np.array([share_high(i, games, alpha / 2) for i in k])[None, :])
    return StallRuleRates(deployment_worthy=float(p[high[b] <= tolerance].sum()),
                          rejected=float(p[low > tolerance].sum()))
