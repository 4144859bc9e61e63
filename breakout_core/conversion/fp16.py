"""FP16 ONNX from an FP32 model with onnxconverter-common's float16 converter, some nodes kept
in float32 (`node_block_list`), with the two corrections a node kept in float needs.

The converter runs with keep_io_types=True, so the I/O keeps the FP32 file's types (uint8 in,
float32 out). It does not rewrite an existing Cast's target type, so the Cast that reads the
graph input (uint8 -> float32) is always in its block list: it stays float32 and the converter
inserts float32 -> float16 after it.

What onnxconverter-common 1.16.0 does to a blocked node (`float16.convert_float_to_float16`),
and what `keep_in_float32` corrects afterwards:

1. Weights. `process_node_in_block_list` runs before `process_initializers` and puts a
   Cast(-> float32) before each input of a blocked node whose value_info says float16. An
   exporter that writes value_info for its initializers (torch's dynamo exporter does) gets
   those value_infos set to float16 by `process_value_info` first, so the blocked node's
   weights are read through such a Cast; `process_initializers` then sees the Cast's output,
   not the weight, among the blocked node's inputs and converts the weight to float16 as any
   other. The node computes in float32 on fp16-rounded weights. The post-pass drops the
   Cast and gives the node the FP32 file's own float32 tensor.
2. The graph output. `insert_cast16_after_node` casts a blocked node's float32 output back to
   float16 and declares the tensor float16, graph outputs included; `process_graph_output`
   runs after it and adds the cast to float32 that keep_io_types asks for only to outputs
   still declared float32. Blocking the node that writes a graph output leaves that output
   float16. The post-pass drops that Cast, so the node writes the output in float32, as
   declared in the FP32 file.

The post-pass changes nothing else; the written file then passes the checks every written
file passes (onnx_checks.save_checked), the I/O check and the check that each kept node's
float weights are the FP32 file's, bit for bit.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from breakout_core.conversion.onnx_checks import (
    ModelCheckError,
    has_preprocessing,
    not_a_node,
    read_source_model,
    save_checked,
)

if TYPE_CHECKING:
    from onnx import ModelProto


class Fp16Error(ValueError):
    """The model or the arguments cannot give a valid FP16 model."""


@dataclass(frozen=True)
class Fp16Artifact:
    """An FP16 model file and how it was made."""

    path: Path
    size_bytes: int
    sha256: str
    source_sha256: str  # the FP32 file it was made from
    nodes_kept_float: tuple[str, ...]  # FP32 node names kept in float32 on request
    nodes_converted: tuple[str, ...]  # FP32 node names whose outputs are float16 in the file, in graph order
    converter: str
    checks: tuple[str, ...]  # every check run and passed, in order


def to_float16(source: ModelProto, keep_float: Sequence[str] = ()) -> tuple[ModelProto, list[str]]:
    """The FP16 model of `source` with the nodes named in `keep_float` in float32, and what the
    post-pass corrected (see the module docstring). `source` is left as it is."""
    import onnx
    from onnxconverter_common import float16

    kept = _checked_keep_list(source, keep_float)
    inputs = {i.name for i in source.graph.input}
    input_casts = [n.name for n in source.graph.node if n.op_type == "Cast" and set(n.input) & inputs]
    model = onnx.ModelProto()
    model.CopyFrom(source)
    with warnings.catch_warnings():
        # "float32 number ... will be truncated": expected for tiny weights
        warnings.simplefilter("ignore", UserWarning)
        model = float16.convert_float_to_float16(model, keep_io_types=True,
                                                 node_block_list=[*input_casts, *kept])
    return model, keep_in_float32(source, model, kept)


def keep_in_float32(source: ModelProto, model: ModelProto, kept: Sequence[str]) -> list[str]:
    """Correct the converter's output `model` in place so each node in `kept` reads the FP32
    file's float32 weights (not fp16-rounded ones cast up) and a graph output such a node
    writes stays float32; returns one line per correction. Fp16Error where a weight is shared
    between a kept node and a converted one (one tensor cannot be both)."""
    import onnx

    graph = model.graph
    float32_weights = {t.name: t for t in source.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    initializers = {t.name: t for t in graph.initializer}
    producers = {o: n for n in graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    kept = set(kept)
    corrections, dropped = [], set()

    def is_cast_to(node, to: int) -> bool:
        return node.op_type == "Cast" and next(a.i for a in node.attribute if a.name == "to") == to

    for name, weight in initializers.items():
        casts = [c for c in consumers.get(name, []) if is_cast_to(c, onnx.TensorProto.FLOAT)
                 and consumers.get(c.output[0]) and all(u.name in kept for u in consumers[c.output[0]])]
        if not casts or name not in float32_weights or weight.data_type != onnx.TensorProto.FLOAT16:
            continue
        others = [c.name for c in consumers[name] if c not in casts]
        if others:
            raise Fp16Error(f"weight {name!r} is read by nodes kept in float32 and by {', '.join(others)}, converted "
                            "to float16: keep them all in float32 or none")
        for cast in casts:
            for user in consumers[cast.output[0]]:
                user.input[:] = [name if i == cast.output[0] else i for i in user.input]
            graph.node.remove(cast)
            dropped.add(cast.output[0])
        weight.CopyFrom(float32_weights[name])
        dropped.add(name)  # its value_info, set to float16 by the converter
        corrections.append(f"{name}: the FP32 file's float32 tensor for "
                           f"{', '.join(sorted({u.name for c in casts for u in consumers[c.output[0]]}))}, "
                           "not a float16 copy cast up")

    declared = {o.name: o.type.tensor_type.elem_type for o in source.graph.output}
    for output in graph.output:
        if declared.get(output.name) != onnx.TensorProto.FLOAT or \
                output.type.tensor_type.elem_type == onnx.TensorProto.FLOAT:
            continue
        cast = producers.get(output.name)
        writer = producers.get(cast.input[0]) if cast is not None and is_cast_to(cast, onnx.TensorProto.FLOAT16) \
            else None
        if writer is None or writer.name not in kept or consumers.get(output.name):
            raise Fp16Error(f"graph output {output.name!r} is not float32 after the conversion, and not because a "
                            "node kept in float32 writes it")
        writer.output[:] = [output.name if o == cast.input[0] else o for o in writer.output]
        graph.node.remove(cast)
        dropped.add(cast.input[0])
        output.type.tensor_type.elem_type = onnx.TensorProto.FLOAT
        corrections.append(f"{output.name}: written in float32 by {writer.name}, not cast to float16")

    stale = [v for v in graph.value_info if v.name in dropped]
    for value in stale:
        graph.value_info.remove(value)
    return corrections


def convert_fp16(fp32_path: str | Path, out_path: str | Path, *, keep_float: Sequence[str] = ()) -> Fp16Artifact:
    """Write an FP16 copy of an FP32 ONNX model, the nodes named in `keep_float` in float32 with
    the FP32 file's weights. Its provenance is returned and written into the model's metadata
    (`breakout.*`)."""

    fp32_path, out_path = Path(fp32_path), Path(out_path)
    source, _, source_sha256 = read_source_model(fp32_path, Fp16Error)
    kept = _checked_keep_list(source, keep_float)
    model, corrections = to_float16(source, kept)
    converted = float16_nodes(source, model)
    if not converted:
        raise Fp16Error(f"{fp32_path}: no node would run in float16 (kept in float32: {', '.join(kept) or 'none'})")
    checks = [f"post-pass: {c}" for c in corrections]
    checks.append(check_same_io(source, model))
    checks.append(check_kept_weights(source, model, kept))
    checks.append(f"{len(converted)} node(s) in float16: {', '.join(converted)}")
    converter = converter_description()
    try:  # every check runs before the file is written: a failed one leaves out_path as it was
        saved = save_checked(model, out_path, {
            "precision": "fp16",
            "fp16_converter": converter,
            "fp16_nodes_kept_float": ",".join(kept),
            "fp16_nodes_converted": ",".join(converted),
            "fp16_source_sha256": source_sha256,
        }, preprocessing=has_preprocessing(source))  # a float-input source has no uint8 cast to keep
    except ModelCheckError as exc:
        raise Fp16Error(f"{out_path}: {exc}") from None
    return Fp16Artifact(path=out_path, size_bytes=saved.size_bytes, sha256=saved.sha256,
                        source_sha256=source_sha256, nodes_kept_float=kept, nodes_converted=converted,
                        converter=converter, checks=tuple(checks + saved.checks))


def converter_description() -> str:
    """The converter and the call that made a file, as its metadata records it."""
    from onnxconverter_common import __version__

    return f"onnxconverter-common {__version__} float16.convert_float_to_float16(keep_io_types=True)"


def float16_nodes(source: ModelProto, converted: ModelProto) -> tuple[str, ...]:
    """Names of the source graph's nodes that write a float16 tensor in the converted graph, in
    source order (read after onnx shape inference, so every tensor has a type)."""
    import onnx

    inferred = onnx.shape_inference.infer_shapes(converted)
    graph = inferred.graph
    half = {v.name for v in [*graph.value_info, *graph.output]
            if v.type.tensor_type.elem_type == onnx.TensorProto.FLOAT16}
    writes_half = {n.name for n in graph.node if set(n.output) & half}
    return tuple(n.name for n in source.graph.node if n.name in writes_half)


def check_same_io(source: ModelProto, model: ModelProto) -> str:
    """The converted graph's inputs and outputs are the source's, with the source's element types."""
    def io(m) -> list[tuple[str, int]]:
        return [(v.name, v.type.tensor_type.elem_type) for v in [*m.graph.input, *m.graph.output]]

    if io(model) != io(source):
        raise Fp16Error(f"inputs and outputs changed in the conversion: {io(source)} -> {io(model)} "
                        "(name, onnx element type)")
    return "inputs and outputs keep the FP32 file's names and types"


def check_kept_weights(source: ModelProto, model: ModelProto, kept: Sequence[str]) -> str:
    """Every float initializer a kept node reads is float32 and equal, bit for bit, to the FP32 file's."""
    import onnx
    from onnx import numpy_helper

    original = {t.name: t for t in source.graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    written = {t.name: t for t in model.graph.initializer}
    nodes = {n.name: n for n in model.graph.node}
    read = []
    for node in source.graph.node:
        if node.name not in kept:
            continue
        for tensor, reads in zip(node.input, nodes[node.name].input):
            if tensor not in original:
                continue  # an activation or an integer constant
            if reads != tensor:
                raise Fp16Error(f"{node.name} kept in float32 reads its weight {tensor!r} through {reads!r}")
            want, got = numpy_helper.to_array(original[tensor]), numpy_helper.to_array(written[tensor])
            if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
                raise Fp16Error(f"{node.name} kept in float32 reads {tensor!r} as {got.dtype}, not the FP32 file's "
                                f"{want.dtype} values")
            read.append(tensor)
    return (f"nodes kept in float32 read the FP32 file's weights bit for bit ({len(read)} tensors)" if kept
            else "no node kept in float32")


def _checked_keep_list(source: ModelProto, keep_float: Sequence[str]) -> tuple[str, ...]:
    if isinstance(keep_float, str):
        raise Fp16Error("keep_float must be a list of node names, not one string")
    kept = tuple(dict.fromkeys(keep_float))
    nodes = [n.name for n in source.graph.node]
    unknown = [n for n in kept if n not in nodes]
    if unknown:
        raise Fp16Error(f"keep_float: {not_a_node(unknown[0], nodes, 'the model')}")
    return kept

