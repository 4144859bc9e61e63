"""INT8 with onnxruntime's quantizer: provenance, the exact input preprocessing, exclusions,
calibration methods, clear errors, and the CPU's INT8 instruction sets."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, numpy_helper
from tiny_onnx import no_float_ops_model, tiny_model, tiny_states

from breakout_core.common.hashing import file_sha256
from breakout_core.conversion.quantize import (
    CALIBRATION_OPTIONS,
    MIN_CALIBRATION_STATES,
    NothingToQuantize,
    QuantizeError,
    cpu_isa,
    quantize_int8,
)
from breakout_core.diagnosis.localise import localise
from breakout_core.evaluation.fixed_states import load_fixed_states

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "models" / "reference" / "dqn_breakout.onnx"
FIXED = ROOT / "models" / "reference" / "fixed_states_60.npz"
SHIPPED_NODES = ("node_conv2d", "node_conv2d_1", "node_conv2d_2", "node_Reshape_8", "node_linear", "node_linear_1")


@pytest.fixture(scope="module")
def fixed_states() -> np.ndarray:
    return load_fixed_states(FIXED).obs


@pytest.fixture(scope="module")
def static_int8(tmp_path_factory, fixed_states):
    out = tmp_path_factory.mktemp("int8") / "static.onnx"
    return quantize_int8(SHIPPED, out, method="static", calibration=fixed_states, calibrate_method="minmax")


def _run(path: Path, states: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return session.run(None, {"obs": states})[0]


def test_static_int8_of_the_shipped_model_records_its_provenance(static_int8, fixed_states):
    art = static_int8
    assert art.method == "static" and art.calibrate_method == "minmax" and art.per_channel
    assert art.calibration_states == len(fixed_states) == 60
    assert art.nodes_quantized == SHIPPED_NODES and art.nodes_excluded == ()
    assert art.sha256 == file_sha256(art.path) and art.size_bytes == art.path.stat().st_size
    assert art.source_sha256 == file_sha256(SHIPPED)
    assert art.onnxruntime_version == ort.__version__
    model = onnx.load(art.path)
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["breakout.precision"] == "int8" and meta["breakout.int8_calibration_states"] == "60"
    assert meta["breakout.int8_calibrate_method"] == "minmax"
    ops = [n.op_type for n in model.graph.node]
    assert "QuantizeLinear" in ops and "DequantizeLinear" in ops
    # QInt8 weights, QUInt8 activations
    weights = {i.name: i.data_type for i in model.graph.initializer}
    assert weights["torso.0.weight_quantized"] == TensorProto.INT8
    assert weights["relu_scale"] == TensorProto.FLOAT and weights["relu_zero_point"] == TensorProto.UINT8
    q = _run(art.path, fixed_states)
    assert q.shape == (60, 4) and q.dtype == np.float32 and np.all(np.isfinite(q))


def test_the_uint8_input_survives_quantization_exactly(static_int8, fixed_states):
    """Cast and /255 stay float, and the scaled input is quantized with scale 1/255: pixels
    brighter than any calibration pixel (the fixed states reach 148) are not clipped."""
    assert fixed_states.max() < 255
    assert static_int8.input_scale == pytest.approx(1 / 255)
    assert any(c.startswith("preprocessing in graph: Cast uint8 -> float32, Div by 255") for c in static_int8.checks)
    bright = fixed_states[:4].copy()
    bright[:, :, :10, :10] = 255
    bright[:, :, 10:20, :10] = np.arange(100, dtype=np.uint8).reshape(10, 10) + 156
    found = localise(SHIPPED, static_int8.path, bright)
    scaled = next(layer for layer in found.layers if layer.tensor == "div")
    assert scaled.candidate_tensor == "div_DequantizeLinear_Output"
    assert scaled.max_abs < 1e-7


def test_quant_pre_process_leaves_the_shipped_graph_as_it_is(tmp_path):
    """The pre-processing runs shape inference only, so the FP32 file's node names still hold."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    quant_pre_process(str(SHIPPED), str(tmp_path / "pre.onnx"), skip_optimization=True)
    before, after = onnx.load(SHIPPED), onnx.load(tmp_path / "pre.onnx")
    assert [(n.name, n.op_type) for n in after.graph.node] == [(n.name, n.op_type) for n in before.graph.node]


def test_excluding_the_last_layer_keeps_its_weights_float(tmp_path, fixed_states):
    art = quantize_int8(SHIPPED, tmp_path / "x.onnx", calibration=fixed_states, nodes_to_exclude=["node_linear_1"])
    assert art.nodes_excluded == ("node_linear_1",)
    assert "node_linear_1" not in art.nodes_quantized and art.excluded_quantized_at_load == ()
    initializers = {i.name: i for i in onnx.load(art.path).graph.initializer}
    assert initializers["head.2.weight"].data_type == TensorProto.FLOAT
    assert "head.2.weight_quantized" not in initializers
    meta = {p.key: p.value for p in onnx.load(art.path).metadata_props}
    assert meta["breakout.int8_nodes_excluded"] == "node_linear_1"


def test_a_layer_excluded_between_quantized_ones_is_quantized_when_onnxruntime_loads_it(tmp_path):
    """onnxruntime's WeightBiasQuantization transformer gives int8 weights to a Conv that reads a
    DequantizeLinear output and feeds a quantized tensor: the artifact says so."""
    fp32 = tiny_model(tmp_path / "tiny.onnx")
    art = quantize_int8(fp32, tmp_path / "x.onnx", calibration=tiny_states(32), nodes_to_exclude=["conv_b"])
    assert "conv_b" not in art.nodes_quantized
    assert art.excluded_quantized_at_load == ("conv_b",)
    assert any("quantized by onnxruntime when it loads" in c for c in art.checks)


def test_dynamic_int8_needs_no_calibration(tmp_path, fixed_states):
    art = quantize_int8(SHIPPED, tmp_path / "dyn.onnx", method="dynamic")
    assert art.method == "dynamic" and art.calibrate_method is None and art.calibration_states == 0
    assert art.calibration_options == {}
    assert set(art.nodes_quantized) == {"node_conv2d", "node_conv2d_1", "node_conv2d_2", "node_linear",
                                        "node_linear_1"}
    assert art.input_scale is None  # requantized per batch from its own range
    ops = {n.op_type for n in onnx.load(art.path).graph.node}
    assert {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger"} <= ops
    one = np.concatenate([_run(art.path, fixed_states[i:i + 1]) for i in range(4)])
    assert one.shape == (4, 4) and np.all(np.isfinite(one))
    with pytest.raises(QuantizeError, match="dynamic quantization .* give no calibration states"):
        quantize_int8(SHIPPED, tmp_path / "d2.onnx", method="dynamic", calibration=fixed_states)


def test_the_calibration_methods_give_their_own_ranges(tmp_path):
    """Entropy gets a histogram finer than its quantized bins, so it is not min/max in disguise.
    (Through quantize_static alone it gets 128 bins for 128 quantized bins and equals min/max.)"""
    fp32 = tiny_model(tmp_path / "tiny.onnx")
    states = tiny_states(64)
    scales = {}
    for method in ("minmax", "entropy", "percentile"):
        art = quantize_int8(fp32, tmp_path / f"{method}.onnx", calibration=states, calibrate_method=method)
        assert art.calibrate_method == method and art.calibration_states == 64
        assert art.calibration_options == CALIBRATION_OPTIONS[method]
        model = onnx.load(art.path)
        scales[method] = {i.name: float(numpy_helper.to_array(i)) for i in model.graph.initializer
                          if i.name.endswith("_scale") and i.dims == [] and not i.name.startswith("x01")}
    assert scales["entropy"] != scales["minmax"]
    assert scales["percentile"] != scales["minmax"]


def test_calibration_errors_are_one_line(tmp_path, fixed_states):
    cases = [
        ({"calibration": None}, "static quantization needs calibration states; none were given"),
        ({"calibration": fixed_states[:0]}, "none were given"),
        ({"calibration": fixed_states[:MIN_CALIBRATION_STATES["minmax"] - 1]},
         f"minmax calibration needs at least 16 states, got {MIN_CALIBRATION_STATES['minmax'] - 1}"),
        ({"calibration": fixed_states, "calibrate_method": "entropy"},
         "entropy calibration needs at least 64 states, got 60"),
        ({"calibration": fixed_states, "calibrate_method": "percentile"}, "percentile calibration needs at least 64"),
        ({"calibration": fixed_states.astype(np.float32)},
         "calibration states are float32; dqn_breakout.onnx takes uint8: give them as its input takes them"),
        ({"calibration": fixed_states.astype(np.float64)}, "calibration states must be 4-D observations"),
        ({"calibration": fixed_states[0]}, "calibration states must be 4-D observations"),
        ({"calibration": fixed_states, "calibrate_method": "kl"}, "unknown calibrate_method 'kl'"),
        ({"calibration": fixed_states, "method": "qat"}, "unknown quantization method 'qat'"),
    ]
    for kwargs, message in cases:
        with pytest.raises(QuantizeError, match=re.escape(message)) as caught:
            quantize_int8(SHIPPED, tmp_path / "x.onnx", **kwargs)
        assert "\n" not in str(caught.value)


def test_an_unknown_excluded_node_is_named_with_valid_ones(tmp_path, fixed_states):
    with pytest.raises(QuantizeError) as caught:
        quantize_int8(SHIPPED, tmp_path / "x.onnx", calibration=fixed_states, nodes_to_exclude=["node_linear", "fc9"])
    text = str(caught.value)
    assert "'fc9' is not a node of dqn_breakout.onnx" in text
    assert "node__to_copy, node_div, node_conv2d" in text and "(12 in all)" in text and "\n" not in text
    assert not (tmp_path / "x.onnx").exists()


def test_a_model_with_no_float_op_to_quantize_is_refused(tmp_path):
    no_float_ops_model(tmp_path / "no_float_ops.onnx")
    states = np.zeros((16, 4, 84, 84), np.uint8)
    for method, calibration in (("static", states), ("dynamic", None)):
        with pytest.raises(NothingToQuantize, match="no float op that onnxruntime quantizes was quantized "
                                                    r"\(ops: Cast, Div, ReduceMean; excluded: none\)"):
            quantize_int8(tmp_path / "no_float_ops.onnx", tmp_path / "x.onnx", method=method, calibration=calibration)


def test_excluding_every_quantized_node_leaves_nothing_to_quantize(tmp_path, fixed_states):
    with pytest.raises(NothingToQuantize, match="excluded: node_conv2d, "):
        quantize_int8(SHIPPED, tmp_path / "x.onnx", calibration=fixed_states, nodes_to_exclude=list(SHIPPED_NODES))
    assert not (tmp_path / "x.onnx").exists()  # the file onnxruntime wrote is not left behind


def test_cpu_isa_reads_the_flags_of_this_cpu():
    isa = cpu_isa()
    assert set(isa) == {"avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx", "int8_dot_product", "cpu"}
    try:
        flags = set(next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
                         if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        assert all(isa[k] is None for k in ("avx2", "avx512_vnni", "int8_dot_product"))
        return
    for name in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16"):
        assert isa[name] == (name in flags)
    assert isa["amx"] == bool(flags & {"amx_int8", "amx_tile"})
    assert isa["int8_dot_product"] == bool(flags & {"avx512_vnni", "avx_vnni", "amx_int8", "amx_tile"})
