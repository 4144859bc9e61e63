"""Layer-wise localisation: a perturbed layer is named first; QDQ and FP16 tensors are matched
through the conversion nodes; the shipped model's FP16 and INT8 files get a row per layer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tiny_onnx import LAYERS, tiny_model, tiny_states, tiny_weights

from breakout_core.conversion.quantize import quantize_int8
from breakout_core.diagnosis.localise import LocaliseError, localise
from breakout_core.diagnosis.parity import compare_q
from breakout_core.evaluation.fixed_states import load_fixed_states

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "models" / "reference" / "dqn_breakout.onnx"
SHIPPED_FP16 = ROOT / "models" / "reference" / "dqn_breakout_fp16.onnx"
FIXED = ROOT / "models" / "reference" / "fixed_states_60.npz"
SHIPPED_TENSORS = ["_to_copy", "div", "conv2d", "relu", "conv2d_1", "relu_1", "conv2d_2", "relu_2", "view", "linear",
                   "relu_3", "q_values"]


@pytest.fixture(scope="module")
def fixed_states() -> np.ndarray:
    return load_fixed_states(FIXED).obs


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.onnx")


def _q(path: Path, states: np.ndarray) -> np.ndarray:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return np.concatenate([session.run(None, {"obs": states[i:i + 1]})[0] for i in range(len(states))])


@pytest.mark.parametrize("node", list(LAYERS))
def test_the_perturbed_layer_is_named_first(tmp_path, tiny, node):
    weight, tensor = LAYERS[node]
    weights = tiny_weights()
    weights[weight] = weights[weight] * np.float32(1.1)
    candidate = tiny_model(tmp_path / "perturbed.onnx", weights)
    states = tiny_states(20)
    found = localise(tiny, candidate, states, flipped=range(20))
    assert found.first_layer().tensor == tensor and found.first_layer().node == node
    for layer in found.layers:
        if layer.depth < found.first_layer().depth:
            assert layer.max_abs == 0 and layer.rel_l2 == 0 and layer.sqnr_db == float("inf") and layer.cosine == 1
    assert set(found.first_divergence) == set(range(20))
    assert set(found.first_divergence.values()) == {tensor}
    assert found.exposure_max_abs_diff == 0  # same ops, same kernels
    assert found.unmatched == ()


def test_identical_models_have_no_error(tiny):
    found = localise(tiny, tiny, tiny_states(5), flipped=[0, 4])
    assert found.first_layer() is None and found.first_divergence == {0: None, 4: None}
    assert all(layer.max_abs == 0 for layer in found.layers)
    assert [layer.depth for layer in found.layers] == sorted(layer.depth for layer in found.layers)


def test_int8_qdq_tensors_are_matched_through_quantize_and_dequantize(tmp_path, tiny):
    art = quantize_int8(tiny, tmp_path / "int8.onnx", calibration=tiny_states(32))
    found = localise(tiny, art.path, tiny_states(10, seed=5))
    matched = {layer.tensor: layer.candidate_tensor for layer in found.layers}
    assert matched["x01"] == "x01_DequantizeLinear_Output"  # exact: the input's scale is 1/255
    assert matched["ra"] == "ra_DequantizeLinear_Output"
    assert matched["q"] == "q"  # the graph output is the last DequantizeLinear's
    # the QDQ quantizer folds a Relu after a Conv into the quantization: the Conv's own output is gone
    assert {"ca", "cb"} <= set(found.unmatched)
    rows = {layer.tensor: layer for layer in found.layers}
    assert rows["x01"].max_abs < 1e-7 and rows["ra"].max_abs > 0
    assert found.rows()[0]["tensor"] == "x"


def test_shipped_fp16_and_int8_get_a_row_per_layer(tmp_path, fixed_states):
    int8 = quantize_int8(SHIPPED, tmp_path / "int8.onnx", calibration=fixed_states)
    fp32_q = _q(SHIPPED, fixed_states)

    fp16 = localise(SHIPPED, SHIPPED_FP16, fixed_states)
    assert [layer.tensor for layer in fp16.layers] == SHIPPED_TENSORS and fp16.unmatched == ()
    assert [layer.depth for layer in fp16.layers] == list(range(12))
    for layer in fp16.layers[1:]:
        assert 0 < layer.rel_l2 < 1e-2 and layer.cosine > 0.9999 and layer.sqnr_db > 40
    assert fp16.layers[0].max_abs == 0  # the uint8 -> float cast is kept in float32, exact in float16
    assert 0 <= fp16.exposure_max_abs_diff < 1e-2

    flipped = compare_q(fp32_q, _q(int8.path, fixed_states)).disagreeing_states
    assert flipped  # calibrated on these very states, INT8 still flips some greedy actions
    found = localise(SHIPPED, int8.path, fixed_states, flipped=flipped)
    assert [layer.tensor for layer in found.layers] == ["_to_copy", "div", "relu", "relu_1", "relu_2", "view",
                                                        "relu_3", "q_values"]
    assert found.unmatched == ("conv2d", "conv2d_1", "conv2d_2", "linear")
    assert found.layers[1].max_abs < 1e-7  # the scaled input is exact
    for layer in found.layers[2:]:
        assert layer.max_abs > 0 and np.isfinite(layer.rel_l2) and np.isfinite(layer.sqnr_db)
    assert set(found.first_divergence) == set(flipped)
    names = {layer.tensor for layer in found.layers}
    assert all(name is None or name in names for name in found.first_divergence.values())
    assert found.state_errors.shape == (60, 8)
    by_max = localise(SHIPPED, int8.path, fixed_states[:5], metric="max_abs", tolerance=0.005, flipped=[0])
    assert by_max.metric == "max_abs" and by_max.tolerance == 0.005
    assert np.allclose(by_max.state_errors.max(axis=0), [layer.max_abs for layer in by_max.layers])


def test_what_cannot_be_exposed_is_one_clear_line(tmp_path, tiny):
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"\x00TRT serialized engine\xff" * 10)
    with pytest.raises(LocaliseError, match="not an ONNX model .*intermediate tensors can only be exposed") as caught:
        localise(tiny, engine, tiny_states(2))
    assert "\n" not in str(caught.value)

    other = onnx.load(tiny)
    for node in other.graph.node:
        node.output[:] = [f"other_{o}" for o in node.output]
        node.input[:] = [i if i in {"obs", "k255", "flat_shape"} or i.startswith(("w", "b")) else f"other_{i}"
                         for i in node.input]
    other.graph.output[0].name = "other_q"
    onnx.save_model(other, tmp_path / "renamed.onnx")
    with pytest.raises(LocaliseError, match="no tensor of tiny.onnx has a counterpart in renamed.onnx"):
        localise(tiny, tmp_path / "renamed.onnx", tiny_states(2))

    with pytest.raises(ValueError, match="unknown metric 'l1'"):
        localise(tiny, tiny, tiny_states(2), metric="l1")
    with pytest.raises(ValueError, match="flipped state 2 is outside 0..1"):
        localise(tiny, tiny, tiny_states(2), flipped=[2])
