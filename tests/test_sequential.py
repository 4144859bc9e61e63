"""Games in stages: the staged interval's coverage under repeated looks, early stops on clear
cases, an inconclusive end at the cap, the plan's checks, Hall's interval and the games a
decision hangs on. Its error rates on recorded games: test_games_operating_characteristics.py."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from breakout_core.statistics.sequential import (
    CONTINUE,
    INCONCLUSIVE,
    INFERIOR,
    NON_INFERIOR,
    SequentialPlan,
    SequentialTest,
    fragile_games,
    hall_interval,
    interval,
    run_sequential,
    t_interval,
)
from breakout_core.statistics.sequential_oc import simulate

SD = 29.0  # the spread of paired Breakout score differences this test has in mind
SEQUENCES = 2000


def _stages(rng: np.random.Generator, mean: float, plan: SequentialPlan, played: list[int]):
    """Stages of normal differences, drawn only when the test asks for them."""
    left = plan.max_games
    while left > 0:
        size = min(plan.stage_games, left)
        played.append(size)
        left -= size
        yield rng.normal(mean, SD, size)


def test_the_plan_spends_alpha_over_its_looks_strictly_at_first():
    plan = SequentialPlan(margin=5.0)
    assert (plan.stage_games, plan.max_games, plan.alpha, plan.looks) == (50, 400, 0.05, 8)
    alphas = plan.look_alphas()
    assert sum(alphas) == pytest.approx(0.05) and all(a < b for a, b in zip(alphas, alphas[1:]))
    assert plan.look_confidence(1) > 1 - 1e-7 and plan.look_confidence(8) == pytest.approx(1 - alphas[-1])
    z = stats.norm.ppf(0.975)  # the O'Brien-Fleming-type function's value at half the games
    assert sum(alphas[:4]) == pytest.approx(2 * stats.norm.sf(z / np.sqrt(0.5)))
    three = SequentialPlan(margin=5.0, stage_games=50, max_games=120)
    assert three.looks == 3 and three.look_games() == [50, 100, 120]


@pytest.mark.parametrize("true_mean", [0.0, -5.0, -9.0])
def test_the_reported_interval_covers_the_true_mean_despite_the_looks(true_mean):
    """2000 sequences of normal differences (SD 29) in stages of 50 up to 400, margin 5: the
    interval reported when each stops covers the true mean in at least 95% of them, within
    three Monte Carlo standard errors. At -5 (on the margin) most run to the cap and use every look."""
    plan = SequentialPlan(margin=5.0)
    population = np.random.default_rng(20_000 + int(-true_mean)).normal(true_mean, SD, 50_000)
    found = simulate(plan, population, np.zeros_like(population), sequences=SEQUENCES, seed=int(-true_mean))
    assert found.covered >= 0.95 - 3 * np.sqrt(0.95 * 0.05 / SEQUENCES)
    assert found.non_inferior + found.inferior + found.inconclusive == pytest.approx(1.0)
    if true_mean == -5.0:
        assert found.mean_games > 0.9 * plan.max_games


def test_a_clear_case_stops_long_before_the_cap():
    plan = SequentialPlan(margin=15.0)
    played: list[int] = []
    test = run_sequential(_stages(np.random.default_rng(1), 0.0, plan, played), plan)
    assert test.decision == NON_INFERIOR and len(test.looks) <= 2 and played == [50] * len(test.looks)
    look = test.looks[-1]
    assert look.low > -15 and look.confidence == pytest.approx(plan.look_confidence(len(test.looks)))

    played = []
    worse = run_sequential(_stages(np.random.default_rng(2), -40.0, plan, played), plan)
    assert worse.decision == INFERIOR and worse.looks[-1].high < -15 and len(played) <= 2


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
    with pytest.raises(ValueError, match="100 games in stages of 50 are 2 look.* at least 3"):
        SequentialPlan(margin=1.0, stage_games=50, max_games=100)
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
    plan = SequentialPlan(margin=None, stage_games=50, max_games=150)
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


def test_hall_interval_is_the_t_interval_on_symmetric_differences_and_leans_with_their_skew():
    symmetric = np.tile([-20.0, -5.0, 5.0, 20.0], 15)[None, :]
    low, high = hall_interval(symmetric, 0.95)
    t = stats.t.ppf(0.975, 59) * symmetric.std(ddof=1) / np.sqrt(60)
    assert (low[0], high[0]) == (pytest.approx(-t), pytest.approx(t))
    rng = np.random.default_rng(3)
    skewed = np.concatenate([rng.normal(-3, 25, 97), [250.0, 300.0, 330.0]])[None, :]
    low, high = hall_interval(skewed, 0.95)
    mean = skewed.mean()
    assert high[0] - mean > mean - low[0]  # a right skew: more room above the mean than below
    assert [v[0] for v in hall_interval(np.full((1, 50), -2.0), 0.999)] == [-2.0, -2.0]
    hull, t, hall = interval(skewed, 0.95), t_interval(skewed, 0.95), hall_interval(skewed, 0.95)
    assert hull[0][0] == min(t[0][0], hall[0][0]) and hull[1][0] == max(t[1][0], hall[1][0])


def test_the_games_a_decision_hangs_on_are_named():
    """Three big games carry a non-inferiority; removing any of them alone changes it."""
    plan = SequentialPlan(margin=8.0, stage_games=40, max_games=100)
    bulk = np.random.default_rng(4).normal(0, 1, 97)
    block = np.concatenate([(bulk - bulk.mean()) / bulk.std(ddof=1) * 15 - 5.25, [90.0, 95.0, 100.0]])
    test = run_sequential([block[:40], block[40:80], block[80:]], plan)
    look = test.looks[-1]
    assert look.decision == NON_INFERIOR and look.n == 100
    assert fragile_games(test.differences(), look, at_cap=True) == [(97, INCONCLUSIVE), (98, INCONCLUSIVE),
                                                                     (99, INCONCLUSIVE)]
    steady = SequentialTest(plan)
    assert fragile_games(np.zeros(40), steady.add(np.zeros(40)), at_cap=False) == []
