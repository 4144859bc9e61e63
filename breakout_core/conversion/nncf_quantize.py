"""INT8 ONNX from an FP32 model with NNCF's post-training quantization (`nncf.quantize` on the
ONNX graph), beside ONNX Runtime's own quantizer (breakout_core.conversion.quantize).

NNCF writes QuantizeLinear/DequantizeLinear pairs into the ONNX graph as ONNX Runtime's
quantizer does, so its file is one ONNX file that `runtime: openvino` (and `runtime:
onnxruntime`) loads, checked and written whole as every other export
(onnx_checks.save_checked), its provenance in its metadata (`breakout.int8_quantizer` names
NNCF and its version) and in the spec's `int8_files`.

Where it differs from the ONNX Runtime path, and why:

- Ranges: NNCF's defaults for a CPU (preset "performance"): symmetric INT8 weights, one scale
  per output channel; an activation's range is the mean, over the calibration states, of each
  state's minimum and maximum (`mean_minmax`; the states go one per calibration batch, so the
  mean is over states, not batches). Then fast bias correction shifts each quantized layer's
  bias to undo the mean error quantization adds to its output on those states.
- Layers: NNCF quantizes the inputs of Conv and Gemm and puts its quantizer after each Relu
  rather than folding the Relu into it; the last Gemm reads quantized inputs and writes float
  Q-values. `nodes_quantized` therefore names the Conv/Gemm/MatMul nodes whose data input and
  weights both come out of a DequantizeLinear.
- The input: NNCF gives the scaled input (uint8 / 255) the range of its calibration states,
  which ends near their brightest pixel, so a brighter pixel in play would be clipped and no
  pixel lands on a level. Its quantizer is pinned to scale 1/255 and zero point 0 (uint8)
  after quantization, as the ONNX Runtime path pins it, so every uint8 pixel survives exactly.
  Fast bias correction ran with NNCF's own input range; the first layer's bias keeps that
  small correction.
- Nodes kept in float (`nodes_to_exclude`) go to NNCF's ignored scope by name.
"""

from __future__ import annotations

import contextlib
import io
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from breakout_core.conversion.onnx_checks import (
    ModelCheckError,
    has_preprocessing,
    one_line,
    read_source_model,
    save_checked,
)
from breakout_core.conversion.quantize import (
    INPUT_SCALE,
    Int8Artifact,
    QuantizeError,
    calibration_fits,
    checked_exclusions,
    fixed_input_scale,
    pinned_input,
)

# min/max ranges need states that reach the extremes play reaches, as for ONNX Runtime's minmax
NNCF_MIN_CALIBRATION_STATES = 16
NNCF_CALIBRATE_METHOD = "mean_minmax"
NNCF_OPTIONS = {"preset": "performance", "fast_bias_correction": True, "calibration_batch": 1}
QUANTIZABLE_OPS = frozenset({"Conv", "Gemm", "MatMul"})
SHAPE_OPS = frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose"})
INSTALL_HINT = "pip install -e '.[openvino]'"
# why a spec cannot ask NNCF for one weight scale per tensor (per_channel: false)
PER_CHANNEL_ONLY = "nncf's CPU preset gives each output channel its own weight scale"


class QuantizerUnavailable(QuantizeError):
    """NNCF cannot be imported here; the text says why and how to install it."""


def nncf_available() -> tuple[bool, str]:
    """Whether NNCF can quantize here, and why not (one line)."""
    try:
        import nncf  # noqa: F401
    except Exception as exc:  # noqa: BLE001 -- a missing package and a broken one alike
        return False, f"nncf cannot be imported ({type(exc).__name__}: {one_line(exc)}); {INSTALL_HINT}"
    return True, ""


def require_nncf(where: str) -> None:
    """Raise ValueError naming `where` (the spec field that asks for NNCF) where NNCF cannot quantize
    here: a run says so before any calibration game is played."""
    ok, reason = nncf_available()
    if not ok:
        raise ValueError(f"{where}: nncf is unavailable here: {reason}")


def quantize_nncf(fp32_path: str | Path, out_path: str | Path, *, calibration: np.ndarray,
                  nodes_to_exclude: Sequence[str] = ()) -> Int8Artifact:
    """Write an INT8 (QDQ) copy of an FP32 ONNX model with `nncf.quantize`.

    `calibration`: observations as the model's input takes them (the agent's uint8 (N, 4, 84, 84), or
    a float input's values), at least NNCF_MIN_CALIBRATION_STATES, the same states the ONNX Runtime
    path would be given. `nodes_to_exclude`: node names of
    the FP32 graph NNCF leaves in float. Raises QuantizerUnavailable where NNCF is missing.
    """
    ok, reason = nncf_available()
    if not ok:
        raise QuantizerUnavailable(reason)
    import nncf
    import onnx
    import onnxruntime as ort

    fp32_path, out_path = Path(fp32_path), Path(out_path)
    states = _states(calibration)
    source, data, source_sha256 = read_source_model(fp32_path, QuantizeError)
    calibration_fits(source, states, fp32_path)
    excluded = checked_exclusions(source, nodes_to_exclude, fp32_path)
    scaled_input = pinned_input(source, states)
    input_name = source.graph.input[0].name
    dataset = nncf.Dataset([states[i:i + 1] for i in range(len(states))], lambda batch: {input_name: batch})
    scope = nncf.IgnoredScope(names=list(excluded)) if excluded else None
    try:
        with _quiet():
            model = nncf.quantize(onnx.load_from_string(data), dataset, preset=nncf.QuantizationPreset.PERFORMANCE,
                                  subset_size=len(states), fast_bias_correction=True, ignored_scope=scope)
    except Exception as exc:  # noqa: BLE001 -- NNCF raises many classes
        raise QuantizeError(f"{fp32_path}: nncf could not quantize it ({one_line(exc)})") from None
    checks = [f"nncf.quantize on {len(states)} states, one a batch (preset performance, fast bias correction)"]
    quantized = _quantized_nodes(source, model)
    if not quantized:
        raise QuantizeError(f"{fp32_path}: nncf quantized no Conv, Gemm or MatMul "
                            f"(excluded: {', '.join(excluded) or 'none'})")
    checks.append(f"{len(quantized)} node(s) read quantized inputs and weights: {', '.join(quantized)}")
    input_scale = None
    if scaled_input is not None:
        checks.append(_pin_input_scale(model, scaled_input, out_path))
        input_scale = fixed_input_scale(model, scaled_input)
    quantizer = f"nncf {nncf.__version__} nncf.quantize (ONNX backend)"
    try:  # every check runs before the file is written: a failed one leaves out_path as it was
        saved = save_checked(model, out_path, {
            "precision": "int8",
            "int8_method": "static",
            "int8_calibrate_method": NNCF_CALIBRATE_METHOD,
            "int8_calibration_states": len(states),
            "int8_calibration_options": ",".join(f"{k}={v}" for k, v in NNCF_OPTIONS.items()),
            "int8_per_channel": True,
            "int8_nodes_excluded": ",".join(excluded),
            "int8_nodes_quantized": ",".join(quantized),
            "int8_quantizer": quantizer,
            "int8_source_sha256": source_sha256,
        }, preprocessing=has_preprocessing(source), verify=_opens_in_onnxruntime)
    except ModelCheckError as exc:
        raise QuantizeError(f"{out_path}: {exc}") from None
    return Int8Artifact(
        path=out_path, size_bytes=saved.size_bytes, sha256=saved.sha256,
        source_sha256=source_sha256, method="static", calibrate_method=NNCF_CALIBRATE_METHOD,
        calibration_states=len(states), calibration_options=dict(NNCF_OPTIONS), per_channel=True,
        nodes_excluded=excluded, nodes_quantized=quantized, excluded_quantized_at_load=(),
        input_scale=input_scale, onnxruntime_version=ort.__version__, checks=tuple(checks + saved.checks),
        quantizer=quantizer,
    )


def _states(calibration: np.ndarray | None) -> np.ndarray:
    if calibration is None or len(calibration) == 0:
        raise QuantizeError("nncf quantization needs calibration states; none were given")
    states = np.ascontiguousarray(calibration)
    if states.dtype not in (np.uint8, np.float32, np.float16) or states.ndim != 4:
        raise QuantizeError(f"calibration states must be 4-D observations as the model takes them (uint8, float32 "
                            f"or float16), got {states.dtype} {states.shape}")
    if len(states) < NNCF_MIN_CALIBRATION_STATES:
        raise QuantizeError(f"nncf calibration needs at least {NNCF_MIN_CALIBRATION_STATES} states, got {len(states)}")
    return states


@contextlib.contextmanager
def _quiet():
    """NNCF logs its progress bars and notes to the terminal; a run's own progress says enough."""
    logger = logging.getLogger("nncf")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def _quantized_nodes(source, model) -> tuple[str, ...]:
    """Source nodes (Conv, Gemm, MatMul) whose data input and weights both come out of a
    DequantizeLinear in NNCF's graph (through reshapes, which move values without changing
    them), in source order."""
    producers = {o: n for n in model.graph.node for o in n.output}

    def dequantized(tensor: str) -> bool:
        node = producers.get(tensor)
        while node is not None and node.op_type in SHAPE_OPS:
            node = producers.get(node.input[0])
        return node is not None and node.op_type == "DequantizeLinear"

    found = {n.name for n in model.graph.node
             if n.op_type in QUANTIZABLE_OPS and len(n.input) > 1 and all(dequantized(i) for i in n.input[:2])}
    return tuple(n.name for n in source.graph.node if n.name in found)


def _pin_input_scale(model, scaled_input: str, out_path: Path) -> str:
    """Set the scaled input's quantizer (and the dequantizers after it) to scale 1/255, zero
    point 0 as uint8; returns the check's description."""
    from onnx import numpy_helper

    initializers = {i.name: i for i in model.graph.initializer}
    quantizers = [n for n in model.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == scaled_input]
    if not quantizers:
        return f"input {scaled_input!r} left in float by nncf"
    if len(quantizers) != 1:
        raise QuantizeError(f"{out_path}: nncf put {len(quantizers)} quantizers on the scaled input {scaled_input!r}")
    quantizer = quantizers[0]
    nodes = [quantizer] + [n for n in model.graph.node
                           if n.op_type == "DequantizeLinear" and n.input[0] == quantizer.output[0]]
    for node in nodes:
        if len(node.input) < 3 or node.input[1] not in initializers or node.input[2] not in initializers:
            raise QuantizeError(f"{out_path}: the scaled input's {node.op_type} {node.name!r} has no constant scale "
                                "and zero point to pin")
        for name, value in ((node.input[1], np.array(INPUT_SCALE, dtype=np.float32)),
                            (node.input[2], np.array(0, dtype=np.uint8))):
            initializers[name].CopyFrom(numpy_helper.from_array(value, name))
    return f"input {scaled_input!r} pinned to scale 1/255, zero point 0 (uint8): every pixel exact"


def _opens_in_onnxruntime(data: bytes) -> str:
    """NNCF's graph opens in an ONNX Runtime CPU session (its QDQ pairs are standard ONNX)."""
    import onnxruntime as ort

    ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    return "opens in an ONNX Runtime CPU session"
