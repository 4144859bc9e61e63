"""FP16 with nodes kept in float32: the post-pass over onnxconverter-common's output gives a kept
node the FP32 file's float32 weights and keeps a graph output it writes float32, and the repair
search finds a layer that float16 wrecks and keeps it in float32 (real ONNX Runtime)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper
from tiny_onnx import fp16_fragile_weights, tiny_model, tiny_states

from breakout_core.conversion.fp16 import Fp16Error, convert_fp16
from breakout_core.diagnosis.repair import Fp16Converter, RepairTarget, q_values, repair_search

REPO = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    """The tiny network with a value_info for each initializer, as torch's dynamo exporter writes
    them: what makes the converter read a blocked node's weights through a float16 copy."""
    path = tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.onnx")
    model = onnx.load(path)
    model.graph.value_info.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                                  for t in model.graph.initializer)
    onnx.save_model(model, path)
    return path


@pytest.fixture(scope="module")
def fragile(tmp_path_factory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("fp16_fragile") / "fragile.onnx", fp16_fragile_weights())


def _initializers(path: Path) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(path).graph.initializer}


def test_a_kept_node_reads_the_fp32_weights_and_the_others_are_float16(tmp_path, tiny):
    artifact = convert_fp16(tiny, tmp_path / "kept.onnx", keep_float=["conv_a"])
    source, written = _initializers(tiny), _initializers(artifact.path)
    for name in ("wa", "ba"):  # conv_a's own
        assert written[name].dtype == np.float32 and written[name].tobytes() == source[name].tobytes()
    for name in ("wb", "bb", "wc", "bc", "wd", "bd"):
        assert written[name].dtype == np.float16
    graph = onnx.load(artifact.path).graph
    conv_a = next(n for n in graph.node if n.name == "conv_a")
    assert list(conv_a.input[1:]) == ["wa", "ba"]  # read directly, not through a cast
    assert artifact.nodes_kept_float == ("conv_a",) and "conv_a" not in artifact.nodes_converted
    assert artifact.nodes_converted[0] == "scale" and artifact.nodes_converted[-1] == "fc_b"
    assert any("post-pass: wa: the FP32 file's float32 tensor for conv_a" in c for c in artifact.checks)
    assert "nodes kept in float32 read the FP32 file's weights bit for bit (2 tensors)" in artifact.checks
    metadata = {p.key: p.value for p in onnx.load(artifact.path).metadata_props}
    assert metadata["breakout.precision"] == "fp16" and metadata["breakout.fp16_nodes_kept_float"] == "conv_a"


def test_the_output_stays_float32_when_the_last_node_is_kept(tmp_path, tiny):
    artifact = convert_fp16(tiny, tmp_path / "last.onnx", keep_float=["fc_b"])
    model = onnx.load(artifact.path)
    assert [(o.name, o.type.tensor_type.elem_type) for o in model.graph.output] == [("q", TensorProto.FLOAT)]
    fc_b = next(n for n in model.graph.node if n.name == "fc_b")
    assert list(fc_b.output) == ["q"]  # fc_b writes the output itself, no float16 cast after it
    assert "post-pass: q: written in float32 by fc_b, not cast to float16" in artifact.checks
    written = _initializers(artifact.path)
    assert written["wd"].dtype == np.float32 and written["wc"].dtype == np.float16
    states = tiny_states(8)
    q = q_values(artifact.path, states)
    assert q.dtype == np.float32 and np.abs(q - q_values(tiny, states)).max() < 1e-2


def test_the_shipped_model_with_its_first_conv_kept_passes_the_export_checks(tmp_path):
    from breakout_core.conversion.export import _check_model

    source = REPO / "models" / "reference" / "dqn_breakout.onnx"
    artifact = convert_fp16(source, tmp_path / "conv.onnx", keep_float=["node_conv2d", "node_linear_1"])
    model = onnx.load(artifact.path)
    assert _check_model(model, "fp16")[-1] == "weights fp16"  # q_values float32, dynamic batch axis
    original, written = _initializers(source), _initializers(artifact.path)
    for name in ("torso.0.weight", "torso.0.bias", "head.2.weight", "head.2.bias"):
        assert written[name].dtype == np.float32 and np.array_equal(written[name], original[name])
    assert written["torso.2.weight"].dtype == np.float16


def test_bad_keep_lists_are_refused(tmp_path, tiny):
    with pytest.raises(Fp16Error, match="'conv_z' is not a node of the model; its nodes are: to_float, scale"):
        convert_fp16(tiny, tmp_path / "x.onnx", keep_float=["conv_z"])
    with pytest.raises(Fp16Error, match="a list of node names, not one string"):
        convert_fp16(tiny, tmp_path / "x.onnx", keep_float="conv_a")
    everything = [n.name for n in onnx.load(tiny).graph.node]
    with pytest.raises(Fp16Error, match="no node would run in float16"):
        convert_fp16(tiny, tmp_path / "x.onnx", keep_float=everything)
    assert not (tmp_path / "x.onnx").exists()


def test_the_fp16_fragile_layer_is_found_first_and_kept_in_float32(tmp_path, fragile):
    check = tiny_states(60, seed=2)
    result = repair_search(fragile, check, tmp_path / "steps", convert=Fp16Converter(), latency_runs=64)
    assert result.precision == "fp16" and result.check_states == 60 and result.check_states_dropped == 0
    assert result.order[0][0] == "fc_b"
    assert result.order[0][1] > 100 * max(score for _, score in result.order[1:])
    first, last = result.steps[0], result.steps[-1]
    assert first.excluded == () and not first.passes and first.agreement < 0.9
    assert result.chosen is last and last.passes and last.excluded == ("fc_b",) and len(result.steps) == 2
    assert last.agreement == 1.0 and last.max_abs_dq < 0.01
    assert "fc_b" not in last.nodes_converted and "fc_a" in last.nodes_converted
    assert last.excluded_quantized_at_load == ()
    assert _initializers(last.path)["wd"].dtype == np.float32
    for step in result.steps:
        assert step.path.parent == tmp_path / "steps" and step.p50_ms > 0 and step.fp32_p50_ms > 0


def test_a_keep_list_is_always_kept(tmp_path, fragile):
    result = repair_search(fragile, tiny_states(20, seed=2), tmp_path, convert=Fp16Converter(keep_float=("fc_b",)),
                           target=RepairTarget(min_agreement=1.0), latency_runs=64)
    assert "fc_b" not in dict(result.order) and result.chosen is result.steps[0] and result.steps[0].excluded == ()
