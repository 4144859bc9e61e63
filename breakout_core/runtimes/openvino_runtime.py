"""OpenVINO's CPU plugin on an exported ONNX file: FP32, FP16 or INT8 (QDQ, from
breakout_core.conversion.quantize).

What ran is read back from the compiled model, not assumed:
- the inference precision. On a CPU with AVX512-BF16 or AMX the CPU plugin computes in bf16
  unless told otherwise, and it replaces a precision hint the CPU cannot compute (f16 on a
  CPU without AMX-FP16) by bf16 without a word. So the hint is always set (f32 by default),
  a precision missing from the plugin's OPTIMIZATION_CAPABILITIES is refused when the options
  are resolved, and a compiled precision other than the requested one is refused at load;
- each compute layer's runtime precision and kernel (the runtime model's rt_info): an INT8
  file's quantized layers run on u8/i8 kernels (`Int8Run.integer_kernels`, by layer name), an
  FP16 file's weights are decompressed and computed in the inference precision;
- the threads, streams, performance hint and CPU pinning in force.

CPU pinning is off unless asked for: a pinned thread waits for its own core, so on a machine
shared with other work a batch-1 call's wall time becomes many times its CPU time.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np

from breakout_core.common.batch_calls import in_calls
from breakout_core.conversion.model_prechecks import file_fixed_batch
from breakout_core.runtimes.actual import ActualRun, Int8Run
from breakout_core.runtimes.base import (
    Option,
    Runtime,
    RuntimeUnavailable,
    import_error_reason,
    installed_version,
)

# the spec's names -> OpenVINO's element types and the CPU plugin's capability names
INFERENCE_PRECISIONS = {"f32": "fp32", "bf16": "bf16", "f16": "fp16"}
CAPABILITIES = {"f32": "FP32", "bf16": "BF16", "f16": "FP16"}
PERFORMANCE_HINTS = {"latency": "LATENCY", "throughput": "THROUGHPUT"}
COMPUTE_LAYERS = frozenset({"Convolution", "FullyConnected", "MatMul", "Deconvolution"})
INTEGER_PRECISIONS = frozenset({"u8", "i8"})


class OpenVINORuntime(Runtime):
    name = "openvino"
    artifact_types = ("onnx",)
    EXTRA = "openvino"
    OPTIONS = {
        "device": Option("cpu", ("cpu",), description="OpenVINO's CPU plugin"),
        "threads": Option(None, value_type=int, minimum=1,
                          description="INFERENCE_NUM_THREADS; None: OpenVINO's default (one per core)"),
        "performance_hint": Option("latency", tuple(PERFORMANCE_HINTS),
                                   description="PERFORMANCE_HINT: latency (one stream) or throughput (several)"),
        "inference_precision": Option("f32", tuple(INFERENCE_PRECISIONS),
                                      description="INFERENCE_PRECISION_HINT, always set: unset, the CPU plugin "
                                      "computes in bf16 on a CPU with AVX512-BF16 or AMX; a precision this CPU "
                                      "cannot compute is refused"),
        "cpu_pinning": Option(False, (False, True),
                              description="ENABLE_CPU_PINNING; off because a pinned thread waits for its own core, "
                              "so on a machine shared with other work a batch-1 call's wall time becomes many times "
                              "its CPU time"),
    }

    @classmethod
    def resolve_options(cls, **options: Any) -> dict[str, Any]:
        resolved = super().resolve_options(**options)
        capabilities = cpu_capabilities()
        wanted = CAPABILITIES[resolved["inference_precision"]]
        if capabilities is not None and wanted not in capabilities:
            raise ValueError(f"runtime 'openvino': inference_precision={resolved['inference_precision']!r}: this CPU "
                             f"does not compute {wanted} (OpenVINO's CPU plugin offers {', '.join(capabilities)})")
        return resolved

    @classmethod
    def precision(cls, options: dict[str, Any], artifact_precision: str) -> str:
        """An INT8 file runs its quantized layers on integers; anything else computes in the
        inference precision (an FP16 file's weights are decompressed to it)."""
        return "int8" if artifact_precision == "int8" else INFERENCE_PRECISIONS[options["inference_precision"]]

    @classmethod
    def _available(cls, options: dict[str, Any]) -> tuple[bool, str]:
        try:
            import openvino
        except Exception as exc:
            return False, f"{import_error_reason('openvino', exc)}; pip install -e '.[{cls.EXTRA}]'"
        devices = openvino.Core().available_devices
        if "CPU" not in devices:
            return False, f"OpenVINO {openvino.__version__} has no CPU device here (devices: {devices})"
        return True, ""

    # -- loading ----------------------------------------------------------------------------
    def _load(self, path: Path) -> None:
        import openvino

        from breakout_core.conversion.export import inspect_onnx, onnx_precision

        self._file_precision = onnx_precision(path)
        self._static_batch = file_fixed_batch(path)
        self._model_meta = inspect_onnx(path).metadata
        core = openvino.Core()
        try:
            model = core.read_model(str(path))
        except Exception as exc:
            raise ValueError(f"{path}: OpenVINO cannot read this model: {' '.join(str(exc).split())}") from None
        uint8_input = len(model.inputs) == 1 and model.inputs[0].get_element_type().get_type_name() == "u8"
        if not uint8_input or len(model.outputs) != 1:
            raise ValueError(f"{path}: expected one uint8 input and one output, got "
                             f"{[(i.get_any_name(), str(i.get_element_type())) for i in model.inputs]} -> "
                             f"{[o.get_any_name() for o in model.outputs]}")
        config: dict[str, Any] = {
            "INFERENCE_PRECISION_HINT": self.requested["inference_precision"],
            "PERFORMANCE_HINT": PERFORMANCE_HINTS[self.requested["performance_hint"]],
            "ENABLE_CPU_PINNING": bool(self.requested["cpu_pinning"]),
        }
        if self.requested["threads"] is not None:
            config["INFERENCE_NUM_THREADS"] = int(self.requested["threads"])
        try:
            self._compiled = core.compile_model(model, "CPU", config)
        except Exception as exc:  # the plugin raises one class for every refusal
            raise ValueError(f"{path}: OpenVINO's CPU plugin cannot compile this model: "
                             f"{' '.join(str(exc).split())}") from None
        ran = self._compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        if ran != self.requested["inference_precision"]:
            self._compiled = None
            raise RuntimeUnavailable(self.name, f"requested inference precision {self.requested['inference_precision']}"
                                                f" but OpenVINO compiled {ran}; refusing the substitute")
        self._request = self._compiled.create_infer_request()
        self._device_name = core.get_property("CPU", "FULL_DEVICE_NAME")
        self._capabilities = list(core.get_property("CPU", "OPTIMIZATION_CAPABILITIES"))

    # -- running ------------------------------------------------------------------------------
    def _infer(self, obs: np.ndarray) -> np.ndarray:
        """Q-values of `obs`, in calls of the file's fixed batch where it has one."""
        return in_calls(self._call, obs, self._static_batch)

    def _call(self, obs: np.ndarray) -> np.ndarray:
        self._request.infer({0: obs})
        q = self._request.get_output_tensor(0).data
        if q.ndim != 2 or q.shape[0] != len(obs):
            raise ValueError(f"model output has shape {q.shape}, expected ({len(obs)}, actions)")
        return np.array(q, dtype=np.float32, copy=True)  # the request's buffer is reused by the next call

    def _actual(self) -> ActualRun:
        from breakout_core.conversion.quantize import cpu_isa

        compiled = self._compiled
        layers = compute_layers(compiled.get_runtime_model())
        integer = tuple(layer["layer"] for layer in layers if layer["precision"] in INTEGER_PRECISIONS)
        inference = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()
        by_precision: dict[str, int] = {}
        for layer in layers:
            by_precision[layer["precision"]] = by_precision.get(layer["precision"], 0) + 1
        return ActualRun(
            device="cpu",
            precision="int8" if integer else INFERENCE_PRECISIONS.get(inference, inference),
            provider="CPU",
            cpu_isa=cpu_isa(),
            int8=Int8Run.from_metadata(self._model_meta, integer) if self._file_precision == "int8" else None,
            details={
                "device_name": self._device_name,
                "optimization_capabilities": self._capabilities,
                "weights_precision": self._file_precision,
                "static_batch": self._static_batch,  # a batch fixed in the file: others run in calls of it
                "inference_precision": inference,
                "performance_hint": str(compiled.get_property("PERFORMANCE_HINT")),
                "threads": int(compiled.get_property("INFERENCE_NUM_THREADS")),
                "streams": int(compiled.get_property("NUM_STREAMS")),
                "cpu_pinning": bool(compiled.get_property("ENABLE_CPU_PINNING")),
                "compute_layers_by_precision": by_precision,
                "compute_layers": layers,
                "model_metadata": self._model_meta,
            },
        )

    def _versions(self) -> dict[str, str]:
        versions = {"numpy": np.__version__}
        version = installed_version("openvino")
        if version is not None:
            versions["openvino"] = version
        return versions

    def _close(self) -> None:
        self._request = self._compiled = None


@functools.lru_cache(maxsize=1)
def cpu_capabilities() -> tuple[str, ...] | None:
    """The CPU plugin's OPTIMIZATION_CAPABILITIES (FP32, BF16, FP16, INT8, ...); None without OpenVINO."""
    try:
        import openvino

        return tuple(openvino.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"))
    except Exception:
        return None


def compute_layers(runtime_model) -> list[dict[str, str]]:
    """Each convolution and matrix product of a compiled model: its name, type, the precision it
    ran in and the kernel chosen (rt_info of the runtime model)."""
    layers = []
    for op in runtime_model.get_ordered_ops():
        info = op.get_rt_info()
        kind = info["layerType"].astype(str) if "layerType" in info else None
        if kind in COMPUTE_LAYERS:
            layers.append({"layer": op.get_friendly_name(), "type": kind,
                           "precision": info["runtimePrecision"].astype(str),
                           "kernel": info["primitiveType"].astype(str) if "primitiveType" in info else None})
    return layers
