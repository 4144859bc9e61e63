"""Games in stages until the interval decides: a group-sequential non-inferiority test on
paired score differences (candidate minus baseline, one pair of games per seed).

The plan fixes in advance the games per stage and the cap, hence the number of looks K
(ceil(cap / stage size)). At each look the interval for the mean difference is a Student t
interval at confidence 1 - alpha / K over every difference so far. By Bonferroni's
inequality the K intervals all cover the true mean with probability at least 1 - alpha, so
the interval reported when the test stops, at whichever look, covers it with at least that
probability too; that is what makes looking after every stage safe. Decisions, with the
margin in score points (fixed in the plan, or given at each look: a fraction of the
baseline's mean over the games so far, whose own noise is a tenth or so of that mean's
standard error and is left out of the interval):

- non-inferior: the interval's low end is above -margin;
- inferior: its high end is below -margin;
- continue: neither, and the cap is not reached;
- inconclusive: neither, at the cap.

Bonferroni is chosen over an O'Brien-Fleming-type alpha-spending boundary because it needs
no numerical boundary computation and holds whatever the looks' sizes; the price is a wider
interval at the later looks (at K = 8 and alpha 0.05 each look is a 99.375% interval), and
coverage above 1 - alpha. The t interval leans on the mean of the differences being near
normal, which fifty or more bounded score differences per stage give unless they are very
skewed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

NON_INFERIOR = "non-inferior"
INFERIOR = "inferior"
CONTINUE = "continue"
INCONCLUSIVE = "inconclusive"


@dataclass(frozen=True)
class SequentialPlan:
    margin: float | None  # the largest mean score loss still called non-inferior, > 0; None: given at each look
    stage_games: int = 50  # paired differences per stage
    max_games: int = 400  # the cap
    alpha: float = 0.05  # the chance that any look's interval misses the true mean, at most

    def __post_init__(self) -> None:
        if self.margin is not None and not self.margin > 0:
            raise ValueError(f"margin must be > 0 score points, got {self.margin}")
        if self.stage_games < 2:
            raise ValueError(f"stage_games must be >= 2 (a t interval needs two differences), got {self.stage_games}")
        if self.max_games < self.stage_games:
            raise ValueError(f"max_games ({self.max_games}) must be >= stage_games ({self.stage_games})")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")

    @property
    def looks(self) -> int:
        """The planned number of looks, K: one after each stage up to the cap."""
        return math.ceil(self.max_games / self.stage_games)

    @property
    def look_confidence(self) -> float:
        """Each look's interval confidence, 1 - alpha / K."""
        return 1 - self.alpha / self.looks


@dataclass(frozen=True)
class Look:
    """The test after one stage."""

    stage: int  # 1, 2, ...
    n: int  # differences so far
    mean: float
    sd: float  # sample SD, ddof=1
    low: float
    high: float
    confidence: float  # of this look's interval, 1 - alpha / K
    margin: float  # the margin this look decided with
    decision: str  # NON_INFERIOR, INFERIOR, CONTINUE or INCONCLUSIVE


@dataclass
class SequentialTest:
    """Feed stages of paired differences with `add`; each returns the look's decision. A
    decision other than CONTINUE is final: adding after it is refused."""

    plan: SequentialPlan
    looks: list[Look] = field(default_factory=list)
    _differences: list[np.ndarray] = field(default_factory=list, repr=False)

    @property
    def decision(self) -> str:
        return self.looks[-1].decision if self.looks else CONTINUE

    @property
    def n(self) -> int:
        return sum(d.size for d in self._differences)

    def add(self, differences: np.ndarray, margin: float | None = None) -> Look:
        """Take one stage's differences (candidate minus baseline per seed) and look, with the
        plan's margin or, where the plan has none, `margin` (>= 0: a zero margin asks for the
        interval to lie above zero)."""
        if margin is None:
            margin = self.plan.margin
        if margin is None:
            raise ValueError("this plan's margin is given at each look")
        if not (math.isfinite(margin) and margin >= 0):
            raise ValueError(f"a look's margin must be finite and >= 0 score points, got {margin}")
        if self.decision != CONTINUE:
            raise ValueError(f"the test has already decided: {self.decision} after {self.n} games")
        block = np.asarray(differences, dtype=np.float64).reshape(-1)
        if block.size != self.plan.stage_games and self.n + block.size != self.plan.max_games:
            raise ValueError(f"a stage has {self.plan.stage_games} differences (or those left to the cap), "
                             f"got {block.size}")
        if self.n + block.size > self.plan.max_games:
            raise ValueError(f"{self.n + block.size} differences would pass the cap of {self.plan.max_games}")
        if not np.all(np.isfinite(block)):
            raise ValueError("score differences must be finite")
        self._differences.append(block)
        look = _look(np.concatenate(self._differences), len(self.looks) + 1, self.plan, margin)
        self.looks.append(look)
        return look


def run_sequential(stages: Iterable[np.ndarray], plan: SequentialPlan) -> SequentialTest:
    """Feed stages (an iterable of arrays, e.g. a generator that plays each stage's games only
    when asked) until the test decides or the stages run out; the test holds every look."""
    test = SequentialTest(plan)
    for block in stages:
        if test.add(block).decision != CONTINUE:
            break
    return test


def _look(d: np.ndarray, stage: int, plan: SequentialPlan, margin: float) -> Look:
    from scipy import stats

    n, mean = d.size, float(d.mean())
    sd = float(d.std(ddof=1))
    half = float(stats.t.ppf(1 - plan.alpha / plan.looks / 2, n - 1)) * sd / math.sqrt(n)
    low, high = mean - half, mean + half
    if low > -margin:
        decision = NON_INFERIOR
    elif high < -margin:
        decision = INFERIOR
    else:
        decision = INCONCLUSIVE if n >= plan.max_games else CONTINUE
    return Look(stage=stage, n=n, mean=mean, sd=sd, low=low, high=high, confidence=plan.look_confidence,
                margin=margin, decision=decision)
