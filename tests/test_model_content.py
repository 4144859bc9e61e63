"""An ONNX model's content hash: the same graph and weights hash alike however the file is
written (renamed nodes and tensors, reordered weights, external data, metadata, a node no output
reads), and any change to what it computes hashes otherwise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from breakout_core.common.hashing import file_sha256
from breakout_core.conversion.model_content import graph_content_sha256, model_content_sha256

REFERENCE_ONNX = Path(__file__).resolve().parents[1] / "models" / "reference" / "dqn_breakout.onnx"


def _renamed(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every node and inner tensor renamed, the weights in reverse order, metadata added."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    kept = {v.name for v in model.graph.output} | {v.name for v in model.graph.input}
    names = {w.name: f"weight_{i}" for i, w in enumerate(model.graph.initializer)}
    for i, node in enumerate(model.graph.node):
        node.name = f"step_{i}"
        names.update({out: f"t{i}_{j}" for j, out in enumerate(node.output) if out not in kept})
    for node in model.graph.node:
        node.input[:] = [names.get(n, n) for n in node.input]
        node.output[:] = [names.get(n, n) for n in node.output]
    weights = list(model.graph.initializer)
    for weight in weights:
        weight.name = names[weight.name]
    del model.graph.initializer[:]
    model.graph.initializer.extend(reversed(weights))
    model.metadata_props.add(key="saved_by", value="another tool")
    return model


def test_a_rewritten_file_of_the_same_model_hashes_alike(tmp_path):
    original = onnx.load(str(REFERENCE_ONNX))
    renamed = _renamed(original)
    onnx.save(renamed, str(tmp_path / "renamed.onnx"))
    onnx.save(onnx.ModelProto.FromString(renamed.SerializeToString()), str(tmp_path / "external.onnx"),
              save_as_external_data=True, location="external.onnx.data", size_threshold=0)  # moves the weights out
    dead = onnx.ModelProto.FromString(renamed.SerializeToString())
    dead.graph.node.append(onnx.helper.make_node("Relu", [dead.graph.node[0].output[0]], ["unused"]))
    expected = model_content_sha256(REFERENCE_ONNX)
    assert file_sha256(tmp_path / "renamed.onnx") != file_sha256(REFERENCE_ONNX)
    assert model_content_sha256(tmp_path / "renamed.onnx") == expected
    assert model_content_sha256(tmp_path / "external.onnx") == expected
    assert graph_content_sha256(dead) == expected


def test_any_change_to_what_it_computes_hashes_otherwise():
    original = onnx.load(str(REFERENCE_ONNX))
    expected = graph_content_sha256(original)
    one_weight = onnx.ModelProto.FromString(original.SerializeToString())
    values = numpy_helper.to_array(one_weight.graph.initializer[0]).copy()
    values.flat[0] = np.nextafter(values.flat[0], np.float32(np.inf))
    one_weight.graph.initializer[0].CopyFrom(numpy_helper.from_array(values, one_weight.graph.initializer[0].name))
    stride = onnx.ModelProto.FromString(original.SerializeToString())
    conv = next(n for n in stride.graph.node if n.op_type == "Conv")
    next(a for a in conv.attribute if a.name == "strides").ints[:] = [1, 1]
    swapped = onnx.ModelProto.FromString(original.SerializeToString())
    two_input = next(n for n in swapped.graph.node if len(n.input) >= 2 and n.op_type in ("Conv", "Gemm", "MatMul"))
    two_input.input[0], two_input.input[1] = two_input.input[1], two_input.input[0]
    hashes = {graph_content_sha256(m) for m in (one_weight, stride, swapped)}
    assert expected not in hashes and len(hashes) == 3
    assert model_content_sha256(REFERENCE_ONNX.with_name("dqn_breakout_fp16.onnx")) != expected
