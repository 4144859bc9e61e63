"""What an ONNX model computes, hashed without its names: the same graph and weights give the
same hash however the file was written (a re-save, renamed nodes and tensors, reordered
initializers, weights inline or as external data, other metadata).

Each tensor is named by what it is: a weight by its dtype, shape and bytes; a graph input by
its position, dtype and shape (a symbolic dimension as `?`); a node's output by the node's op,
domain, attributes and inputs, and the output's position. The hash covers the opsets and, in
order, the graph outputs' names so derived, so a node that no output reads counts for nothing.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


def model_content_sha256(path: str | Path) -> str:
    """The content hash of the ONNX model at `path` (its external data read from beside it)."""
    import onnx

    return graph_content_sha256(onnx.load(str(path)))


def graph_content_sha256(model) -> str:
    """The content hash of a loaded ONNX ModelProto (every weight in memory)."""
    from onnx import numpy_helper

    graph = model.graph
    named: dict[str, str] = {}
    for weight in graph.initializer:
        values = numpy_helper.to_array(weight)
        named[weight.name] = _digest("weight", values.dtype.str, str(values.shape), values.tobytes())
    for position, value in enumerate(v for v in graph.input if v.name not in named):
        named[value.name] = _digest("input", str(position), _type_text(value.type))
    for node in graph.node:
        attributes = sorted((a.name, a.SerializeToString(deterministic=True)) for a in node.attribute)
        node_id = _digest("node", node.domain, node.op_type, repr(attributes),
                          *(named.get(name, "absent") if name else "omitted" for name in node.input))
        for position, output in enumerate(node.output):
            named[output] = _digest("output", node_id, str(position))
    opsets = sorted((o.domain, o.version) for o in model.opset_import)
    outputs = [named.get(v.name, "absent") for v in graph.output]
    return _digest("model", repr(opsets), *outputs)


def _type_text(value_type) -> str:
    tensor = value_type.tensor_type
    dims = ["?" if d.dim_param or not d.HasField("dim_value") else str(d.dim_value) for d in tensor.shape.dim]
    return f"{tensor.elem_type}:{','.join(dims)}"


def _digest(*parts: str | bytes) -> str:
    sha = hashlib.sha256()
    for part in parts:
        data = part if isinstance(part, bytes) else part.encode()
        sha.update(len(data).to_bytes(8, "little"))
        sha.update(data)
    return sha.hexdigest()
