"""Repair search: a layer that INT8 wrecks is found first and kept in float, every step is
recorded with its agreement, max |dQ| and interleaved latency, and the target is a parameter."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from tiny_onnx import fragile_weights, tiny_model, tiny_states

from breakout_core.diagnosis.repair import (
    Int8Converter,
    RepairTarget,
    choose_step,
    interleaved_p50_ms,
    q_values,
    repair_search,
)


@pytest.fixture(scope="module")
def fragile(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("fragile") / "fragile.onnx", fragile_weights())


def test_the_fragile_layer_is_found_first_and_kept_in_float(tmp_path, fragile):
    calibration, check = tiny_states(64, seed=1), tiny_states(100, seed=2)
    result = repair_search(fragile, check, tmp_path / "steps", convert=Int8Converter(calibration),
                           target=RepairTarget(min_agreement=0.95), latency_runs=64)
    assert result.order[0][0] == "fc_b"
    assert result.order[0][1] > 10 * max(score for _, score in result.order[1:])
    first, last = result.steps[0], result.steps[-1]
    assert first.excluded == () and not first.passes and first.agreement < 0.95
    assert result.chosen is last and last.passes and last.excluded == ("fc_b",) and len(result.steps) == 2
    assert last.agreement >= 0.95 and last.max_abs_dq < first.max_abs_dq
    assert "fc_b" not in last.nodes_converted and last.excluded_quantized_at_load == ()
    assert result.precision == "int8"
    for step in result.steps:
        assert step.path.exists() and step.path.parent == tmp_path / "steps"
        assert step.p50_ms > 0 and step.fp32_p50_ms > 0 and step.latency_ratio == step.p50_ms / step.fp32_p50_ms
    assert result.target.describe() == "greedy-action agreement >= 0.95"
    assert result.check_states == 100 and result.check_states_dropped == 0
    assert set(result.cpu) >= {"avx512_vnni", "avx_vnni", "int8_dot_product"}


def test_a_max_dq_target_and_another_calibration_method(tmp_path, fragile):
    percentile = Int8Converter(tiny_states(64, seed=1), calibrate_method="percentile")
    result = repair_search(fragile, tiny_states(60, seed=2), tmp_path, convert=percentile,
                           target=RepairTarget(min_agreement=None, max_abs_dq=1e-9), latency_runs=64)
    # nothing INT8 is that close: the list runs out, every step is kept and none is chosen
    assert result.chosen is None and not any(step.passes for step in result.steps)
    assert result.order[-1] == ("flatten", 0.0)  # a Reshape alone is not quantized at all
    # the step that would leave the Reshape alone quantized is never made: it would quantize nothing
    assert len(result.steps) == len(result.order) - 1 and result.steps[0].excluded == ()
    assert result.steps[-1].excluded == tuple(node for node, _ in result.order[:-2])
    assert result.target.describe() == "max |dQ| <= 1e-09"


def test_check_states_seen_in_calibration_are_left_out(tmp_path, fragile):
    calibration, check = tiny_states(64, seed=1), tiny_states(40, seed=2)
    check[:5] = calibration[:5]
    result = repair_search(fragile, check, tmp_path, convert=Int8Converter(calibration),
                           target=RepairTarget(min_agreement=0.5), latency_runs=64)
    assert result.check_states == 35 and result.check_states_dropped == 5
    with pytest.raises(ValueError, match="every check state is also a calibration state"):
        repair_search(fragile, calibration[:10], tmp_path, convert=Int8Converter(calibration), latency_runs=64)


def test_targets_and_latency_runs_are_checked(tmp_path, fragile):
    with pytest.raises(ValueError, match="needs min_agreement, max_abs_dq or both"):
        RepairTarget(min_agreement=None)
    with pytest.raises(ValueError, match=r"min_agreement must be in \[0, 1\]"):
        RepairTarget(min_agreement=95)
    with pytest.raises(ValueError, match="latency_runs must be >= 64"):
        repair_search(fragile, tiny_states(4, seed=9), tmp_path, convert=Int8Converter(tiny_states(16)),
                      latency_runs=10)


def test_batch_one_outputs_and_interleaved_latency(fragile):
    states = tiny_states(6)
    q = q_values(fragile, states)
    assert q.shape == (6, 4) and q.dtype == np.float32
    p50s = interleaved_p50_ms([fragile, fragile], states, runs=64, warmup=2)
    assert len(p50s) == 2 and all(p > 0 for p in p50s)


def test_the_choice_between_searches_ignores_latency_and_repeats(tmp_path, fragile):
    """Two calibration methods searched twice: both runs choose the same file, the one with
    the fewest nodes in float and then the lowest mean |dQ|, whatever the latency says."""
    calibration, check = tiny_states(64, seed=1), tiny_states(100, seed=2)
    target = RepairTarget(min_agreement=0.95)

    def searches(folder: Path) -> dict:
        return {method: repair_search(fragile, check, folder / method, target=target, latency_runs=64,
                                      convert=Int8Converter(calibration, calibrate_method=method))
                for method in ("minmax", "percentile")}

    first, second = searches(tmp_path / "a"), searches(tmp_path / "b")
    method, step, met = choose_step(first)
    assert met and step.passes
    passing = [s for result in first.values() for s in result.steps if s.passes]
    assert len(passing) == 2  # one per method, each with the fragile layer kept in float
    fewest = min(len(s.excluded) for s in passing)
    assert len(step.excluded) == fewest
    assert step.mean_abs_dq == min(s.mean_abs_dq for s in passing if len(s.excluded) == fewest)
    again = choose_step(second)
    assert (again[0], again[1].sha256, again[2]) == (method, step.sha256, True)
    # the latency ratios turned around (the other file ten times faster): the same file
    other = next(s for s in passing if s is not step)
    slowed = {name: replace(result, steps=tuple(replace(s, p50_ms=10 * s.fp32_p50_ms) if s is step else
                                                replace(s, p50_ms=0.1 * s.fp32_p50_ms) if s is other else s
                                                for s in result.steps))
              for name, result in first.items()}
    assert choose_step(slowed)[1].sha256 == step.sha256


def test_where_no_step_passes_the_closest_is_chosen(tmp_path, fragile):
    check = tiny_states(60, seed=2)
    strict = RepairTarget(min_agreement=None, max_abs_dq=1e-9)
    results = {method: repair_search(fragile, check, tmp_path / method, target=strict, latency_runs=64,
                                     convert=Int8Converter(tiny_states(64, seed=1), calibrate_method=method))
               for method in ("minmax", "percentile")}
    method, step, met = choose_step(results)
    steps = [s for result in results.values() for s in result.steps]
    assert not met and step.agreement == max(s.agreement for s in steps)
    assert step.max_abs_dq == min(s.max_abs_dq for s in steps if s.agreement == step.agreement)
    with pytest.raises(ValueError, match="no search made a step"):
        choose_step({})
