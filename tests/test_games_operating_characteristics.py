"""The staged games rule's error rates, on games this project recorded (tests/data/paired_games.csv:
benchmarks/paired_games.yaml's run, FP32 against FP16 and against a repaired INT8 file on 100
fresh seeds), for the plans the shipped specs run it with (specs/check_onnx.yaml and
specs/int8_cpu.yaml).

Four populations of paired games (breakout_core.statistics.sequential_oc.recorded_families), each
resampled whole and shifted to a chosen mean difference: real FP16 pairs (many identical
games), real INT8 pairs as recorded, the INT8 pairs right-skewed (every rare game of 250-340
points the candidate's: the one game FP32 won by 236 left out) and left-tail collapses (those
mirrored). On each:

- an equal model (mean difference 0) is called inferior no more often than 2.5%;
- a model exactly on the margin (mean difference minus 10% of the baseline's mean) is called
  non-inferior no more often than 2.5%, and inferior no more often than 2.5%.

Each share is allowed three Monte Carlo standard errors over its bound. A Student t interval
with alpha split evenly over the looks (the rule this one replaced) calls the right-skewed
population inferior at the margin in about 5% of sequences, and the collapses non-inferior in
about 7%, and fails here. Power and expected games:
benchmarks/games_power.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from breakout_core.statistics.sequential_oc import recorded_families, shifted_pairs, simulate
from runner.spec.document import load_spec
from runner.spec.fields import seed_count

REPO = Path(__file__).resolve().parents[1]
DATA = Path(__file__).resolve().parent / "data" / "paired_games.csv"
SEQUENCES = 4000
BOUND = 0.025  # each direction's error: half the plan's alpha of 0.05
FAMILIES = recorded_families(DATA)


def shipped_plan(spec: str, measurement: str):
    """(plan, margin fraction) of a shipped spec's staged games, as the spec loads."""
    found = next(m for m in load_spec(REPO / "specs" / spec).spec.measurements if m.name == measurement)
    return found.stages.plan(seed_count(found.seeds)), found.stages.fraction


PLANS = {"check_onnx": shipped_plan("check_onnx.yaml", "games"),
         "int8_cpu": shipped_plan("int8_cpu.yaml", "int8_games")}


def _run(plan_name: str, family: str, mean_diff_in_margins: float, seed: int):
    plan, fraction = PLANS[plan_name]
    candidate, baseline = FAMILIES[family]
    candidate, baseline = shifted_pairs(candidate, baseline, -mean_diff_in_margins * fraction * baseline.mean())
    return simulate(plan, candidate, baseline, sequences=SEQUENCES, seed=seed, margin_fraction=fraction)


def test_the_recorded_games_are_the_populations_described():
    fp16, int8, right, collapses = (FAMILIES[f][0] - FAMILIES[f][1] for f in FAMILIES)
    assert len(fp16) == len(int8) == 100 and len(right) == 99
    assert np.mean(fp16 == 0) > 0.2 and np.median(fp16) == 0  # many identical games
    big = (FAMILIES["int8_right_skewed"][0] >= 250) & (FAMILIES["int8_right_skewed"][0] <= 340)
    assert big.sum() == 2 and right.min() > -100 and np.mean(right) > np.median(right)  # rare big games carry the mean
    assert np.array_equal(collapses, -right)


@pytest.mark.parametrize("plan_name", PLANS)
def test_an_unchanged_model_is_non_inferior_at_the_first_look(plan_name):
    plan, fraction = PLANS[plan_name]
    baseline = FAMILIES["fp16"][1]
    found = simulate(plan, baseline, baseline, sequences=200, margin_fraction=fraction)
    assert found.non_inferior == 1.0 and found.mean_games == plan.stage_games


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("plan_name", PLANS)
def test_an_equal_model_is_not_called_inferior(plan_name, family):
    found = _run(plan_name, family, 0.0, seed=1)
    assert found.inferior <= BOUND + 3 * found.standard_error(BOUND), found


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("plan_name", PLANS)
def test_a_model_on_the_margin_is_misjudged_at_most_as_often_as_the_plan_says(plan_name, family):
    found = _run(plan_name, family, 1.0, seed=2)
    assert found.non_inferior <= BOUND + 3 * found.standard_error(BOUND), found
    assert found.inferior <= BOUND + 3 * found.standard_error(BOUND), found
