"""A model whose batch dimension is fixed in its file at N: every place that runs a model feeds it in
calls of N (the runtime, the repair search's Q-values and latency, localisation, INT8 calibration,
the input adapter's check, `runner check`), and an N too large to run is refused in one line before
anything is allocated."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hostile_onnx import REFERENCE_ONNX, fixed_batch_onnx
from small_check import SMALL_CHECK, set_args
from user_exports import CleanRLQNetwork, export

from breakout_core.common.batch_calls import MAX_FIXED_BATCH
from breakout_core.conversion.input_convention import InputConvention, write_adapted
from breakout_core.conversion.quantize import quantize_int8
from breakout_core.diagnosis.localise import localise
from breakout_core.diagnosis.repair import interleaved_p50_ms, q_values
from breakout_core.evaluation.fixed_states import load_fixed_states
from breakout_core.runtimes.onnxruntime_runtime import OnnxRuntimeRuntime

REPO = Path(__file__).resolve().parents[1]
STATES = load_fixed_states(REPO / "models" / "reference" / "fixed_states_60.npz").obs
ODD = STATES[:13]  # no multiple of 8: the last call is filled up


@pytest.fixture(scope="module")
def batch_8(tmp_path_factory) -> Path:
    return fixed_batch_onnx(tmp_path_factory.mktemp("fixed") / "batch8.onnx", 8)


def test_q_values_runtime_and_latency_feed_a_fixed_batch_in_calls_of_it(batch_8):
    expected = q_values(REFERENCE_ONNX, ODD)
    assert np.max(np.abs(q_values(batch_8, ODD) - expected)) <= 1e-4
    with OnnxRuntimeRuntime(intra_op_threads=1) as runtime:  # the placement profile runs a call of 8 too
        assert np.max(np.abs(runtime.load(batch_8).infer(ODD) - expected)) <= 1e-4
        assert runtime.describe()["actual"]["static_batch"] == 8
    assert all(p50 > 0 for p50 in interleaved_p50_ms([batch_8, REFERENCE_ONNX], ODD, runs=64, warmup=2))


def test_openvino_feeds_a_fixed_batch_in_calls_of_it(batch_8):
    from breakout_core.runtimes.openvino_runtime import OpenVINORuntime

    ok, reason = OpenVINORuntime.available()
    if not ok:
        pytest.skip(reason)
    with OpenVINORuntime() as runtime:
        q = runtime.load(batch_8).infer(ODD)
        assert runtime.describe()["actual"]["static_batch"] == 8
    assert np.max(np.abs(q - q_values(REFERENCE_ONNX, ODD))) <= 1e-3


def test_localisation_reads_the_state_of_a_call_of_the_fixed_batch(batch_8):
    found = localise(REFERENCE_ONNX, batch_8, ODD[:3], flipped=[0])
    assert found.layers and all(layer.max_abs <= 1e-3 for layer in found.layers)


def test_int8_calibration_fills_the_last_call_of_a_fixed_batch(tmp_path, batch_8):
    calibration = STATES[:20]  # two calls of 8 and one of 4 filled up to 8
    made = quantize_int8(batch_8, tmp_path / "int8.onnx", method="static", calibration=calibration,
                         calibrate_method="minmax")
    assert made.calibration_states == 20
    with OnnxRuntimeRuntime(intra_op_threads=1, node_placement=False) as runtime:
        assert runtime.load(made.path).infer(ODD).shape == (13, 4)


def test_the_adapter_of_a_float_export_with_a_fixed_batch_is_checked_in_calls_of_it(tmp_path):
    exported = export(CleanRLQNetwork(), tmp_path / "cleanrl8.onnx", torch.zeros(8, 4, 84, 84))
    adapted = write_adapted(exported, InputConvention.parse("float32:0-255:nchw"), tmp_path / "a.onnx", ODD)
    assert adapted.states == 13 and adapted.max_abs_diff <= 1e-4


@pytest.mark.slow
def test_check_of_a_file_with_its_batch_fixed_at_8_gives_verdicts_and_a_document(tmp_path, batch_8):
    done = subprocess.run([sys.executable, "-m", "runner", "check", str(batch_8), "--json", *set_args(*SMALL_CHECK),
                           "--db", "r.duckdb", "--reports", "reports"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode in (0, 1), done.stderr
    assert "Traceback" not in done.stderr and "every batch runs as calls of 8" in done.stderr
    document = json.loads(done.stdout)
    files = {f["runtime"]: f for f in document["files"]}
    assert files["candidate"]["static_batch"] == 8 and files["baseline"]["static_batch"] is None
    verdicts = {v["verdict"]: v["outcome"] for v in document["verdicts"]}
    assert len(verdicts) == 5 and verdicts["same_decisions"] == "deployment-worthy"


def _measured(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess, float, float]:
    """`runner ARGS` as a process of its own: (the result, its seconds, its peak memory in MB)."""
    wrapper = ("import resource, subprocess, sys; done = subprocess.run(sys.argv[1:]); "
               "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, file=sys.stderr); "
               "sys.exit(done.returncode)")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", wrapper, sys.executable, "-m", "runner", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=120)
    seconds = time.monotonic() - started
    *said, peak_kb = done.stderr.strip().splitlines()
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, "\n".join(said)), seconds, \
        int(peak_kb) / 1024


@pytest.mark.parametrize("batch", [16384, 2**40], ids=["16384", "2^40"])
@pytest.mark.parametrize("command", [("check",), ("check", "--json"), ("convert", "int8")],
                         ids=["check", "check-json", "convert"])
def test_an_absurd_fixed_batch_is_refused_in_one_line_within_seconds_and_little_memory(tmp_path, batch, command):
    model = fixed_batch_onnx(tmp_path / "huge.onnx", batch)
    done, seconds, peak_mb = _measured(*command, str(model), "--db", "r.duckdb", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == "", (done.returncode, done.stderr[-2000:])
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: MODEL {model}: its batch dimension is fixed at {batch}")
    assert f"the largest fixed batch run is {MAX_FIXED_BATCH}" in lines[0]
    assert seconds < 30 and peak_mb < 500, (seconds, peak_mb)
    assert not (tmp_path / "r.duckdb").exists()
