"""What every ONNX file this project writes goes through, whichever step writes it (the
exporter, the FP16 converter, the INT8 quantizer): the `breakout.*` metadata that records
how it was made, onnx's full checker, and the check that the uint8 input is cast to float
and scaled by 1/255 inside the graph, so every runtime is fed the same bytes."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from breakout_core.common.files import same_file, write_whole
from breakout_core.common.hashing import model_sha256

META_PREFIX = "breakout."
NODES_SHOWN = 8  # graph nodes a "not a node" message lists


class ModelCheckError(ValueError):
    """A model failed one of the checks every written ONNX file must pass."""


def one_line(exc: BaseException) -> str:
    """An exception's text on one line (onnx and onnxruntime messages span several)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def read_source_model(path: Path, error: type[Exception]):
    """(the ONNX model, its bytes with every weight inside, their content sha256) of `path` and
    its external data files, read while none of them is replaced, so that the model a converter
    works on is the one hashed; `error` with one line where it is not a readable model."""
    import onnx

    from breakout_core.common.external_data import ExternalDataRefused

    try:
        with same_file(path):
            sha256 = model_sha256(path)
            model = onnx.load(path)  # its external data read from its own folder
        data = model.SerializeToString()
    except ExternalDataRefused as exc:
        raise error(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 -- protobuf, OS and onnx errors alike: the file is not a model
        raise error(f"{path}: not a readable ONNX model ({one_line(exc)})") from None
    return model, data, sha256


def load_graph(path: str | Path, error: type[Exception] = ModelCheckError):
    """The ONNX model in `path` without its external data (where only the graph and the inline
    weights are wanted); `error` with one line where the file does not parse as a model."""
    import onnx

    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 -- protobuf, OS and onnx errors alike: the file is not a model
        raise error(f"{path}: not a readable ONNX model ({one_line(exc)})") from None


def tensor_data_problem(model) -> str | None:
    """Why one of the graph's inline tensors (initializers and Constant nodes' values) cannot be
    read: a negative dimension, or a shape whose size is not the data stored with it (a file that
    declares gigabytes and holds megabytes), found from the declared sizes alone, before anything
    is allocated. Tensors whose data lies in external files are left to their own check."""
    import onnx

    tensors = [*model.graph.initializer, *(a.t for n in model.graph.node if n.op_type == "Constant"
                                           for a in n.attribute if a.name == "value")]
    for tensor in tensors:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            continue
        shape = tuple(tensor.dims)
        if any(d < 0 for d in shape):
            return f"tensor {tensor.name!r} declares the shape {shape}, with a negative dimension"
        declared, held = _declared_and_held(tensor, int(np.prod(shape, dtype=object)))
        if held is not None and declared != held:
            return (f"tensor {tensor.name!r} declares the shape {shape} ({_size(declared)}) but holds "
                    f"{_size(held)}: the file is damaged or was made to mislead")
    return None


def _declared_and_held(tensor, elements: int) -> tuple[int, int | None]:
    """(bytes the tensor's shape declares, bytes stored with it), or elements where the data is
    in typed fields; held None where its type is one this check does not size."""
    import onnx

    try:
        itemsize = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type)).itemsize
    except (KeyError, TypeError, ValueError):
        return 0, None
    packed = {getattr(onnx.TensorProto, name, None) for name in ("INT4", "UINT4", "FLOAT4E2M1")} - {None}
    if tensor.HasField("raw_data"):
        return ((elements + 1) // 2 if tensor.data_type in packed else elements * itemsize), len(tensor.raw_data)
    if tensor.data_type in packed:
        return 0, None
    stored = sum(len(getattr(tensor, f)) for f in ("float_data", "int32_data", "int64_data", "double_data",
                                                   "uint64_data", "string_data"))
    per_element = 2 if tensor.data_type in (onnx.TensorProto.COMPLEX64, onnx.TensorProto.COMPLEX128) else 1
    return elements * itemsize, stored // per_element * itemsize


def _size(n: int) -> str:
    return next(f"{n / 1024 ** k:.3g} {unit}" for k, unit in ((3, "GiB"), (2, "MiB"), (1, "KiB"), (0, "bytes"))
                if n >= 1024 ** k or k == 0)


def not_a_node(name: str, nodes: list[str], model: str) -> str:
    """The message for a node name (a keep-list entry) that `model`'s graph does not have,
    listing the graph's first nodes so the right name can be picked."""
    shown = ", ".join(nodes[:NODES_SHOWN]) + (f", ... ({len(nodes)} in all)" if len(nodes) > NODES_SHOWN else "")
    return f"{name!r} is not a node of {model}; its nodes are: {shown}"


def set_metadata(model, values: dict[str, object]) -> None:
    """Write `values` as `breakout.<key>` metadata, replacing a key the model already has."""
    existing = {p.key: p for p in model.metadata_props}
    for key, value in values.items():
        full = META_PREFIX + key
        if full in existing:
            existing[full].value = str(value)
        else:
            prop = model.metadata_props.add()
            prop.key, prop.value = full, str(value)


def check_model(model) -> str:
    """onnx.checker with full shape inference; the name of the check, ModelCheckError if it fails."""
    import onnx

    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # noqa: BLE001 -- ValidationError or InferenceError
        raise ModelCheckError(f"onnx.checker.check_model failed ({one_line(exc)})") from None
    return "onnx.checker.check_model(full_check=True)"


@dataclass(frozen=True)
class SavedModel:
    """An ONNX file as written: its path, the checks it passed, and its bytes' size and sha256."""

    path: Path
    checks: list[str]
    size_bytes: int
    sha256: str


def save_checked(model, path: str | Path, metadata: dict[str, object], *, preprocessing: bool = True,
                 verify: Callable[[bytes], str] | None = None) -> SavedModel:
    """Set the metadata, run the checks every written file passes, and write the file whole.

    `preprocessing`: check the uint8 input's cast and 1/255 scaling (a graph that never had
    them, such as a test's bare network, is saved without). `verify`: the writer's own check
    of the serialized bytes (an ONNX Runtime session, say), which returns its description or
    raises. Every check runs before anything is written: a failed one leaves `path` as it was."""
    set_metadata(model, metadata)
    checks = [check_model(model)]
    if preprocessing:
        checks.append(check_preprocessing(model))
    data = model.SerializeToString()
    if verify is not None:
        checks.append(verify(data))
    path = write_whole(path, data)
    return SavedModel(path=path, checks=checks, size_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())


def has_preprocessing(model) -> bool:
    """Whether the graph begins with the uint8 input's cast and 1/255 scaling (`check_preprocessing`):
    a float-input model, fed as its declared convention says, has no cast to check."""
    try:
        check_preprocessing(model)
    except ModelCheckError:
        return False
    return True


def _consumers(model) -> dict[str, list]:
    consumers: dict[str, list] = {}
    for node in model.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    return consumers


def _constants(model) -> dict[str, np.ndarray]:
    """Initializers, Constant nodes and Casts of either (as the FP16 converter makes), by tensor name."""
    import onnx
    from onnx import numpy_helper

    constants = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:  # in graph order: a Cast of a constant is one too
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            constants[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
        elif node.op_type == "Cast" and node.input[0] in constants:
            to = next(a.i for a in node.attribute if a.name == "to")
            constants[node.output[0]] = constants[node.input[0]].astype(onnx.helper.tensor_dtype_to_np_dtype(to))
    return constants


def _scaling_by_255(node, tensor: str, constants: dict[str, np.ndarray]) -> tuple[bool, object]:
    """Whether `node` divides `tensor` by 255 (or multiplies it by 1/255), and the constant it uses."""
    other = [n for n in node.input if n != tensor]
    value = constants.get(other[0]) if other else None
    wanted = 255.0 if node.op_type == "Div" else 1.0 / 255.0
    ok = node.op_type in ("Div", "Mul") and value is not None and value.size == 1 and np.isclose(
        float(value.reshape(-1)[0]), wanted, rtol=1e-3) and (node.op_type == "Mul" or node.input[0] == tensor)
    return ok, value


def _scaled_float_input(model) -> str | None:
    """The tensor that holds a float input's 0-255 pixels as 0-1, where the input's one consumer
    divides it by 255 (CleanRL's and Stable-Baselines3's exports); None otherwise."""
    import onnx

    graph_input = model.graph.input[0]
    dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(graph_input.type.tensor_type.elem_type))
    users = _consumers(model).get(graph_input.name, [])
    if dtype.kind != "f" or len(users) != 1 or not _scaling_by_255(users[0], graph_input.name, _constants(model))[0]:
        return None
    return users[0].output[0]


def _uint8_scaling(model) -> tuple[list[str], object, object]:
    """(the casts' dtypes, the scaling node, its constant) of a graph whose input goes through
    Cast(uint8 -> float) [-> Cast(float -> float16)] then Div by 255; ModelCheckError otherwise."""
    import onnx

    consumers, constants = _consumers(model), _constants(model)
    chain = []
    tensor = model.graph.input[0].name
    users = consumers.get(tensor, [])
    while len(users) == 1 and users[0].op_type == "Cast":
        cast = users[0]
        to = next(a.i for a in cast.attribute if a.name == "to")
        chain.append(np.dtype(onnx.helper.tensor_dtype_to_np_dtype(to)).name)
        tensor = cast.output[0]
        users = consumers.get(tensor, [])
    if not chain or chain[-1] not in ("float32", "float16"):
        raise ModelCheckError(f"the uint8 input is not cast to float inside the graph (casts: {chain})")
    if len(users) != 1 or users[0].op_type not in ("Div", "Mul"):
        raise ModelCheckError(f"the cast input is not scaled by 1/255 inside the graph "
                              f"(next: {[u.op_type for u in users]})")
    scale = users[0]
    ok, value = _scaling_by_255(scale, tensor, constants)
    if not ok:
        wanted = 255.0 if scale.op_type == "Div" else 1.0 / 255.0
        raise ModelCheckError(f"the input scaling is {scale.op_type} by {value}, expected {scale.op_type} by {wanted}")
    return chain, scale, value


def check_preprocessing(model) -> str:
    """The input goes through Cast(uint8 -> float) [-> Cast(float -> float16)] then Div by 255."""
    chain, scale, value = _uint8_scaling(model)
    return (f"preprocessing in graph: Cast uint8 -> {' -> '.join(chain)}, "
            f"{scale.op_type} by {float(value.reshape(-1)[0]):g}")


def scaled_input_tensor(model) -> str | None:
    """The tensor that holds the input's pixels / 255, when the graph begins so: a uint8 input cast
    to float and scaled (the project's exports), or a float input in 0-255 scaled at once (CleanRL's
    and Stable-Baselines3's)."""
    try:
        return _uint8_scaling(model)[1].output[0]
    except ModelCheckError:
        return _scaled_float_input(model)
