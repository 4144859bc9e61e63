"""INT8 ONNX from an FP32 model with ONNX Runtime's own quantizer (onnxruntime.quantization).

Static quantization writes the QDQ format (QuantizeLinear/DequantizeLinear pairs around
each quantized op; ONNX Runtime fuses them into integer kernels when the session is made):
QInt8 weights (per output channel by default), QUInt8 activations whose ranges come from
calibration states. Dynamic quantization stores int8 weights and quantizes each activation
from its own range at run time (DynamicQuantizeLinear): no calibration, and a batch's
activation scales depend on every state in the batch.

Choices made here, and why:

- Pre-processing: `quant_pre_process` runs with its ONNX Runtime graph optimisation skipped
  (shape inference only). quantize_static asks for pre-processed models, and the
  optimisation could fuse or rename nodes, while `nodes_to_exclude` and the layer-wise
  localisation name the FP32 file's nodes and tensors.
- Calibration: ONNX Runtime's calibrator (`create_calibrator`) computes the ranges, which
  quantize_static then reads from a calibration cache. Through quantize_static alone the
  entropy calibrator gets 128 histogram bins for 128 quantized bins: its KL search then has
  a single candidate, the whole range, and 'entropy' gives exactly the min/max ranges
  (seen on the shipped model: all 12 tensors identical). Here it gets 2048 histogram bins
  (TensorRT's size) and 512 quantized bins: ONNX Runtime's histogram spans [-t, t], and a
  QUInt8 activation's 256 levels cover its non-negative half. On the shipped model this real
  KL search clips the sparse ReLU activations hard (the first layer's range to a quarter of
  its maximum) and agrees less with FP32 than min/max does. Each method's options are
  recorded with the artifact.
- Input preprocessing: the scaled input (uint8 -> float Cast, then / 255) is quantized with a
  pinned scale of 1/255 and zero point 0, so every uint8 pixel survives the round trip
  exactly. From calibration its range would end at the brightest calibration pixel (148 of
  255 in the fixed states): a brighter pixel in play would be clipped. The Cast and the
  division themselves stay float, which the exporter's preprocessing check confirms on the
  written file. Dynamic quantization cannot pin it: each batch's input is requantized from
  its own range, never clipped, exact only when its brightest pixel is 255.
- Excluded nodes: ONNX Runtime may quantize an excluded Conv or Gemm anyway when it loads
  the file (between quantized neighbours; see _excluded_quantized_at_load). The artifact
  names those, so "kept in float" is never claimed for a node that does not run in float.
- Minimum calibration states (static): minmax 16; entropy and percentile 64. A histogram
  method fits each tensor's distribution, and the Q-network's smallest quantized tensor, its
  4 Q-values, gets only 4 values a state: 64 states give it 256, already sparse in a
  2048-bin histogram; fewer make the KL search and the 99.999th percentile fit noise (at
  fewer than 100,000 values that percentile is close to the maximum). Min/max ranges only need
  the states to reach the extremes play reaches, and 16 states spread over games do most of
  that; more are better for every method.
"""

from __future__ import annotations

import contextlib
import io
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from breakout_core.common.batch_calls import calls, fixed_batch
from breakout_core.common.cpu_flags import cpu_flags, cpu_model
from breakout_core.conversion.onnx_checks import (
    ModelCheckError,
    has_preprocessing,
    not_a_node,
    one_line,
    read_source_model,
    save_checked,
    scaled_input_tensor,
)

if TYPE_CHECKING:
    from onnx import ModelProto

METHODS = ("static", "dynamic")
CALIBRATE_METHODS = ("minmax", "entropy", "percentile")
MIN_CALIBRATION_STATES = {"minmax": 16, "entropy": 64, "percentile": 64}
# passed to onnxruntime's create_calibrator; percentile's are its defaults, written out to be recorded
CALIBRATION_OPTIONS: dict[str, dict[str, float]] = {
    "minmax": {},
    "entropy": {"num_bins": 2048, "num_quantized_bins": 512},
    "percentile": {"num_bins": 2048, "percentile": 99.999},
}
CALIBRATION_BATCH = 32  # states per calibration run: bounded memory, same ranges as one state at a time
INPUT_SCALE = 1.0 / 255.0
# ops whose presence in a converted graph means the computation runs on integers
INTEGER_OPS = frozenset({"ConvInteger", "MatMulInteger", "QLinearConv", "QLinearMatMul", "QGemm",
                         "QLinearAdd", "QLinearMul", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"})
CONVERSION_OPS = frozenset({"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "Cast"})


class QuantizeError(ValueError):
    """The model or the arguments cannot give a valid INT8 model."""


class NothingToQuantize(QuantizeError):
    """No node would run quantized: no float op that onnxruntime quantizes, or all of them excluded."""


@dataclass(frozen=True)
class Int8Artifact:
    """An INT8 model file and how it was made."""

    path: Path
    size_bytes: int
    sha256: str
    source_sha256: str  # the FP32 file it was made from
    method: str  # "static" or "dynamic"
    calibrate_method: str | None  # None for dynamic
    calibration_states: int  # 0 for dynamic
    calibration_options: dict[str, float]  # what onnxruntime's calibrator was given; empty for dynamic
    per_channel: bool
    nodes_excluded: tuple[str, ...]  # FP32 node names kept in float on request
    nodes_quantized: tuple[str, ...]  # FP32 node names that run on quantized tensors, in graph order
    excluded_quantized_at_load: tuple[str, ...]  # excluded nodes whose weights onnxruntime quantizes anyway
    input_scale: float | None  # the fixed scale of the scaled uint8 input (1/255); None: float, or dynamic
    onnxruntime_version: str
    checks: tuple[str, ...]  # every check run and passed, in order
    quantizer: str  # the library that chose the ranges and wrote the file, with its version


def quantize_int8(
    fp32_path: str | Path,
    out_path: str | Path,
    *,
    method: str = "static",
    calibration: np.ndarray | None = None,
    calibrate_method: str = "minmax",
    per_channel: bool = True,
    nodes_to_exclude: Sequence[str] = (),
) -> Int8Artifact:
    """Write an INT8 copy of an FP32 ONNX model with onnxruntime.quantization.

    `calibration` (static only): observations as the model's input takes them (the agent's uint8
    (N, 4, 84, 84), or a float-input model's own convention) whose activation ranges set the
    quantization, at least MIN_CALIBRATION_STATES[calibrate_method] of them; a batch fixed in
    the file is fed in calls of that batch.
    `nodes_to_exclude`: node names of the FP32 graph to keep in float. The provenance is
    returned and also written into the model's metadata (`breakout.*`).
    """
    import onnxruntime as ort
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static
    from onnxruntime.quantization.shape_inference import quant_pre_process

    fp32_path, out_path = Path(fp32_path), Path(out_path)
    if method not in METHODS:
        raise QuantizeError(f"unknown quantization method {method!r}; known: {', '.join(METHODS)}")
    if method == "static":
        states = _calibration_states(calibration, calibrate_method)
    elif calibration is not None:
        raise QuantizeError("dynamic quantization takes its activation ranges at run time: give no calibration states")
    source, data, source_sha256 = read_source_model(fp32_path, QuantizeError)
    if method == "static":
        calibration_fits(source, states, fp32_path)
    excluded = checked_exclusions(source, nodes_to_exclude, fp32_path)
    scaled_input = pinned_input(source, states) if method == "static" else scaled_input_tensor(source)
    checks = []

    # the quantizer writes only in this folder; the checked file is then written whole at out_path
    with tempfile.TemporaryDirectory(prefix="quantize-") as folder:
        copied, prepared, quantized_path = (Path(folder) / name for name in ("source.onnx", "prepared.onnx",
                                                                             "quantized.onnx"))
        copied.write_bytes(data)
        try:
            quant_pre_process(str(copied), str(prepared), skip_optimization=True)
        except Exception as exc:  # noqa: BLE001 -- onnx and onnxruntime errors alike
            raise QuantizeError(f"{fp32_path}: onnxruntime's quantization pre-processing failed ({one_line(exc)})") \
                from None
        checks.append("quant_pre_process (shape inference, no graph optimisation)")
        try:
            if method == "static":
                cache = Path(folder) / "calibration.json"
                _calibrate(prepared, states, calibrate_method, cache, Path(folder))
                overrides = {}
                if scaled_input is not None:
                    overrides[scaled_input] = [{"scale": np.array(INPUT_SCALE, dtype=np.float32),
                                                "zero_point": np.array(0, dtype=np.uint8)}]
                quantize_static(
                    str(prepared), str(quantized_path), None,
                    quant_format=QuantFormat.QDQ,
                    activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8,
                    per_channel=per_channel,
                    nodes_to_exclude=list(excluded),
                    calibrate_method=_ort_calibrate_method(calibrate_method),
                    calibration_cache_path=cache,
                    extra_options={"TensorQuantOverrides": overrides},
                )
            else:
                quantize_dynamic(str(prepared), str(quantized_path), weight_type=QuantType.QInt8,
                                 per_channel=per_channel, nodes_to_exclude=list(excluded))
        except Exception as exc:  # noqa: BLE001 -- the quantizer raises many classes
            raise QuantizeError(f"{fp32_path}: onnxruntime could not quantize it ({one_line(exc)})") from None
        model, quantized, input_scale, written_checks = _checked_output(source, fp32_path, quantized_path, out_path,
                                                                         excluded, scaled_input)

    calibrate = calibrate_method if method == "static" else None
    quantizer = f"onnxruntime {ort.__version__} onnxruntime.quantization"
    calibration_options = dict(CALIBRATION_OPTIONS[calibrate]) if calibrate else {}
    n_states = len(states) if method == "static" else 0
    at_load = _excluded_quantized_at_load(model.SerializeToString(), excluded)
    try:  # every check runs before the file is written: a failed one leaves out_path as it was
        saved = save_checked(model, out_path, {
            "precision": "int8",
            "int8_method": method,
            "int8_calibrate_method": calibrate or "",
            "int8_calibration_states": n_states,
            "int8_calibration_options": ",".join(f"{k}={v}" for k, v in calibration_options.items()),
            "int8_per_channel": per_channel,
            "int8_nodes_excluded": ",".join(excluded),
            "int8_nodes_quantized": ",".join(quantized),
            "int8_quantizer": quantizer,
            "int8_source_sha256": source_sha256,
        }, preprocessing=has_preprocessing(source))
    except ModelCheckError as exc:
        raise QuantizeError(f"{out_path}: {exc}") from None
    checks += written_checks + saved.checks
    if at_load:
        checks.append(f"excluded but quantized by onnxruntime when it loads the file: {', '.join(at_load)}")
    return Int8Artifact(
        path=out_path,
        size_bytes=saved.size_bytes,
        sha256=saved.sha256,
        source_sha256=source_sha256,
        method=method,
        calibrate_method=calibrate,
        calibration_states=n_states,
        calibration_options=calibration_options,
        per_channel=per_channel,
        nodes_excluded=excluded,
        nodes_quantized=quantized,
        excluded_quantized_at_load=at_load,
        input_scale=input_scale,
        onnxruntime_version=ort.__version__,
        checks=tuple(checks),
        quantizer=quantizer,
    )


def _checked_output(source: ModelProto, fp32_path: Path, quantized_path: Path, out_path: Path,
                    excluded: tuple[str, ...], scaled_input: str | None):
    """The quantizer's model, its quantized nodes, the scaled input's fixed scale and the checks
    run (onnx_checks.save_checked then runs the checks every written file passes)."""
    import onnx

    model = onnx.load(quantized_path)
    checks = []
    quantized = quantized_nodes(source, model)
    if not quantized:
        ops = sorted({n.op_type for n in source.graph.node})
        raise NothingToQuantize(f"{fp32_path}: no float op that onnxruntime quantizes was quantized "
                                f"(ops: {', '.join(ops)}; excluded: {', '.join(excluded) or 'none'})")
    checks.append(f"{len(quantized)} node(s) quantized: {', '.join(quantized)}")
    if scaled_input is None:
        return model, quantized, None, checks
    scale = fixed_input_scale(model, scaled_input)
    if scale is None:
        checks.append(f"input {scaled_input!r} not quantized with a fixed scale (float, or per batch)")
    elif np.isclose(scale, INPUT_SCALE, rtol=1e-6):
        checks.append(f"input {scaled_input!r} quantized with scale 1/255, zero point 0: every pixel exact")
    else:
        raise QuantizeError(f"{out_path}: the scaled input {scaled_input!r} is quantized with scale {scale:.6g}, "
                            "not 1/255: some pixels would not survive")
    return model, quantized, scale, checks


def quantized_nodes(source: ModelProto, converted: ModelProto) -> tuple[str, ...]:
    """Names of the source graph's nodes that run on quantized tensors in the converted graph,
    in source order.

    QDQ: a node that keeps its name, takes a DequantizeLinear output and feeds a
    QuantizeLinear (ONNX Runtime fuses the three into an integer kernel). Integer ops
    (dynamic, QOperator): the source node whose output the integer op's chain produces.
    Activations such as Relu that the QDQ quantizer folds into the quantization before them
    are gone from the converted graph and are not listed.
    """
    source_tensors = {o: n.name for n in source.graph.node for o in n.output}
    producers = {o: n for n in converted.graph.node for o in n.output}
    consumers: dict[str, list] = {}
    for node in converted.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    names = {n.name for n in source.graph.node}
    found = set()
    for node in converted.graph.node:
        if node.name in names and node.op_type not in CONVERSION_OPS:
            fed = any(producers.get(i) is not None and producers[i].op_type == "DequantizeLinear" for i in node.input)
            feeds = any(c.op_type == "QuantizeLinear" for o in node.output for c in consumers.get(o, []))
            if fed and feeds:
                found.add(node.name)
        if node.op_type in INTEGER_OPS:
            found.update(_source_nodes_downstream(node, consumers, source_tensors))
    return tuple(n.name for n in source.graph.node if n.name in found)


def cpu_isa() -> dict[str, bool | str | None]:
    """The CPU's instruction sets that decide how ONNX Runtime runs INT8, from /proc/cpuinfo.

    INT8 speed and even INT8 results depend on them: with AVX-512 VNNI, AVX-VNNI or AMX the
    u8 x s8 dot products run in one instruction; on AVX2 alone ONNX Runtime uses a 16-bit
    intermediate that can saturate. A figure measured here is only read as from a CPU with
    VNNI when this says so. Values are None when the flags cannot be read (no /proc/cpuinfo,
    or a CPU that lists no x86 flags).
    """
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16")  # bf16: OpenVINO's bf16 precision
    flags, model = cpu_flags(), cpu_model()
    known = bool(flags)
    isa: dict[str, bool | str | None] = {name: (name in flags) if known else None for name in wanted}
    isa["amx"] = bool(flags & {"amx_int8", "amx_tile"}) if known else None
    isa["int8_dot_product"] = (isa["avx512_vnni"] or isa["avx_vnni"] or isa["amx"]) if known else None
    isa["cpu"] = model
    return isa


def _calibration_states(calibration: np.ndarray | None, calibrate_method: str) -> np.ndarray:
    if calibrate_method not in CALIBRATE_METHODS:
        raise QuantizeError(f"unknown calibrate_method {calibrate_method!r}; known: {', '.join(CALIBRATE_METHODS)}")
    if calibration is None or len(calibration) == 0:
        raise QuantizeError("static quantization needs calibration states; none were given")
    states = np.ascontiguousarray(calibration)
    if states.dtype not in (np.uint8, np.float32, np.float16) or states.ndim != 4:
        raise QuantizeError(f"calibration states must be 4-D observations as the model takes them (uint8, float32 "
                            f"or float16), got {states.dtype} {states.shape}")
    wanted = MIN_CALIBRATION_STATES[calibrate_method]
    if len(states) < wanted:
        raise QuantizeError(f"{calibrate_method} calibration needs at least {wanted} states, got {len(states)}")
    return states


def checked_exclusions(model, nodes_to_exclude: Sequence[str], path: Path) -> tuple[str, ...]:
    if isinstance(nodes_to_exclude, str):
        raise QuantizeError("nodes_to_exclude must be a list of node names, not one string")
    names = [n.name for n in model.graph.node]
    excluded = tuple(dict.fromkeys(nodes_to_exclude))
    unknown = [n for n in excluded if n not in names]
    if unknown:
        raise QuantizeError(f"nodes_to_exclude: {not_a_node(unknown[0], names, path.name)}")
    return excluded


def pinned_input(model, states: np.ndarray) -> str | None:
    """The scaled input whose quantization is pinned to 1/255 on these calibration states, so that
    every pixel stays exact: a uint8 input's, or a float input's whose states are whole pixels in
    0-255 (a float input holding other values keeps its calibrated range); None without one."""
    scaled = scaled_input_tensor(model)
    if scaled is None or has_preprocessing(model):
        return scaled
    whole_pixels = states.min() >= 0 and states.max() <= 255 and np.array_equal(states, np.round(states))
    return scaled if whole_pixels else None


def calibration_fits(model, states: np.ndarray, path: Path) -> None:
    """Raise QuantizeError unless the calibration states have the dtype the model's input takes."""
    import onnx

    takes = onnx.helper.tensor_dtype_to_np_dtype(model.graph.input[0].type.tensor_type.elem_type)
    if states.dtype != takes:
        raise QuantizeError(f"calibration states are {states.dtype}; {path.name} takes {np.dtype(takes)}: "
                            "give them as its input takes them")


def fixed_input_scale(model, scaled_input: str) -> float | None:
    """The scale of the QuantizeLinear on the scaled input (its zero point must be 0); None without one."""
    from onnx import numpy_helper

    constants = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] == scaled_input:
            scale, zero = constants.get(node.input[1]), constants.get(node.input[2]) if len(node.input) > 2 else None
            if scale is None or scale.size != 1 or (zero is not None and int(zero.reshape(-1)[0]) != 0):
                raise QuantizeError(f"the scaled input {scaled_input!r} is quantized with scale {scale} and zero "
                                    f"point {zero}, not one scale of 1/255 and zero point 0")
            return float(scale.reshape(-1)[0])
    return None


def _excluded_quantized_at_load(model: bytes, excluded: Sequence[str]) -> tuple[str, ...]:
    """Excluded nodes whose weights ONNX Runtime's CPU session quantizes anyway.

    Its WeightBiasQuantization graph transformer (basic level, so on by default) gives a
    Conv or Gemm that reads a DequantizeLinear output and feeds a quantized tensor int8
    per-tensor weights and an int32 bias when the session is made: such a node, excluded
    between quantized neighbours, does not run in float. Read from the basic-level
    optimised graph that ONNX Runtime writes out.
    """
    import onnx
    import onnxruntime as ort

    if not excluded:
        return ()
    with tempfile.TemporaryDirectory(prefix="quantize-load-") as folder:
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
        options.optimized_model_filepath = str(Path(folder) / "basic.onnx")
        ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
        loaded = onnx.load(options.optimized_model_filepath)
    producers = {o: n.op_type for n in loaded.graph.node for o in n.output}
    return tuple(n.name for n in loaded.graph.node
                 if n.name in excluded and len(n.input) > 1 and producers.get(n.input[1]) == "DequantizeLinear")


def _ort_calibrate_method(name: str):
    from onnxruntime.quantization import CalibrationMethod

    return {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
            "percentile": CalibrationMethod.Percentile}[name]


def _calibrate(model_path: Path, states: np.ndarray, calibrate_method: str, cache: Path, folder: Path) -> None:
    """ONNX Runtime's calibrator over the states; its ranges go to the cache quantize_static reads."""
    from onnxruntime.quantization import CalibrationDataReader
    from onnxruntime.quantization.calibrate import create_calibrator, save_tensors_data

    class Reader(CalibrationDataReader):
        def __init__(self, name: str, batch: int):
            self._name = name
            self._batches = iter(calls(states, batch, repeat_states=True))

        def get_next(self) -> dict[str, np.ndarray] | None:
            batch = next(self._batches, None)
            return None if batch is None else {self._name: batch}

    options = dict(CALIBRATION_OPTIONS[calibrate_method])
    calibrator = create_calibrator(model_path, None, augmented_model_path=str(folder / "augmented.onnx"),
                                   calibrate_method=_ort_calibrate_method(calibrate_method), extra_options=options)
    first = calibrator.model.graph.input[0]
    fixed = fixed_batch([d.dim_param or d.dim_value for d in first.type.tensor_type.shape.dim])
    with contextlib.redirect_stdout(io.StringIO()):  # the histogram calibrators print their progress
        calibrator.collect_data(Reader(first.name, fixed or CALIBRATION_BATCH))  # a fixed batch fed as it is
        ranges = calibrator.compute_data()
    save_tensors_data(ranges, cache)


def _source_nodes_downstream(node, consumers: dict[str, list], source_tensors: dict[str, str]) -> set[str]:
    """The source nodes whose output tensors the chain after an integer op first reaches."""
    found, frontier, seen = set(), list(node.output), set()
    while frontier:
        tensor = frontier.pop()
        if tensor in seen:
            continue
        seen.add(tensor)
        if tensor in source_tensors:
            found.add(source_tensors[tensor])
            continue
        for consumer in consumers.get(tensor, []):
            frontier.extend(consumer.output)
    return found
