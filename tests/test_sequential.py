"""Games in stages: the staged interval's coverage under repeated looks, early stops on clear
cases, an inconclusive end at the cap, and the plan's checks."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from breakout_core.sequential import (
    CONTINUE,
    INCONCLUSIVE,
    INFERIOR,
    NON_INFERIOR,
    SequentialPlan,
    SequentialTest,
    run_sequential,
)

SD = 29.0  # the spread of paired Breakout score differences this test has in mind
SEQUENCES = 2000


def _stages(rng: np.random.Generator, mean: float, plan: SequentialPlan, played: list[int] | None = None):
    """Stages of normal differences, drawn only when the test asks for them."""
    left = plan.max_games
    while left > 0:
        size = min(plan.stage_games, left)
        if played is not None:
            played.append(size)
        left -= size
        yield rng.normal(mean, SD, size)


def test_the_plan_splits_alpha_over_its_looks():
    plan = SequentialPlan(margin=5.0)
    assert (plan.stage_games, plan.max_games, plan.alpha) == (50, 400, 0.05)
    assert plan.looks == 8 and plan.look_confidence == pytest.approx(1 - 0.05 / 8)
    assert SequentialPlan(margin=5.0, stage_games=50, max_games=120).looks == 3


@pytest.mark.parametrize("true_mean", [0.0, -5.0, -9.0])
def test_the_reported_interval_covers_the_true_mean_despite_the_looks(true_mean):
    """2000 sequences of normal differences (SD 29) in stages of 50 up to 400, margin 5: the
    interval reported when each stops covers the true mean in at least 95% of them, within
    three Monte Carlo standard errors. At -5 (on the margin) most run to the cap and use every look."""
    plan = SequentialPlan(margin=5.0)
    rng = np.random.default_rng(20_000 + int(-true_mean))
    covered, stops = 0, []
    for _ in range(SEQUENCES):
        test = run_sequential(_stages(rng, true_mean, plan), plan)
        final = test.looks[-1]
        covered += final.low <= true_mean <= final.high
        stops.append(final.n)
        assert final.decision != CONTINUE  # every sequence ends decided or at the cap
    mc_error = np.sqrt(0.95 * 0.05 / SEQUENCES)
    assert covered / SEQUENCES >= 0.95 - 3 * mc_error
    if true_mean == -5.0:
        assert np.mean(np.asarray(stops) == plan.max_games) > 0.5


def test_a_clear_case_stops_at_the_first_look():
    plan = SequentialPlan(margin=15.0)
    played: list[int] = []
    test = run_sequential(_stages(np.random.default_rng(1), 0.0, plan, played), plan)
    assert test.decision == NON_INFERIOR and len(test.looks) == 1 and test.n == 50 and played == [50]
    look = test.looks[0]
    assert look.low > -15 and look.confidence == pytest.approx(1 - 0.05 / 8)
    t = stats.t.ppf(1 - 0.05 / 8 / 2, 49)  # a two-sided 1 - alpha / K Student t interval
    assert look.high - look.low == pytest.approx(2 * t * look.sd / np.sqrt(50))

    played = []
    worse = run_sequential(_stages(np.random.default_rng(2), -40.0, plan, played), plan)
    assert worse.decision == INFERIOR and worse.looks[-1].high < -15 and played == [50]


def test_identical_agents_are_non_inferior_at_once():
    test = SequentialTest(SequentialPlan(margin=1.0))
    look = test.add(np.zeros(50))
    assert look.decision == NON_INFERIOR and (look.low, look.high, look.sd) == (0.0, 0.0, 0.0)


def test_the_cap_without_a_decision_is_inconclusive_with_its_figures():
    plan = SequentialPlan(margin=5.0, stage_games=50, max_games=120)
    block = -5.0 + SD * np.tile([1.0, -1.0], 25)  # mean exactly on the margin
    test = SequentialTest(plan)
    assert test.add(block).decision == CONTINUE
    assert test.add(block).decision == CONTINUE
    last = test.add(block[:20])  # the last stage is what is left to the cap
    assert last.decision == INCONCLUSIVE and last.n == 120 and last.stage == 3
    assert last.mean == pytest.approx(-5.0) and last.low < -5 < last.high
    with pytest.raises(ValueError, match="already decided: inconclusive after 120 games"):
        test.add(block)


def test_stages_that_break_the_plan_are_refused():
    with pytest.raises(ValueError, match="margin must be > 0"):
        SequentialPlan(margin=0.0)
    with pytest.raises(ValueError, match="max_games .* must be >= stage_games"):
        SequentialPlan(margin=1.0, stage_games=50, max_games=40)
    with pytest.raises(ValueError, match=r"alpha must be in \(0, 1\)"):
        SequentialPlan(margin=1.0, alpha=1.5)
    test = SequentialTest(SequentialPlan(margin=5.0, stage_games=50, max_games=120))
    with pytest.raises(ValueError, match="a stage has 50 differences"):
        test.add(np.zeros(30))
    with pytest.raises(ValueError, match="must be finite"):
        test.add(np.full(50, np.nan))
    undecided = -5.0 + SD * np.tile([1.0, -1.0], 25)
    test.add(undecided)
    test.add(undecided)
    with pytest.raises(ValueError, match="would pass the cap of 120"):
        test.add(np.zeros(50))


def test_a_margin_given_at_each_look_decides_that_look():
    """A plan without a margin takes one per look (a fraction of the baseline's mean so far):
    the same differences decide against a wide margin and go on against a narrow one."""
    block = -3.0 + SD * np.tile([1.0, -1.0], 25)
    plan = SequentialPlan(margin=None, stage_games=50, max_games=100)
    wide, narrow = SequentialTest(plan), SequentialTest(plan)
    assert wide.add(block, margin=30.0).decision == NON_INFERIOR and wide.looks[0].margin == 30.0
    look = narrow.add(block, margin=4.0)
    assert look.decision == CONTINUE and look.margin == 4.0 and look.low < -4.0 < look.high
    zero = SequentialTest(plan).add(np.full(50, 2.0) + np.tile([0.1, -0.1], 25), margin=0.0)
    assert zero.decision == NON_INFERIOR and zero.low > 0
    with pytest.raises(ValueError, match="margin is given at each look"):
        SequentialTest(plan).add(block)
    with pytest.raises(ValueError, match="finite and >= 0"):
        SequentialTest(plan).add(block, margin=-1.0)
