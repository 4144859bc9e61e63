"""PyTorch -> ONNX export of a Q-network, and its FP16 variant, with the checks that matter.

The exporter is torch.onnx.export(dynamo=True), the torch.export-based exporter that is the
default and the maintained path since torch 2.9 (it needs onnxscript); the TorchScript one
(`exporter="torchscript"`) is deprecated and kept only as an explicit choice.

The graph takes what the environment gives, `obs` uint8 (B, 4, 84, 84) with a dynamic
batch axis, and returns `q_values` float32 (B, 4): the uint8 -> float cast and the /255
scaling are inside the graph, so every runtime is fed the same bytes.

The FP16 variant comes from onnxconverter-common's float16 converter with
keep_io_types=True, so its I/O stays uint8 in and float32 out (`breakout_core/conversion/fp16.py`,
which also keeps chosen nodes in float32 for the repair search).

Each check is run, and named in ExportResult.checks; one that fails raises ExportError.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from breakout_core.common.hashing import file_sha256
from breakout_core.conversion.onnx_checks import META_PREFIX, ModelCheckError, SavedModel, load_graph, save_checked

INPUT_NAME = "obs"
OUTPUT_NAME = "q_values"
BATCH_DIM = "batch"
DEFAULT_OPSET = 18
EXPORTERS = ("dynamo", "torchscript")
VERIFY_ATOL_FP32 = 1e-4  # export sanity check only; parity.py judges runtimes with its own tolerances


class ExportError(ModelCheckError):
    """An export failed one of its checks."""


@dataclass(frozen=True)
class OnnxArtifact:
    path: Path
    size_bytes: int  # file size
    sha256: str
    precision: str  # "fp32" or "fp16" (weights and compute; I/O stay uint8 -> float32)


@dataclass(frozen=True)
class ExportResult:
    fp32: OnnxArtifact
    fp16: OnnxArtifact | None
    opset: int
    exporter: str
    checks: tuple[str, ...]  # every check run and passed, in order
    verify_max_abs_diff: float | None  # ORT CPU vs torch on the verify batch, FP32 model
    fp16_verify_max_abs_diff: float | None  # the same for the FP16 model (recorded, not gated)
    contract_hash: str | None
    checkpoint_sha256: str | None
    versions: dict[str, str] = field(default_factory=dict)

    @property
    def onnx_path(self) -> Path:
        return self.fp32.path

    @property
    def onnx_bytes(self) -> int:
        return self.fp32.size_bytes

    @property
    def fp16_path(self) -> Path | None:
        return self.fp16.path if self.fp16 else None

    @property
    def fp16_bytes(self) -> int | None:
        return self.fp16.size_bytes if self.fp16 else None


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # numpy name: "uint8", "float32", "float16"
    shape: tuple[int | str, ...]  # ints for fixed dims, names for dynamic ones


@dataclass(frozen=True)
class OnnxInfo:
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    opset: int
    precision: str  # from the initializers: "fp16" when any float weight is float16, else "int8" with int8 weights
    node_count: int
    op_types: tuple[str, ...]
    metadata: dict[str, str]


def export_onnx(
    source: Any,
    onnx_path: str | Path,
    *,
    fp16_path: str | Path | None = None,
    opset: int = DEFAULT_OPSET,
    exporter: str = "dynamo",
    verify_obs: np.ndarray | None = None,
    contract_hash: str | None = None,
) -> ExportResult:
    """Export a QNetwork (or a checkpoint path) to ONNX, optionally with an FP16 copy.

    `verify_obs` (uint8 (B, 4, 84, 84)) is run through torch and ONNX Runtime CPU as a
    sanity check (FP32 must agree within 1e-4); by default a seeded random batch of 4. A
    checkpoint's contract hash and sha256 are written into the model's metadata.
    """
    import onnx
    import torch

    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; known: {', '.join(EXPORTERS)}")
    network, checkpoint_sha, contract_hash = _network_from(source, contract_hash)
    onnx_path = Path(onnx_path)
    checks: list[str] = []

    sample = torch.zeros((2, 4, 84, 84), dtype=torch.uint8)
    network = network.eval().cpu()
    with torch.no_grad():
        if exporter == "dynamo":
            try:
                import onnxscript  # noqa: F401  (the dynamo exporter's dependency; a clear error here)
            except ImportError as exc:
                raise ExportError(f"the dynamo ONNX exporter needs onnxscript ({exc}); "
                                  "pip install onnxscript") from None
            with _quiet_exporter():
                program = torch.onnx.export(
                    network,
                    (sample,),
                    dynamo=True,
                    input_names=[INPUT_NAME],
                    output_names=[OUTPUT_NAME],
                    dynamic_shapes=({0: torch.export.Dim(BATCH_DIM)},),
                    opset_version=opset,
                    verbose=False,
                )
            model = program.model_proto
        else:
            import io

            buffer = io.BytesIO()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                torch.onnx.export(
                    network,
                    (sample,),
                    buffer,
                    dynamo=False,
                    input_names=[INPUT_NAME],
                    output_names=[OUTPUT_NAME],
                    dynamic_axes={INPUT_NAME: {0: BATCH_DIM}, OUTPUT_NAME: {0: BATCH_DIM}},
                    opset_version=opset,
                )
            model = onnx.load_from_string(buffer.getvalue())

    versions = _versions()
    checks += _check_model(model, "fp32")
    verify = _verify_batch(verify_obs)
    with torch.no_grad():
        expected = network(torch.from_numpy(verify)).numpy()
    diffs: dict[str, float] = {}

    def verify_fp32(data: bytes) -> str:
        diffs["fp32"] = diff = _ort_max_abs_diff(data, verify, expected)
        if not diff <= VERIFY_ATOL_FP32:
            raise ExportError(f"{onnx_path}: ONNX Runtime CPU differs from torch by {diff:.3g} (> {VERIFY_ATOL_FP32})")
        return f"onnxruntime CPU vs torch on {len(verify)} states: max |dQ| {diff:.3g} <= {VERIFY_ATOL_FP32}"

    saved = save_checked(model, onnx_path, {
        "precision": "fp32",
        "architecture": getattr(network, "architecture", "unknown"),
        "contract_hash": contract_hash or "",
        "checkpoint_sha256": checkpoint_sha or "",
        "exporter": f"torch.onnx.export({'dynamo=True' if exporter == 'dynamo' else 'dynamo=False'}) "
                    f"torch {torch.__version__}",
        "preprocessing": "uint8 -> float32, / 255, inside the graph",
    }, verify=verify_fp32)
    checks += saved.checks
    fp32 = _artifact(saved, "fp32")
    actual_opset = _default_opset(model)

    fp16 = None
    if fp16_path is not None:
        def verify_fp16(data: bytes) -> str:
            diffs["fp16"] = diff = _ort_max_abs_diff(data, verify, expected)
            if not np.isfinite(diff):
                raise ExportError(f"{fp16_path}: FP16 model gives non-finite Q-values")
            return f"onnxruntime CPU vs torch FP32 on {len(verify)} states: max |dQ| {diff:.3g} (recorded)"

        fp16, fp16_checks = convert_to_fp16(onnx_path, fp16_path, verify=verify_fp16)
        checks += fp16_checks

    return ExportResult(
        fp32=fp32,
        fp16=fp16,
        opset=actual_opset,
        exporter=exporter,
        checks=tuple(checks),
        verify_max_abs_diff=diffs["fp32"],
        fp16_verify_max_abs_diff=diffs.get("fp16"),
        contract_hash=contract_hash,
        checkpoint_sha256=checkpoint_sha,
        versions=versions,
    )


def convert_to_fp16(onnx_path: str | Path, fp16_path: str | Path,
                    verify: Callable[[bytes], str] | None = None) -> tuple[OnnxArtifact, list[str]]:
    """FP16 copy of an FP32 model (onnxconverter-common, keep_io_types=True); returns its checks.
    `verify` checks the converted bytes before they are written (onnx_checks.save_checked)."""
    import onnx

    from breakout_core.conversion.fp16 import converter_description, to_float16

    try:
        # nothing kept in float32: nothing for the post-pass of to_float16 to correct
        model16, _ = to_float16(onnx.load(onnx_path))
        converter = converter_description()
    except ImportError as exc:
        raise ExportError(f"FP16 conversion needs onnxconverter-common ({exc}); "
                          "pip install onnxconverter-common") from None
    checks = _check_model(model16, "fp16")
    saved = save_checked(model16, fp16_path, {
        "precision": "fp16",
        "fp16_converter": converter,
    }, verify=verify)
    checks = ["fp16: " + c for c in checks + saved.checks]
    return _artifact(saved, "fp16"), checks


def onnx_contract(path: str | Path) -> tuple[str | None, str | None]:
    """(None, hash) of the contract an exported model's weights were trained under (the file
    records no name); the hash is None for a model exported from a bare network."""
    return None, inspect_onnx(path).metadata.get(META_PREFIX + "contract_hash") or None


def onnx_precision(path: str | Path) -> str:
    """'fp32', 'fp16' or 'int8': the precision of an ONNX file's weights, as its writer recorded
    it (`breakout.precision`), else as its initializers say; initializers in fp16 or int8 win over
    a recorded fp32, which a converter that keeps its source's metadata leaves behind. Every
    backend reads it here."""
    info = inspect_onnx(path)
    recorded = info.metadata.get(META_PREFIX + "precision")
    return info.precision if info.precision != "fp32" and recorded in (None, "fp32") else recorded or info.precision


def inspect_onnx(path: str | Path) -> OnnxInfo:
    """Graph inputs/outputs (dtype, shape), opset, precision, ops and metadata of a model file, read
    from its graph alone (external data is not loaded); ModelCheckError where it is not a model."""
    return _info(load_graph(path))


def _info(model) -> OnnxInfo:
    import onnx

    def tensors(values) -> tuple[TensorInfo, ...]:
        out = []
        for v in values:
            t = v.type.tensor_type
            try:
                dtype = np.dtype(onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)).name
            except (KeyError, TypeError, ValueError):  # not a tensor (a sequence, a map), or no type given
                dtype = "not a tensor" if v.type.WhichOneof("value") != "tensor_type" else "no dtype"
            shape = tuple(d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim)
            out.append(TensorInfo(v.name, dtype, shape))
        return tuple(out)

    float_types = [i.data_type for i in model.graph.initializer
                   if i.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16)]
    integer_weights = any(i.data_type == onnx.TensorProto.INT8 for i in model.graph.initializer)
    precision = "fp16" if onnx.TensorProto.FLOAT16 in float_types else "int8" if integer_weights else "fp32"
    return OnnxInfo(
        inputs=tensors(model.graph.input),
        outputs=tensors(model.graph.output),
        opset=_default_opset(model),
        precision=precision,
        node_count=len(model.graph.node),
        op_types=tuple(n.op_type for n in model.graph.node),
        metadata={p.key: p.value for p in model.metadata_props},
    )


def _check_model(model, precision: str) -> list[str]:
    """The input, output and weights every exported model must have; names of the checks run,
    ExportError on failure (onnx_checks.save_checked runs the checks every written file passes)."""
    checks = []
    info = _info(model)
    if len(info.inputs) != 1 or len(info.outputs) != 1:
        raise ExportError(f"expected one input and one output, got {info.inputs} -> {info.outputs}")
    (inp,), (out,) = info.inputs, info.outputs
    if (inp.name, inp.dtype, inp.shape[1:]) != (INPUT_NAME, "uint8", (4, 84, 84)):
        raise ExportError(f"input must be {INPUT_NAME} uint8 (B, 4, 84, 84), got {inp}")
    if (out.name, out.dtype, out.shape[1:]) != (OUTPUT_NAME, "float32", (4,)):
        raise ExportError(f"output must be {OUTPUT_NAME} float32 (B, 4), got {out}")
    checks.append(f"io: {INPUT_NAME} uint8 {list(inp.shape)} -> {OUTPUT_NAME} float32 {list(out.shape)}")
    if not (isinstance(inp.shape[0], str) and inp.shape[0] and inp.shape[0] == out.shape[0]):
        raise ExportError(f"batch axis must be dynamic and shared by input and output, "
                          f"got {inp.shape[0]!r} -> {out.shape[0]!r}")
    checks.append(f"dynamic batch axis {inp.shape[0]!r}")
    if info.precision != precision:
        raise ExportError(f"expected {precision} weights, the initializers say {info.precision}")
    checks.append(f"weights {precision}")
    return checks


def _network_from(source: Any, contract_hash: str | None):
    from breakout_core.learning.qnetwork import QNetwork, load_checkpoint

    if isinstance(source, QNetwork):
        return source, None, contract_hash
    if isinstance(source, (str, Path)):
        network, meta = load_checkpoint(source)
        own = meta.get("contract_hash")
        if contract_hash is not None and own != contract_hash:
            raise ValueError(f"{source}: checkpoint contract {own}, expected {contract_hash}")
        return network, file_sha256(source), own
    raise TypeError(f"export source must be a QNetwork or a checkpoint path, got {type(source).__name__}")


def _verify_batch(verify_obs: np.ndarray | None) -> np.ndarray:
    if verify_obs is None:
        return np.random.default_rng(0).integers(0, 256, size=(4, 4, 84, 84), dtype=np.uint8)
    verify_obs = np.ascontiguousarray(verify_obs)
    if verify_obs.dtype != np.uint8 or verify_obs.shape[1:] != (4, 84, 84):
        raise ValueError(f"verify_obs must be uint8 (B, 4, 84, 84), got {verify_obs.dtype} {verify_obs.shape}")
    return verify_obs


def _ort_max_abs_diff(model: bytes, obs: np.ndarray, expected: np.ndarray) -> float:
    """Largest |dQ| of ONNX Runtime CPU on the serialized `model` against torch's `expected`."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    got = session.run([OUTPUT_NAME], {INPUT_NAME: obs})[0]
    return float(np.max(np.abs(got.astype(np.float64) - expected.astype(np.float64))))


@contextlib.contextmanager
def _quiet_exporter():
    """Silence two known, harmless notices of torch's exporter: torchvision ops it cannot
    register (torchvision is not a dependency) and a pytree FutureWarning from torch itself."""
    registration = logging.getLogger("torch.onnx._internal.exporter._registration")
    level = registration.level
    registration.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
            yield
    finally:
        registration.setLevel(level)


def _default_opset(model) -> int:
    return next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))


def _artifact(saved: SavedModel, precision: str) -> OnnxArtifact:
    return OnnxArtifact(path=saved.path, size_bytes=saved.size_bytes, sha256=saved.sha256, precision=precision)


def _versions() -> dict[str, str]:
    import onnx
    import torch

    versions = {"torch": torch.__version__, "onnx": onnx.__version__, "numpy": np.__version__}
    for name in ("onnxscript", "onnxruntime", "onnxconverter_common"):
        try:
            module = __import__(name)
            versions[name] = getattr(module, "__version__", "unknown")
        except ImportError:
            pass
    return versions
