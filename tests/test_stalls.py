"""The stalls verdict: games run to the time limit by a candidate against its baseline on the
same seeds. The exact test and its bounds hold their stated error exactly (enumerated over
every outcome of 30 paired games), and the shipped rules decide on rows of a real store."""

from __future__ import annotations

from math import comb
from pathlib import Path

import numpy as np
import pytest

from breakout_core.statistics.stalls import share_high, share_low, stall_rule_rates, stall_test
from runner.kinds.shared.stalls import stall_metrics
from runner.run.verdicts import decide
from runner.spec.document import load_spec
from runner.store.database import Store

REPO = Path(__file__).resolve().parents[1]


def paired(n: int, only_candidate: int, only_baseline: int, both: int = 0) -> tuple[np.ndarray, np.ndarray]:
    candidate, baseline = np.zeros(n, dtype=bool), np.zeros(n, dtype=bool)
    candidate[:only_candidate + both] = True
    baseline[only_candidate:only_candidate + both + only_baseline] = True
    return candidate, baseline


def test_the_bounds_are_exact_shares_and_the_p_value_the_exact_binomial_tail():
    for b in range(9):
        for c in range(9):
            test = stall_test(*paired(40, b, c, both=2))
            d = b + c
            exact = sum(comb(d, k) for k in range(b, d + 1)) / 2 ** d if d else 1.0
            assert test.p_value == pytest.approx(exact, rel=1e-12)
            assert test.excess_high == pytest.approx(share_high(b, 40, 0.05))
            assert test.excess_low == pytest.approx(share_low(b, 40, 0.025) - share_high(c, 40, 0.025))
            assert test.excess_low < test.excess_high
            assert (test.only_candidate, test.only_baseline, test.candidate_stalls, test.baseline_stalls) == \
                (b, c, b + 2, c + 2)
    assert stall_test(*paired(30, 0, 0)).excess_high == pytest.approx(1 - 0.05 ** (1 / 30))  # 9.5%


def test_both_bounds_hold_their_error_over_every_outcome_of_30_games():
    """For each true (candidate-only, baseline-only) stall rate, the chance that the upper bound
    lies below the true excess, or the lower bound above it, summed exactly over the trinomial."""
    n = 30
    bounds = {(b, c): stall_test(*paired(n, b, c)) for b in range(n + 1) for c in range(n + 1 - b)}
    log_factorial = np.concatenate([[0.0], np.cumsum(np.log(np.arange(1, n + 1)))])
    worst_high = worst_low = 0.0
    for pi_b in (0.0, 0.01, 0.05, 0.1, 0.2, 0.4):
        for pi_c in (0.0, 0.01, 0.05, 0.1, 0.2, 0.4):
            excess, missed_high, missed_low = pi_b - pi_c, 0.0, 0.0
            for (b, c), test in bounds.items():
                if (b and pi_b == 0) or (c and pi_c == 0):
                    continue  # impossible outcomes
                rest = n - b - c
                log_p = log_factorial[n] - log_factorial[b] - log_factorial[c] - log_factorial[rest]
                log_p += (b * np.log(pi_b) if b else 0.0) + (c * np.log(pi_c) if c else 0.0)
                log_p += rest * np.log1p(-pi_b - pi_c) if rest else 0.0
                p = float(np.exp(log_p))
                missed_high += p if test.excess_high < excess else 0.0
                missed_low += p if test.excess_low > excess else 0.0
            worst_high, worst_low = max(worst_high, missed_high), max(worst_low, missed_low)
    assert worst_high <= 0.05 and worst_low <= 0.05
    assert worst_high > 0.02 and worst_low > 0.01  # exact, not vacuous: some true rates come near the bound


def test_the_exact_rates_are_those_of_the_verdict_over_every_outcome():
    """stall_rule_rates, which the benchmark and the rates below use, sums the rule the runner
    decides by: checked against stall_test on each outcome of 40 games."""
    n, only_candidate, only_baseline = 40, 0.15, 0.05
    worthy = rejected = 0.0
    for b in range(n + 1):
        for c in range(n + 1 - b):
            p = comb(n, b) * comb(n - b, c) * only_candidate ** b * only_baseline ** c * \
                (1 - only_candidate - only_baseline) ** (n - b - c)
            test = stall_test(*paired(n, b, c))
            worthy += p if test.excess_high <= 0.1 else 0.0
            rejected += p if test.excess_low > 0.1 else 0.0
    rates = stall_rule_rates(n, only_candidate, only_baseline)
    assert rates.deployment_worthy == pytest.approx(worthy, abs=1e-12)
    assert rates.rejected == pytest.approx(rejected, abs=1e-12)
    assert worthy > 0 and rejected > 0


@pytest.mark.parametrize("games", [30, 50, 100, 200, 400])
def test_one_hypothesis_at_the_tolerance_errs_at_most_five_percent_either_way(games):
    """An excess exactly at 10 points: passed at most 5%, and never more often rejected; a small
    excess is not rejected, however many games; equal models pass by the games the staged test
    plays for them."""
    for only_candidate, only_baseline in ((0.10, 0.0), (0.11, 0.01), (0.12, 0.02), (0.15, 0.05), (0.3, 0.2)):
        at_tolerance = stall_rule_rates(games, only_candidate, only_baseline)
        assert at_tolerance.deployment_worthy <= 0.05
        assert at_tolerance.rejected <= 0.05
    for only_candidate, only_baseline in ((0.04, 0.02), (0.06, 0.02), (0.08, 0.0)):
        assert stall_rule_rates(games, only_candidate, only_baseline).rejected <= 0.005
    if games >= 200:
        assert stall_rule_rates(games, 0.03, 0.03).deployment_worthy >= 0.99
        assert stall_rule_rates(games, 0.04, 0.02).deployment_worthy >= 0.9  # 2 points more passes
        assert stall_rule_rates(games, 0.25, 0.05).rejected >= 0.5  # 20 points more is rejected


def test_bad_pairs_are_refused():
    with pytest.raises(ValueError, match="paired by seed"):
        stall_test(np.zeros(3, dtype=bool), np.zeros(4, dtype=bool))
    with pytest.raises(ValueError, match="no paired games"):
        stall_test(np.zeros(0, dtype=bool), np.zeros(0, dtype=bool))


def _games(store: Store, run_id: str, policy: str, stalled: np.ndarray) -> None:
    store.append_rows("episodes", [
        {"run_id": run_id, "measurement": "games", "policy": policy, "seed": 3000 + i, "score": 10.0,
         "steps": 27_000 if s else 900, "frames": 108_000 if s else 3_600,
         "ended_by": "time_limit" if s else "game_over", "action_noop": 1, "action_fire": 1, "action_right": 1,
         "action_left": 1, "wall_s": 1.0, "contract_hash": "h"}
        for i, s in enumerate(stalled)])


@pytest.fixture(scope="module")
def no_more_stalls():
    return next(v for v in load_spec(REPO / "specs" / "check_onnx.yaml").spec.verdicts if v.name == "no_more_stalls")


@pytest.mark.parametrize("only_candidate, only_baseline, outcome", [
    (0, 0, "deployment-worthy"),  # 30 games alike bound the excess at 9.5%
    (15, 0, "rejected"),  # half the candidate's games stall, none of the baseline's alone: above 10 points
    (6, 0, "inconclusive"),  # more stalls (McNemar's p = 1/64), but not shown above 10 points
    (2, 0, "inconclusive"),
    (4, 3, "inconclusive"),
])
def test_the_shipped_stalls_verdict_on_rows_of_a_real_store(tmp_path, no_more_stalls, only_candidate, only_baseline,
                                                            outcome):
    verdict = no_more_stalls
    store = Store(tmp_path / "r.duckdb")
    candidate, baseline = paired(30, only_candidate, only_baseline, both=1)
    _games(store, "r1", "candidate", candidate)
    _games(store, "r1", "baseline", baseline)
    with store.reader() as con:
        found = stall_metrics(con, "r1", "games", "candidate", "baseline")
        assert stall_metrics(con, "r1", "games", "candidate", "nobody") == {}
    decided, reason, evidence = decide(verdict, found)
    assert decided == outcome, reason
    assert found["candidate_time_limit_games"] == only_candidate + 1
    assert found["time_limit_only_baseline"] == only_baseline
    assert "Clopper-Pearson" in found["stall_method"]
    if outcome == "inconclusive":
        assert "straddles" in reason
