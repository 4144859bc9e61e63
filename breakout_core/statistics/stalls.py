"""Does a candidate run more games to the time limit than its baseline on the same seeds?

A game that reaches the contract's frame cap without ending (`ended_by == "time_limit"`) is
a stall: the agent keeps the ball alive, or stops serving, without scoring. Paired by seed,
each game is one of four cells; only the discordant ones say anything about a difference:
`b` games where the candidate alone stalled, `c` where the baseline alone did. Under "no
difference" b is Binomial(b + c, 1/2) given b + c, and the exact one-sided McNemar test's
p-value is P(X >= b).

The bounds are on the excess, the candidate's share of games to the time limit minus the
baseline's (pi_b - pi_c), each one-sided at `confidence`:

- high: the excess is at most pi_b, whose exact (Clopper-Pearson) upper bound is taken. It
  never reads tighter than b of n games allow: with no candidate-only stall in 30 games it
  is 9.5% at 95%.
- low: where the McNemar test finds more stalls (p below 1 - confidence) it is positive:
  the exact lower bound of b / (b + c), q_lo > 1/2, as an excess (2 q_lo - 1) times the
  exact lower bound of the discordant share; its sign is the test's decision. Otherwise it
  is minus the exact upper bound of pi_c (the excess is at least -pi_c), never above 0.

So a rule `stall_excess_ci_low <= 0` rejects exactly when the test finds more stalls, and
`stall_excess_ci_high <= t` passes where the games show the excess is at most t; between the
two the data cannot decide.
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
        return (f"exact one-sided McNemar test on the {self.only_candidate + self.only_baseline} discordant of "
                f"{self.games} paired games (p = {self.p_value:.3g}); excess share bounds each one-sided "
                f"{self.confidence:.0%} (Clopper-Pearson)")


def stall_test(candidate_stalled: np.ndarray, baseline_stalled: np.ndarray, *, confidence: float = 0.95) -> StallTest:
    """The exact test and bounds of the candidate's excess stalls over paired games (the two
    arrays: whether each game on the same seed ran to the time limit)."""
    from scipy.stats import beta, binom

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

    def upper(k: int) -> float:  # exact one-sided upper bound of a share seen k times in n
        return 1.0 if k == n else float(beta.ppf(confidence, k + 1, n - k))

    if p_value < alpha:
        q_low = float(beta.ppf(alpha, b, d - b + 1))
        share_low = float(beta.ppf(alpha, d, n - d + 1))
        low = (2 * q_low - 1) * share_low
    else:
        low = -upper(c)
    return StallTest(games=n, candidate_stalls=int(candidate_stalled.sum()),
                     baseline_stalls=int(baseline_stalled.sum()), only_candidate=b, only_baseline=c,
                     p_value=p_value, excess_low=low, excess_high=upper(b), confidence=confidence)
