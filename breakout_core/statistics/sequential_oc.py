"""Operating characteristics of the staged games test (breakout_core.statistics.sequential), by simulation:
how often it ends non-inferior, inferior or inconclusive, and after how many games, when
paired games are drawn from a given population. The tests assert its error rates on recorded
games with it and benchmarks/games_power.py prints its power; both run the rule the runner
runs (the plan's looks and confidences, the same interval and decisions), on many
sequences at once.

A population is recorded pairs of scores (candidate, baseline on one seed), resampled whole
with replacement, the candidate's scores shifted so that the mean difference is the one asked
for: 0 for an equal model, minus the margin for one exactly on it. With a margin that is a
fraction of the baseline's mean, each look's margin is that fraction of the baseline's mean
over the sequence's games so far, as the runner computes it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from breakout_core.statistics.sequential import (
    CONTINUE,
    INCONCLUSIVE,
    INFERIOR,
    NON_INFERIOR,
    SequentialPlan,
    decide,
    interval,
)


@dataclass(frozen=True)
class OperatingCharacteristics:
    sequences: int
    non_inferior: float  # share of sequences that ended so
    inferior: float
    inconclusive: float
    mean_games: float  # games a runtime when the sequence stopped, on average
    covered: float  # share whose final interval held the population's mean difference

    def standard_error(self, share: float) -> float:
        """The Monte Carlo standard error of a share near `share` over these sequences."""
        return float(np.sqrt(max(share, 1e-3) * (1 - share) / self.sequences))


def recorded_families(path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The populations of pairs (candidate, baseline scores) from a CSV of recorded games with
    columns seed, ort_fp32, ort_fp16, ort_int8_kept (tests/data/paired_games.csv):

    - fp16: FP16 against FP32 (many identical games);
    - int8: the INT8 file against FP32 as recorded (rare big games on both sides);
    - int8_right_skewed: the same without the games FP32 won by more than 200 points, so that
      every rare big game is the candidate's (250-340 points), as docs/int8_cpu.md records
      of the repaired INT8 file;
    - left_tail_collapses: int8_right_skewed mirrored (rare games lost by as much)."""
    rows = np.genfromtxt(path, delimiter=",", names=True)
    fp32, int8 = rows["ort_fp32"], rows["ort_int8_kept"]
    right = int8 - fp32 > -200
    return {"fp16": (rows["ort_fp16"], fp32), "int8": (int8, fp32), "int8_right_skewed": (int8[right], fp32[right]),
            "left_tail_collapses": (2 * fp32[right] - int8[right], fp32[right])}


def shifted_pairs(candidate: np.ndarray, baseline: np.ndarray, mean_diff: float) -> tuple[np.ndarray, np.ndarray]:
    """The pairs with the candidate's scores shifted so that their mean difference is `mean_diff`."""
    candidate, baseline = np.asarray(candidate, np.float64), np.asarray(baseline, np.float64)
    return candidate - (candidate - baseline).mean() + mean_diff, baseline


def simulate(plan: SequentialPlan, candidate: np.ndarray, baseline: np.ndarray, *, sequences: int,
             seed: int = 0, margin_fraction: float | None = None) -> OperatingCharacteristics:
    """Run the staged test on `sequences` sequences of pairs drawn with replacement from
    (candidate, baseline), with the plan's margin or, where `margin_fraction` is given, that
    fraction of the baseline's mean at each look."""
    if (plan.margin is None) == (margin_fraction is None):
        raise ValueError("give the plan a margin in points or margin_fraction, one of them")
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(candidate), size=(sequences, plan.max_games))
    d = np.asarray(candidate, np.float64)[picks] - np.asarray(baseline, np.float64)[picks]
    b = np.asarray(baseline, np.float64)[picks]
    truth = float(np.mean(np.asarray(candidate, np.float64) - np.asarray(baseline, np.float64)))
    decision = np.full(sequences, CONTINUE, dtype=object)
    games = np.zeros(sequences, dtype=np.int64)
    covered = np.zeros(sequences, dtype=bool)
    for look, n in enumerate(plan.look_games(), start=1):
        open_ = np.flatnonzero(decision == CONTINUE)
        if open_.size == 0:
            break
        low, high = interval(d[open_, :n], plan.look_confidence(look))
        margins = (np.full(open_.size, plan.margin) if margin_fraction is None
                   else np.maximum(0.0, margin_fraction * b[open_, :n].mean(axis=1)))
        at_cap = n >= plan.max_games
        decided = np.array([decide(lo, hi, m, at_cap=at_cap) for lo, hi, m in zip(low, high, margins)], dtype=object)
        decision[open_] = decided
        games[open_] = n
        covered[open_] = (low <= truth) & (truth <= high)
    return OperatingCharacteristics(sequences=sequences, non_inferior=float(np.mean(decision == NON_INFERIOR)),
                                    inferior=float(np.mean(decision == INFERIOR)),
                                    inconclusive=float(np.mean(decision == INCONCLUSIVE)),
                                    mean_games=float(games.mean()), covered=float(covered.mean()))
