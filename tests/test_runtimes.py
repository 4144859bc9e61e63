"""Runtimes on real fixed states: torch vs ONNX Runtime CPU parity, copies, describe; the GPU runtimes
against the CPU where this machine has them, their unavailable path where it does not."""

from __future__ import annotations

import inspect
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest
from runtime_artifacts import N_STATES

from breakout_core.diagnosis.latency import measure_latency
from breakout_core.diagnosis.parity import TOLERANCES, compare_q
from breakout_core.runtimes.base import Option, Runtime, RuntimeUnavailable
from breakout_core.runtimes.onnxruntime_runtime import OnnxRuntimeRuntime
from breakout_core.runtimes.registry import RUNTIMES, make_runtime, runtime_available


def test_every_registered_backend_declares_what_the_runner_reads():
    """Derived from the registry, so a new backend is checked without an edit here: its name,
    documented module, the files it loads, options with valid defaults, what it needs of a
    machine, its extra, and an available() that says why not."""
    from runner.spec.runtimes import ARTIFACT_TYPES

    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert {"torch", "onnxruntime"} <= set(RUNTIMES)  # the reference backends stay registered
    for name, backend in RUNTIMES.items():
        assert backend.name == name and issubclass(backend, Runtime) and not inspect.isabstract(backend), name
        assert (sys.modules[backend.__module__].__doc__ or "").strip(), f"{name}: its module says nothing"
        assert backend.artifact_types and set(backend.artifact_types) <= set(ARTIFACT_TYPES.values()), name
        assert backend.EXTRA is None or backend.EXTRA in extras, f"{name}: extra {backend.EXTRA!r} not in pyproject"
        for key, option in backend.OPTIONS.items():
            assert isinstance(option, Option) and (option.choices or option.value_type), f"{name}.{key}"
        defaults = backend.resolve_options()
        assert set(defaults) == set(backend.OPTIONS), name
        assert backend.needs(defaults) <= {"gpu", "browser"}, name
        for weights in ("fp32", "fp16", "int8"):  # parity has a default tolerance for what it computes in
            assert backend.precision(defaults, weights) in TOLERANCES, (name, weights)
        ok, reason = backend.available(**defaults)
        assert isinstance(ok, bool) and isinstance(reason, str) and (ok == (reason == "")), (name, ok, reason)
        with pytest.raises(ValueError, match=f"runtime {name!r}: unknown option"):
            make_runtime(name, no_such_option=1)
    with pytest.raises(ValueError, match=f"unknown runtime 'tflite'; known: {', '.join(sorted(RUNTIMES))}"):
        make_runtime("tflite")
    assert isinstance(make_runtime("onnxruntime", provider="cpu"), OnnxRuntimeRuntime)
    with pytest.raises(ValueError, match="is not one of"):
        make_runtime("onnxruntime", provider="rocm")


def test_importing_the_package_imports_no_backend():
    code = ("import sys, breakout_core.runtimes; "
            "print(sorted(m for m in ('torch', 'onnxruntime', 'openvino', 'tensorrt', 'pycuda', 'playwright', "
            "'aiohttp') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("batch", [1, 8, N_STATES])
def test_torch_and_onnxruntime_cpu_agree_on_fixed_states(artifacts, batch):
    obs = artifacts.states.obs
    with make_runtime("torch") as torch_rt, make_runtime("onnxruntime", intra_op_threads=1) as ort_rt:
        torch_rt.load(artifacts.checkpoint)
        ort_rt.load(artifacts.export.onnx_path)
        chunks = [(torch_rt.infer(obs[i:i + batch]), ort_rt.infer(obs[i:i + batch])) for i in range(0, len(obs), batch)]
    baseline = np.concatenate([c[0] for c in chunks])
    candidate = np.concatenate([c[1] for c in chunks])
    assert baseline.shape == candidate.shape == (N_STATES, 4)
    assert baseline.dtype == candidate.dtype == np.float32
    parity = compare_q(baseline, candidate)
    assert parity.max_abs_diff < 1e-5
    assert parity.action_agreement == N_STATES
    assert parity.allclose
    print(f"batch {batch}: torch vs ORT CPU max |dQ| {parity.max_abs_diff:.3g}, mean {parity.mean_abs_diff:.3g}")


def test_onnxruntime_without_graph_optimizations_agrees_too(artifacts):
    obs = artifacts.states.obs
    with make_runtime("torch") as torch_rt, \
            make_runtime("onnxruntime", graph_optimization_level="disable", intra_op_threads=1) as ort_rt:
        torch_rt.load(artifacts.checkpoint)
        ort_rt.load(artifacts.export.onnx_path)
        parity = compare_q(torch_rt.infer(obs), ort_rt.infer(obs))
        assert ort_rt.describe()["actual"]["graph_optimization_level"] == "ORT_DISABLE_ALL"
    assert parity.max_abs_diff < 1e-5 and parity.action_agreement == N_STATES


@pytest.mark.parametrize("name", ["torch", "onnxruntime"])
def test_infer_returns_a_fresh_copy_and_checks_its_input(artifacts, name):
    artifact = artifacts.checkpoint if name == "torch" else artifacts.export.onnx_path
    obs = artifacts.states.obs[:2]
    options = {"intra_op_threads": 1} if name == "onnxruntime" else {}
    with make_runtime(name, **options) as rt:
        rt.load(artifact)
        first = rt.infer(obs)
        kept = first.copy()
        second = rt.infer(obs)
        assert not np.shares_memory(first, second)
        second[:] = 123.0  # scribbling over one result leaves the other alone
        np.testing.assert_array_equal(first, kept)
        np.testing.assert_array_equal(rt.infer(obs), kept)
        with pytest.raises(ValueError, match="uint8"):
            rt.infer(obs.astype(np.float32))
        with pytest.raises(ValueError, match=r"\(B, 4, 84, 84\)"):
            rt.infer(obs[:, :3])
    with pytest.raises(RuntimeError, match="not loaded"):
        rt.infer(obs)  # the context manager closed it


def test_describe_says_what_ran(artifacts):
    with make_runtime("torch") as torch_rt, make_runtime("onnxruntime", intra_op_threads=1) as ort_rt:
        torch_rt.load(artifacts.checkpoint)
        ort_rt.load(artifacts.export.onnx_path)
        t, o = torch_rt.describe(), ort_rt.describe()
    assert t["requested"] == {"device": "cpu", "precision": "fp32", "device_index": 0, "allow_tf32": False,
                              "threads": None}
    assert t["actual"]["device"] == "cpu" and t["actual"]["precision"] == "fp32"
    assert t["actual"]["contract_hash"] == artifacts.states.contract_hash
    assert "torch" in t["versions"] and t["artifact_sha256"]
    assert o["requested"]["provider"] == "cpu" and o["available"] is True
    actual = o["actual"]
    assert actual["providers"] == ["CPUExecutionProvider"] and actual["device"] == "cpu"
    assert actual["precision"] == "fp32"
    assert actual["node_count"] > 0 and actual["nodes_by_provider"] == {"CPUExecutionProvider": actual["node_count"]}
    assert actual["nodes_not_on_requested_provider"] == []
    assert {"Conv", "Gemm", "Cast"} <= {n["op"] for n in actual["nodes"]}
    assert "onnxruntime" in o["versions"]


def test_fp16_model_on_cpu_is_described_honestly(artifacts):
    with make_runtime("onnxruntime", intra_op_threads=1) as rt:
        rt.load(artifacts.export.fp16_path)
        actual = rt.describe()["actual"]
    assert actual["precision"] == "fp16"
    assert actual["provider"] == "CPUExecutionProvider"
    if actual["inserted_precision_casts"]:
        assert "FP32" in actual["precision_note"]


def test_cpu_ep_fallback_option_needs_a_non_cpu_provider(artifacts):
    # onnxruntime itself rejects "fallback to CPU disabled" together with the CPU provider
    with pytest.raises(ValueError, match="non-CPU provider"):
        make_runtime("onnxruntime", provider="cpu", disable_cpu_ep_fallback=True)
    with make_runtime("onnxruntime", node_placement=False, intra_op_threads=1) as rt:
        rt.load(artifacts.export.onnx_path)
        actual = rt.describe()["actual"]
    assert actual["cpu_ep_fallback_disabled"] is False and "nodes" not in actual


# Runtimes that need a GPU (or TensorRT): exercised where this machine has one, else their
# unavailable path is checked. `mentions` is what the reason names when they cannot run.
ACCELERATED = [
    ("tensorrt", {}, "tensorrt"),
    ("tensorrt", {"precision": "fp16"}, "tensorrt"),
    ("onnxruntime", {"provider": "cuda"}, "CUDAExecutionProvider"),
    ("onnxruntime", {"provider": "cuda", "disable_cpu_ep_fallback": True}, "CUDAExecutionProvider"),
    ("torch", {"device": "cuda"}, "CUDA"),
    ("torch", {"device": "cuda", "precision": "fp16"}, "CUDA"),
]


def _artifact_for(artifacts, name: str, options: dict):
    if name == "torch":
        return artifacts.checkpoint
    return artifacts.export.fp16_path if options.get("precision") == "fp16" else artifacts.export.onnx_path


def _assert_unavailable(artifacts, name: str, options: dict, mentions: str) -> None:
    """available() gives the reason, describe() repeats it, load() refuses with it and nothing runs."""
    ok, reason = runtime_available(name, **options)
    assert ok is False and reason and mentions in reason
    runtime = make_runtime(name, **options)  # constructing is fine: nothing touches a device
    info = runtime.describe()
    assert info["available"] is False and info["unavailable_reason"] == reason and info["actual"] is None
    with pytest.raises(RuntimeUnavailable) as caught:
        runtime.load(_artifact_for(artifacts, name, options))
    assert not isinstance(caught.value, ImportError)
    assert caught.value.reason == reason and reason in str(caught.value)
    with pytest.raises(RuntimeError, match="not loaded"):
        runtime.infer(artifacts.states.obs[:1])  # never ran on another device instead


@pytest.mark.gpu
@pytest.mark.parametrize("name,options,mentions", ACCELERATED)
def test_accelerated_runtime_agrees_with_cpu_where_it_runs_else_says_why(artifacts, name, options, mentions):
    """Where the GPU runtime can run: parity with torch on the CPU, its batch-1 latency, and
    what it built. Where it cannot: the reason, and a refusal to load."""
    if not runtime_available(name, **options)[0]:
        _assert_unavailable(artifacts, name, options, mentions)
        return
    obs = artifacts.states.obs
    precision = options.get("precision", "fp32")
    atol = rtol = 1e-4 if precision == "fp32" else 1e-2
    with make_runtime("torch") as cpu, make_runtime(name, **options) as rt:
        cpu.load(artifacts.checkpoint)
        rt.load(_artifact_for(artifacts, name, options))
        parity = compare_q(cpu.infer(obs), rt.infer(obs), atol=atol, rtol=rtol)
        latency = measure_latency(rt.infer, obs[:1], warmup=5, iterations=64)
        info = rt.describe()
    assert parity.candidate_nonfinite == 0 and parity.allclose, parity.summary()
    assert set(parity.disagreeing_states) <= set(parity.near_tie_states), parity.summary()
    assert latency.n == 64 and 0 < latency.p50_ms <= latency.p95_ms <= latency.max_ms
    actual = info["actual"]
    assert info["available"] is True and actual["precision"] == precision and actual["device"].startswith("cuda")
    if name == "tensorrt":  # an engine built for this GPU, written beside the ONNX file
        assert actual["engine_bytes"] > 0 and actual["layer_count"] > 0
    if name == "onnxruntime":
        assert actual["provider"] == "CUDAExecutionProvider"
    print(f"{name} {options}: max |dQ| {parity.max_abs_diff:.3g} vs torch CPU, batch-1 P50 {latency.p50_ms:.3f} ms")


def test_torch_fp16_on_cpu_is_unavailable_on_every_machine(artifacts):
    _assert_unavailable(artifacts, "torch", {"device": "cpu", "precision": "fp16"}, "fp16 on CPU")


def test_latency_of_a_runtime(artifacts):
    with make_runtime("onnxruntime", intra_op_threads=1, node_placement=False) as rt:
        rt.load(artifacts.export.onnx_path)
        result = measure_latency(rt.infer, artifacts.states.obs[:1], warmup=5, iterations=64)
    assert result.n == 64 and 0 < result.p50_ms <= result.p95_ms <= result.max_ms
    print(f"ORT CPU batch 1: P50 {result.p50_ms:.3f} ms, P95 {result.p95_ms:.3f} ms")
