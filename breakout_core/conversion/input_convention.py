"""The input a model file takes, declared, never guessed, and the adapter that feeds it the agent's
observations.

Every runtime feeds a model the agent's observations as uint8 (B, 4, 84, 84), values 0-255.
A model exported elsewhere may take float32 or float16, in 0-255 (it divides by 255 itself, as
CleanRL's and Stable-Baselines3's networks do) or in 0-1 (scaled before the network), channels
first (NCHW) or last (NHWC). A float input says nothing about its range, so the convention is
declared (`DTYPE:RANGE:LAYOUT`, or the file's `breakout.input` metadata) and an undeclared float
model is refused rather than fed a guess.

`adapt_model` puts the adapter in front of the graph with onnx.compose: Transpose (NHWC), Cast,
Div by 255 (range 0-1), Cast to float16; a float16 output gets a Cast to float32 behind it. The
adapted file is checked on given states: the original model fed those states converted by
`InputConvention.convert` (numpy) and the adapted one fed them as uint8 must give the same
Q-values.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from breakout_core.common.hashing import model_sha256
from breakout_core.conversion.onnx_checks import ModelCheckError, check_model, one_line, set_metadata

METADATA_KEY = "breakout.input"  # a file's own declaration of its input convention
DTYPES = ("uint8", "float32", "float16")
RANGES = ("0-255", "0-1")
LAYOUTS = ("nchw", "nhwc")
SYNTAX = "DTYPE:RANGE:LAYOUT (DTYPE uint8, float32 or float16; RANGE 0-255 or 0-1; LAYOUT nchw or nhwc)"
PREFIX = "input_adapter/"  # names of the adapter's nodes and tensors in the adapted graph
ADAPTED_INPUT = "obs"
TOLERANCE = {"float32": 1e-5, "float16": 2e-3}  # max |dQ| relative to max |Q|, by the model's own output type


@dataclass(frozen=True)
class InputConvention:
    """What a model's input holds: its dtype, the range of its values, its layout."""

    dtype: str = "uint8"
    value_range: str = "0-255"
    layout: str = "nchw"

    def __str__(self) -> str:
        return f"{self.dtype}:{self.value_range}:{self.layout}"

    @classmethod
    def parse(cls, text: str) -> "InputConvention":
        """`float32:0-255:nchw` and the like; ValueError naming the syntax otherwise."""
        parts = [p.strip().lower() for p in str(text).split(":")]
        if len(parts) != 3:
            raise ValueError(f"{text!r} is not {SYNTAX}")
        for value, allowed, what in zip(parts, (DTYPES, RANGES, LAYOUTS), ("DTYPE", "RANGE", "LAYOUT")):
            if value not in allowed:
                raise ValueError(f"{text!r}: {what} {value!r} is not one of {', '.join(allowed)}; "
                                 f"the syntax is {SYNTAX}")
        if parts[0] == "uint8" and parts[1] != "0-255":
            raise ValueError(f"{text!r}: a uint8 input holds 0-255")
        return cls(*parts)

    @property
    def native(self) -> bool:
        """The agent's own observations: no adapter in front."""
        return self == InputConvention()

    def convert(self, obs: np.ndarray) -> np.ndarray:
        """uint8 (B, 4, 84, 84) observations as a model of this convention takes them."""
        x = np.transpose(obs, (0, 2, 3, 1)) if self.layout == "nhwc" else obs
        if self.dtype == "uint8":
            return np.ascontiguousarray(x)
        x = x.astype(np.float32)
        if self.value_range == "0-1":
            x = x / np.float32(255.0)
        return np.ascontiguousarray(x.astype(self.dtype))

    def adapter(self, float16_output: bool) -> str:
        """The adapter in words, as provenance records it."""
        steps = ["Transpose NCHW->NHWC"] if self.layout == "nhwc" else []
        if self.dtype != "uint8":
            steps.append("Cast uint8->float16" if self.dtype == "float16" and self.value_range == "0-255"
                         else "Cast uint8->float32")
            if self.value_range == "0-1":
                steps.append("Div 255")
                if self.dtype == "float16":
                    steps.append("Cast float32->float16")
        if float16_output:
            steps.append("output Cast float16->float32")
        return ", ".join(steps) or "none"


def model_input(model) -> tuple[str, str, tuple]:
    """(name, numpy dtype name, shape) of the model's first graph input; a named dimension is its name."""
    import onnx

    value = model.graph.input[0]
    tensor = value.type.tensor_type
    shape = tuple(d.dim_param if d.dim_param else d.dim_value for d in tensor.shape.dim)
    return value.name, np.dtype(onnx.helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name, shape


def declared_in(model) -> InputConvention | None:
    """The convention the file's own metadata declares (`breakout.input`), or None."""
    text = {p.key: p.value for p in model.metadata_props}.get(METADATA_KEY)
    return InputConvention.parse(text) if text else None


def convention_problem(model, declared: InputConvention | None, option: str = "--input") -> str | None:
    """Why the model's input does not fit `declared` (or, undeclared, why it needs a declaration
    with `option`)."""
    _, dtype, shape = model_input(model)
    if declared is None:
        if dtype == "uint8":
            declared = InputConvention(layout="nhwc" if tuple(shape[1:]) == (84, 84, 4) else "nchw")
            return convention_problem(model, declared)
        return (f"takes {dtype} {shape}, and a float input does not say its range: declare it with {option} "
                f"{SYNTAX}, e.g. {option} {dtype}:0-255:{'nhwc' if tuple(shape[1:]) == (84, 84, 4) else 'nchw'}")
    if dtype != declared.dtype:
        return f"takes {dtype} {shape}, declared {declared}"
    wanted = (84, 84, 4) if declared.layout == "nhwc" else (4, 84, 84)
    if len(shape) != 4 or any(not isinstance(d, str) and d not in (0, w) for d, w in zip(shape[1:], wanted)):
        return f"takes {dtype} {shape}, declared {declared.layout.upper()}: (B, {', '.join(map(str, wanted))})"
    return None


def convention_of(model, declared: InputConvention | None, option: str = "--input") -> InputConvention:
    """`declared`, else the file's own declaration, else uint8 in whichever layout its shape is;
    ValueError (one line) when the input does not fit or a float input is undeclared."""
    declared = declared or declared_in(model)
    problem = convention_problem(model, declared, option)
    if problem:
        raise ValueError(problem)
    if declared is None:
        _, _, shape = model_input(model)
        declared = InputConvention(layout="nhwc" if tuple(shape[1:]) == (84, 84, 4) else "nchw")
    return declared


def _output_dtype(model) -> str:
    import onnx

    return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(model.graph.output[0].type.tensor_type.elem_type)).name


def needs_adapter(model, convention: InputConvention) -> bool:
    return not convention.native or _output_dtype(model) == "float16"


def adapt_model(model, convention: InputConvention):
    """The model with the adapter in front (and a float16 output cast to float32 behind): uint8
    (B, 4, 84, 84) in, float32 out; the batch dimension is the original's."""
    import onnx
    from onnx import TensorProto, compose, helper

    name, _, shape = model_input(model)
    batch = shape[0] if shape else "batch"
    opsets = [helper.make_opsetid(o.domain, o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")]
    if not opsets:
        raise ModelCheckError("the model imports no default ONNX opset")

    def small(nodes, inputs, outputs):
        graph = helper.make_graph(nodes, PREFIX + "graph", inputs, outputs)
        made = helper.make_model(graph, opset_imports=opsets)
        made.ir_version = model.ir_version
        return made

    adapted = model
    if not convention.native:
        nodes, tensor = [], ADAPTED_INPUT

        def step(op: str, *extra_inputs: str, **attrs) -> None:
            nonlocal tensor
            out = f"{PREFIX}{op.lower()}{len(nodes)}"
            nodes.append(helper.make_node(op, [tensor, *extra_inputs], [out], name=out, **attrs))
            tensor = out

        if convention.layout == "nhwc":
            step("Transpose", perm=[0, 2, 3, 1])
        constants = []
        if convention.dtype != "uint8":
            direct16 = convention.dtype == "float16" and convention.value_range == "0-255"
            step("Cast", to=TensorProto.FLOAT16 if direct16 else TensorProto.FLOAT)
            if convention.value_range == "0-1":
                constants.append(helper.make_node("Constant", [], [PREFIX + "k255"], name=PREFIX + "k255",
                                                  value=helper.make_tensor(PREFIX + "k255v", TensorProto.FLOAT, [],
                                                                           [255.0])))
                step("Div", PREFIX + "k255")
                if convention.dtype == "float16":
                    step("Cast", to=TensorProto.FLOAT16)
        element = helper.np_dtype_to_tensor_dtype(np.dtype(convention.dtype))
        wanted = (batch, 84, 84, 4) if convention.layout == "nhwc" else (batch, 4, 84, 84)
        front = small(constants + nodes,
                      [helper.make_tensor_value_info(ADAPTED_INPUT, TensorProto.UINT8, [batch, 4, 84, 84])],
                      [helper.make_tensor_value_info(tensor, element, list(wanted))])
        adapted = compose.merge_models(front, adapted, io_map=[(tensor, name)])
    adapted = onnx.ModelProto.FromString(adapted.SerializeToString())  # a copy that owns its metadata
    if _output_dtype(adapted) == "float16":
        _cast_output_to_float32(adapted)
    del adapted.metadata_props[:]
    adapted.metadata_props.extend(model.metadata_props)
    return adapted


def _cast_output_to_float32(model) -> None:
    """Give `model`'s float16 output in float32 under the same name: the tensor its graph made is
    renamed and cast (whatever the output is called, `q_values` included)."""
    from onnx import TensorProto, helper

    out = model.graph.output[0]
    inner = PREFIX + "q16"
    for node in model.graph.node:
        node.input[:] = [inner if name == out.name else name for name in node.input]
        node.output[:] = [inner if name == out.name else name for name in node.output]
    for value in model.graph.value_info:
        if value.name == out.name:
            value.name = inner
    model.graph.node.append(helper.make_node("Cast", [inner], [out.name], name=PREFIX + "output_cast",
                                             to=TensorProto.FLOAT))
    out.type.tensor_type.elem_type = TensorProto.FLOAT


@dataclass(frozen=True)
class AdaptedModel:
    """A user's file with the adapter in front, and how it was checked."""

    path: Path
    source: Path
    source_sha256: str
    convention: InputConvention
    adapter: str  # the steps in words (InputConvention.adapter)
    max_abs_diff: float  # adapted fed uint8 against the original fed the converted states
    states: int


def write_adapted(source: str | Path, convention: InputConvention, path: str | Path,
                  states: np.ndarray) -> AdaptedModel:
    """Write `source` adapted to uint8 input at `path` (onnx's checker passed, the adapter and the
    source's sha256 in its metadata) and check it on `states` (uint8 (N, 4, 84, 84)) against the
    original fed them converted; ModelCheckError when they differ or the file cannot be made."""
    import onnx

    source, path = Path(source), Path(path)
    model = onnx.load(source)
    float16_output = _output_dtype(model) == "float16"
    try:
        adapted = adapt_model(model, convention)
    except Exception as exc:  # noqa: BLE001 -- onnx.compose's checks raise several types
        raise ModelCheckError(f"the input adapter could not be put in front of the graph ({one_line(exc)})") from None
    adapter = convention.adapter(float16_output)
    sha = model_sha256(source)
    set_metadata(adapted, {"input": "uint8:0-255:nchw", "input_adapter": adapter, "input_source": str(convention),
                           "input_source_sha256": sha})
    try:
        check_model(adapted)
    except ModelCheckError as exc:  # onnxconverter-common's broken Cast is found here, behind an adapter
        from breakout_core.conversion.model_prechecks import fp16_cast_fix

        raise ModelCheckError(f"{exc}{fp16_cast_fix(source) or ''}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    onnx.save_model(adapted, partial)
    partial.replace(path)
    diff = _adapter_diff(source, path, convention, states, "float16" if float16_output else "float32")
    return AdaptedModel(path=path, source=source, source_sha256=sha, convention=convention, adapter=adapter,
                        max_abs_diff=diff, states=len(states))


def _adapter_diff(source: Path, adapted: Path, convention: InputConvention, states: np.ndarray, out: str) -> float:
    """max |dQ| between the original fed the converted states and the adapted fed them as uint8,
    one state at a time, or in calls of the file's fixed batch."""
    import onnxruntime as ort

    from breakout_core.common.batch_calls import session_q

    def session(path: Path):
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])

    original, adapted_session = session(source), session(adapted)
    expected = session_q(original, convention.convert(states)).astype(np.float32)
    got = session_q(adapted_session, states)
    diff = float(np.max(np.abs(got - expected))) if len(states) else 0.0
    scale = max(float(np.max(np.abs(expected))), 1.0) if len(states) else 1.0
    if diff > TOLERANCE[out] * scale:
        raise ModelCheckError(f"the adapted model differs from the original fed {convention} states: "
                              f"max |dQ| {diff:.3g} on {len(states)} states")
    return diff
