"""The openvino runtime on the shipped model and its 60 fixed states: FP32 agrees with ONNX
Runtime FP32, FP16 and INT8 QDQ files load, what ran is read back (f32, not the CPU
plugin's bf16 default; pinning off), bad option values are one line and exit 2, and without
the package it is unavailable with the reason."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from breakout_core.diagnosis.parity import compare_q
from breakout_core.evaluation.fixed_states import load_fixed_states
from breakout_core.runtimes.openvino_runtime import cpu_capabilities
from breakout_core.runtimes.registry import make_runtime
from runner.cli.commands import main

needs_openvino = pytest.mark.skipif(importlib.util.find_spec("openvino") is None,
                                    reason="openvino is not installed (pip install -e '.[openvino]')")

REFERENCE = Path(__file__).resolve().parents[1] / "models" / "reference"
FP32, FP16 = REFERENCE / "dqn_breakout.onnx", REFERENCE / "dqn_breakout_fp16.onnx"
STATES = REFERENCE / "fixed_states_60.npz"


@pytest.fixture(scope="module")
def states() -> np.ndarray:
    return load_fixed_states(STATES).obs


def _q(runtime: str, path: Path, obs: np.ndarray, **options) -> tuple[np.ndarray, object]:
    with make_runtime(runtime, **options) as rt:
        rt.load(path)
        return rt.infer(obs), rt.actual()


@needs_openvino
def test_fp32_agrees_with_onnxruntime_fp32_on_all_60_fixed_states(states):
    assert len(states) == 60
    baseline, _ = _q("onnxruntime", FP32, states, intra_op_threads=1)
    candidate, actual = _q("openvino", FP32, states, threads=1)
    one_at_a_time = np.concatenate([_q("openvino", FP32, states[i:i + 1], threads=1)[0] for i in range(3)])
    parity = compare_q(baseline, candidate)
    assert parity.action_agreement == 60 and parity.max_abs_diff < 1e-5, parity
    assert np.abs(one_at_a_time - baseline[:3]).max() < 1e-5
    assert (actual.device, actual.precision, actual.provider) == ("cpu", "fp32", "CPU")
    assert actual.details["inference_precision"] == "f32"  # the hint as compiled, not the bf16 default
    assert actual.details["compute_layers_by_precision"] == {"f32": 5}  # 3 convolutions, 2 fully connected
    assert actual.details["cpu_pinning"] is False and actual.details["threads"] == 1
    assert actual.int8 is None and actual.cpu_isa["cpu"]


@needs_openvino
def test_fp16_file_computes_in_the_requested_precision(states):
    baseline, _ = _q("onnxruntime", FP32, states, intra_op_threads=1)
    candidate, actual = _q("openvino", FP16, states, threads=1)
    assert actual.details["weights_precision"] == "fp16" and actual.precision == "fp32"
    assert compare_q(baseline, candidate).max_abs_diff < 0.05  # fp16-rounded weights, f32 arithmetic


@needs_openvino
def test_int8_qdq_file_runs_integer_kernels_like_onnxruntime(tmp_path, states):
    from breakout_core.conversion.quantize import quantize_int8

    made = quantize_int8(FP32, tmp_path / "int8.onnx", calibration=states)
    ort_q, _ = _q("onnxruntime", made.path, states, intra_op_threads=1)
    ov_q, actual = _q("openvino", made.path, states, threads=1)
    assert actual.precision == "int8" and actual.int8.method == "static"
    assert actual.int8.nodes_quantized == made.nodes_quantized
    assert len(actual.int8.integer_kernels) == 5  # every convolution and fully connected layer on u8
    parity = compare_q(ort_q, ov_q)
    assert parity.action_agreement == 60 and parity.max_abs_diff < 1e-3, parity


@needs_openvino
def test_bf16_where_the_cpu_has_it_is_recorded_as_bf16(states):
    if "BF16" not in (cpu_capabilities() or ()):
        pytest.skip("this CPU does not compute bf16 in OpenVINO's CPU plugin")
    from breakout_core.diagnosis.parity import default_tolerance

    baseline, _ = _q("onnxruntime", FP32, states, intra_op_threads=1)
    candidate, actual = _q("openvino", FP32, states, threads=1, inference_precision="bf16")
    assert actual.precision == "bf16" and actual.details["compute_layers_by_precision"] == {"bf16": 5}
    assert compare_q(baseline, candidate, precision="bf16").allclose, default_tolerance("bf16")
    assert not compare_q(baseline, candidate).allclose  # bf16 is not fp32, and parity does not read it as such


SPEC = """\
name: ov
contract: {{name: breakout-v3, other_contracts: deliberate}}
artifacts:
  onnx_fp32: {{path: {fp32}}}
  fixed_states: {{path: {states}}}
runtimes:
  ort: {{runtime: onnxruntime, intra_op_threads: 1, artifact: onnx_fp32}}
  ov: {{runtime: openvino, threads: 1, {option}, artifact: onnx_fp32}}
measurements:
  - kind: parity
    name: parity
    fixed_states: fixed_states
    runtimes: [ort, ov]
"""


@needs_openvino
@pytest.mark.parametrize("option, message", [
    ("device: gpu", "runtimes.ov.device: Input should be 'cpu'"),
    ("performance_hint: fastest", "runtimes.ov.performance_hint: Input should be 'latency' or 'throughput'"),
    ("inference_precision: f16", "this CPU does not compute FP16"),
])
def test_bad_option_values_are_one_line_and_exit_2(write_spec, option, message):
    if option.endswith("f16") and "FP16" in (cpu_capabilities() or ()):
        pytest.skip("this CPU computes FP16 in OpenVINO's CPU plugin: no precision to refuse here")
    path = write_spec(SPEC.format(fp32=FP32, states=STATES, option=option))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}:8: ") and message in lines[0], lines


@needs_openvino
def test_a_good_spec_validates(write_spec):
    path = write_spec(SPEC.format(fp32=FP32, states=STATES, option="performance_hint: latency"))
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.output


def test_without_the_package_it_is_unavailable_with_the_reason():
    code = ("import sys; sys.modules['openvino'] = None\n"
            "from breakout_core.runtimes.registry import runtime_available, make_runtime\n"
            "print(runtime_available('openvino')); make_runtime('openvino', inference_precision='f16')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("(False, \"openvino cannot be imported (ModuleNotFoundError")
    assert "pip install -e '.[openvino]'" in out.stdout


@needs_openvino
def test_a_parity_run_stores_what_openvino_ran(write_spec, tmp_path):
    import duckdb

    path = write_spec(SPEC.format(fp32=FP32, states=STATES, option="performance_hint: latency"))
    result = CliRunner().invoke(main, ["run", str(path), "--db", str(tmp_path / "r.duckdb"), "--no-report",
                                       "--runs-dir", str(tmp_path / "runs")])
    assert result.exit_code == 0, result.output[-3000:]
    with duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True) as con:
        row = con.execute("SELECT backend, precision, actual_precision, device, provider, cpu_isa IS NOT NULL, "
                          "runtime_describe->>'$.actual.inference_precision' FROM runtime_status "
                          "WHERE runtime = 'ov'").fetchone()
        worst = con.execute("SELECT max(max_abs_dq) FROM parity_summary WHERE candidate = 'ov'").fetchone()[0]
    assert row == ("openvino", "fp32", "fp32", "cpu", "CPU", True, "f32")
    assert worst < 1e-5
