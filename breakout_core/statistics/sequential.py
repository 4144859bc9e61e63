"""Games in stages until the interval decides: a group-sequential non-inferiority test on
paired score differences (candidate minus baseline, one pair of games per seed).

The plan fixes in advance the games per stage and the cap, hence the looks (ceil(cap /
stage size), at least MIN_LOOKS). Alpha is spent over the looks by an O'Brien-Fleming-type
function of the information fraction t = n / cap (Lan and DeMets): f(t) = 2 - 2 Phi(z / sqrt(t)),
z the normal quantile at 1 - alpha / 2, so f(1) = alpha. Look k's interval has confidence
1 - (f(t_k) - f(t_(k-1))). By Bonferroni's inequality all the looks' intervals cover the true
mean with probability at least 1 - alpha, whatever their correlation, so the interval
reported when the test stops covers it too; that is what makes looking after every stage
safe. Decisions, with the margin in score points (fixed in the plan, or given at each look:
a fraction of the baseline's mean over the games so far, whose own noise is a tenth or so of
that mean's standard error and is left out of the interval):

- non-inferior: the interval's low end is above -margin;
- inferior: its high end is below -margin;
- continue: neither, and the cap is not reached;
- inconclusive: neither, at the cap.

Why these choices, measured on this project's recorded paired games
(tests/test_games_operating_characteristics.py, docs/statistics.md):

- Score differences are skewed and heavy-tailed: a repaired INT8 file's rare games of
  250-340 points carry its mean. A sample that happens to hold none of them has a low mean
  and a small SD, and a Student t interval then calls "inferior" too often at the margin
  (over 5% against a 2.5% bound, alpha split evenly over 8 looks). Hall's (1992)
  transformation of the studentised mean removes its skewness to second order, widening
  the interval on the side the sample's skew points to; but where rare games fall on both
  sides, a sample holding only one side's leans the wrong way. Each look's interval is
  therefore the hull of the Student t interval and Hall's: a look decides only where both
  intervals do, so its interval misses the true mean on a side only where both miss it.
- The sample lacking its rare games is most likely in a small early stage. The
  O'Brien-Fleming-type spending makes the early looks strict (at 50 of 400 games the
  interval is at 1 - 3e-8) and the last ones close to a single test at alpha.

Every game identical (paired SD 0) gives the interval [0, 0] and decides at the first look.
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
MIN_LOOKS = 3  # fewer looks leave the early, strict looks too few games to be worth stopping at
INTERVAL_METHOD = ("hull of the Student t and Hall-transformed intervals of the mean paired difference, alpha "
                   "spent over the looks by an O'Brien-Fleming-type function (Bonferroni across looks)")


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
            raise ValueError(f"stage_games must be >= 2 (an interval needs two differences), got {self.stage_games}")
        if self.max_games < self.stage_games:
            raise ValueError(f"max_games ({self.max_games}) must be >= stage_games ({self.stage_games})")
        if not 0 < self.alpha < 1:
            raise ValueError(f"alpha must be in (0, 1), got {self.alpha}")
        if self.looks < MIN_LOOKS:
            raise ValueError(f"{self.max_games} games in stages of {self.stage_games} are {self.looks} look(s); "
                             f"a plan needs at least {MIN_LOOKS}")

    @property
    def looks(self) -> int:
        """The planned number of looks, K: one after each stage up to the cap."""
        return math.ceil(self.max_games / self.stage_games)

    def look_games(self) -> list[int]:
        """The differences at each planned look: a stage's worth more each time, the cap last."""
        return [min(k * self.stage_games, self.max_games) for k in range(1, self.looks + 1)]

    def look_alphas(self) -> list[float]:
        """The alpha each look spends: the O'Brien-Fleming-type function's increments, summing to alpha."""
        from scipy import stats

        z = float(stats.norm.ppf(1 - self.alpha / 2))
        spent = [0.0] + [2 * float(stats.norm.sf(z / math.sqrt(n / self.max_games))) for n in self.look_games()]
        return [b - a for a, b in zip(spent, spent[1:])]

    def look_confidence(self, look: int) -> float:
        """Look `look`'s (1, 2, ...) interval confidence."""
        return 1 - self.look_alphas()[look - 1]


@dataclass(frozen=True)
class Look:
    """The test after one stage."""

    stage: int  # 1, 2, ...
    n: int  # differences so far
    mean: float
    sd: float  # sample SD, ddof=1
    low: float
    high: float
    confidence: float  # of this look's interval
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
        d = np.concatenate(self._differences)
        stage = len(self.looks) + 1
        confidence = self.plan.look_confidence(stage)
        low, high = (float(v[0]) for v in interval(d[None, :], confidence))
        look = Look(stage=stage, n=d.size, mean=float(d.mean()), sd=float(d.std(ddof=1)), low=low, high=high,
                    confidence=confidence, margin=margin,
                    decision=decide(low, high, margin, at_cap=d.size >= self.plan.max_games))
        self.looks.append(look)
        return look

    def differences(self) -> np.ndarray:
        """Every difference fed so far, in order."""
        return np.concatenate(self._differences) if self._differences else np.empty(0)


def decide(low: float, high: float, margin: float, *, at_cap: bool) -> str:
    """A look's decision from its interval and margin."""
    if low > -margin:
        return NON_INFERIOR
    if high < -margin:
        return INFERIOR
    return INCONCLUSIVE if at_cap else CONTINUE


def interval(d: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Each look's interval for the mean of each row of `d`: the hull of the Student t interval
    and Hall's, both at `confidence`."""
    t_low, t_high = t_interval(d, confidence)
    h_low, h_high = hall_interval(d, confidence)
    return np.minimum(t_low, h_low), np.maximum(t_high, h_high)


def t_interval(d: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Student t intervals for the mean of each row of `d`."""
    from scipy import stats

    d = np.asarray(d, dtype=np.float64)
    n = d.shape[1]
    half = float(stats.t.ppf(1 - (1 - confidence) / 2, n - 1)) * d.std(axis=1, ddof=1) / math.sqrt(n)
    return d.mean(axis=1) - half, d.mean(axis=1) + half


def hall_interval(d: np.ndarray, confidence: float) -> tuple[np.ndarray, np.ndarray]:
    """Two-sided intervals for the mean of each row of `d` (rows of n >= 2 differences).

    With T = (mean - mu) / s and g the sample skewness, Hall's transformation
    h(T) = T + g T^2 / 3 + g^2 T^3 / 27 + g / (6 n) makes sqrt(n) h(T) close to symmetric;
    h is monotone (h(T) = ((1 + g T / 3)^3 - 1) / g + g / (6 n)), so the interval inverts it
    at Student t quantiles. A row with SD 0 gets [mean, mean]."""
    from scipy import stats

    d = np.asarray(d, dtype=np.float64)
    n = d.shape[1]
    mean = d.mean(axis=1)
    sd = d.std(axis=1, ddof=1)
    centred = d - mean[:, None]
    spread = np.where(sd > 0, sd, 1.0)
    skew = np.where(sd > 0, (centred ** 3).mean(axis=1) / spread ** 3, 0.0)
    q = float(stats.t.ppf(1 - (1 - confidence) / 2, n - 1)) / math.sqrt(n)

    def inverse(u: float) -> np.ndarray:
        v = u - skew / (6 * n)
        safe = np.where(np.abs(skew) > 1e-12, skew, 1.0)
        return np.where(np.abs(skew) > 1e-12, 3 / safe * (np.cbrt(1 + skew * v) - 1), v)

    return mean - sd * inverse(q), mean - sd * inverse(-q)


def fragile_games(d: np.ndarray, look: Look, *, at_cap: bool) -> list[tuple[int, str]]:
    """The games (indices into `d`, the look's differences) whose removal alone would change
    the look's decision, each with the decision it would become: the same confidence and
    margin over the other n - 1 differences."""
    d = np.asarray(d, dtype=np.float64)
    if d.size < 4:
        return []
    others = np.array([np.delete(d, i) for i in range(d.size)])
    lows, highs = interval(others, look.confidence)
    changed = []
    for i, (low, high) in enumerate(zip(lows, highs)):
        decision = decide(float(low), float(high), look.margin, at_cap=at_cap)
        if decision != look.decision:
            changed.append((i, decision))
    return changed


def run_sequential(stages: Iterable[np.ndarray], plan: SequentialPlan) -> SequentialTest:
    """Feed stages (an iterable of arrays, e.g. a generator that plays each stage's games only
    when asked) until the test decides or the stages run out; the test holds every look."""
    test = SequentialTest(plan)
    for block in stages:
        if test.add(block).decision != CONTINUE:
            break
    return test
