"""TensorRT: an engine built from the exported ONNX file for this GPU, I/O through pycuda.

Written against the TensorRT 10 Python API (named I/O tensors, `execute_async_v3`,
`build_serialized_network`), and ready for TensorRT 11, where every network is strongly
typed and `BuilderFlag.FP16` is gone:

- precision "fp32": an FP32 ONNX file, FP32 engine; TF32 is cleared unless allow_tf32=True
  (TensorRT enables it by default, which would make "fp32" really TF32);
- precision "fp16" from the FP16 ONNX file (export.convert_to_fp16): a STRONGLY_TYPED
  network that follows the file's own types (works on TensorRT 10 and 11);
- precision "fp16" from an FP32 ONNX file: `BuilderFlag.FP16`, TensorRT's weakly typed
  mode, where it may still choose FP32 kernels per layer; only where the flag exists.

The serialized engine is written next to the ONNX file (or to `engine_path`) and its size
recorded; an `.engine`/`.plan` artifact is deserialized as is. The uint8 input is legal
because the graph casts it to float first (TensorRT accepts UINT8 network inputs only
into a cast). Buffers are allocated once for `max_batch`; infer() copies the output out of
the page-locked buffer, so a caller never holds a buffer the next call overwrites.

load() retains the device's primary CUDA context (the one torch also uses) and keeps it
current on the loading thread until close(): use a loaded runtime from that thread.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from breakout_core.common.files import write_whole
from breakout_core.runtimes.actual import ActualRun
from breakout_core.runtimes.base import (
    OBS_SHAPE,
    Option,
    Runtime,
    RuntimeUnavailable,
    import_error_reason,
    installed_version,
)

ENGINE_SUFFIXES = (".engine", ".plan")


class TensorRTRuntime(Runtime):
    name = "tensorrt"
    artifact_types = ("onnx", "engine")
    EXTRA = "gpu"
    OPTIONS = {
        "precision": Option("fp32", ("fp32", "fp16")),
        "device_index": Option(0, value_type=int, minimum=0),
        "max_batch": Option(64, value_type=int, minimum=1, description="optimisation profile: batch 1 .. max_batch"),
        "opt_batch": Option(1, value_type=int, minimum=1,
                            description="the batch TensorRT tunes kernels for (1: one decision at a time)"),
        "workspace_bytes": Option(1 << 30, value_type=int, minimum=1 << 20),
        "allow_tf32": Option(False, (False, True)),
        "engine_path": Option(None, value_type=str, spec_path=True,
                              description="default: <onnx stem>.<precision>.engine beside the ONNX file"),
    }

    @classmethod
    def needs(cls, options: dict[str, Any]) -> frozenset[str]:
        return frozenset({"gpu"})

    @classmethod
    def artifact_problem(cls, options: dict[str, Any], artifact_type: str, artifact_precision: str) -> str | None:
        problem = super().artifact_problem(options, artifact_type, artifact_precision)
        if (problem is None and artifact_type == "onnx" and options["precision"] == "fp32"
                and artifact_precision != "fp32"):
            return "an fp32 TensorRT engine needs an fp32 ONNX file"
        return problem

    @classmethod
    def _available(cls, options: dict[str, Any]) -> tuple[bool, str]:
        max_batch, opt_batch = options["max_batch"], options["opt_batch"]
        if opt_batch > max_batch:
            return False, (f"need integers 1 <= opt_batch <= max_batch, "
                           f"got opt_batch={opt_batch!r}, max_batch={max_batch!r}")
        try:
            import tensorrt  # noqa: F401
        except Exception as exc:
            return False, import_error_reason("tensorrt", exc)
        try:
            import pycuda.driver as cuda
        except Exception as exc:
            return False, import_error_reason("pycuda", exc)
        try:
            cuda.init()
            count = cuda.Device.count()
        except Exception as exc:
            return False, f"no usable CUDA driver ({type(exc).__name__}: {exc})"
        if count == 0:
            return False, "no CUDA device (pycuda.driver.Device.count() == 0)"
        if not 0 <= int(options["device_index"]) < count:
            return False, f"CUDA device index {options['device_index']} does not exist ({count} device(s))"
        return True, ""

    # -- loading ----------------------------------------------------------------------------
    def _load(self, path: Path) -> None:
        import pycuda.driver as cuda
        import tensorrt as trt

        self._trt, self._cuda = trt, cuda
        cuda.init()
        self._device = cuda.Device(int(self.requested["device_index"]))
        self._cuda_context = self._device.retain_primary_context()
        self._cuda_context.push()
        self._allocations: list = []
        try:
            self._logger = _make_logger(trt)
            self._build_info: dict[str, Any] = {}
            if path.suffix in ENGINE_SUFFIXES:
                serialized = path.read_bytes()
                self.engine_path = path
                self._build_info = {"built": False, "mode": "deserialized engine file"}
            else:
                serialized = self._build(path)
                self.engine_path = Path(self.requested["engine_path"] or path.with_name(
                    f"{path.stem}.{self.requested['precision']}.engine"))
                write_whole(self.engine_path, serialized)
            self.engine_bytes = len(serialized)
            runtime = trt.Runtime(self._logger)
            engine = runtime.deserialize_cuda_engine(serialized)
            if engine is None:
                raise RuntimeError(f"TensorRT could not deserialize the engine: {self._logger.text()}")
            self._runtime, self._engine = runtime, engine
            self._setup_io()
        except BaseException:
            self._release()
            raise

    def _build(self, path: Path) -> bytes:
        trt = self._trt
        from breakout_core.conversion.export import onnx_precision

        file_precision = onnx_precision(path)
        precision = self.requested["precision"]
        creation = trt.NetworkDefinitionCreationFlag
        flags = 0
        if precision == "fp32":
            if file_precision != "fp32":
                raise ValueError(f"{path} holds {file_precision} weights; an fp32 engine needs the FP32 ONNX file")
            mode = "fp32"
        elif file_precision == "fp16":
            if not hasattr(creation, "STRONGLY_TYPED"):
                raise RuntimeUnavailable(self.name, f"TensorRT {trt.__version__} has no STRONGLY_TYPED networks "
                                                    "for an FP16 ONNX file; give the FP32 file for BuilderFlag.FP16")
            flags |= 1 << int(creation.STRONGLY_TYPED)
            mode = "fp16: strongly typed network from the FP16 ONNX file"
        else:
            if not hasattr(trt.BuilderFlag, "FP16"):
                raise RuntimeUnavailable(self.name, f"TensorRT {trt.__version__} has no BuilderFlag.FP16; give "
                                                    "the FP16 ONNX file (export.convert_to_fp16) for a strongly "
                                                    "typed build")
            mode = "fp16: BuilderFlag.FP16 on the FP32 ONNX file (weakly typed)"

        builder = trt.Builder(self._logger)
        network = builder.create_network(flags)
        parser = trt.OnnxParser(network, self._logger)
        if not parser.parse_from_file(str(path)):
            errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            raise ValueError(f"{path}: TensorRT's ONNX parser failed: {errors}")
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, int(self.requested["workspace_bytes"]))
        config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # per-layer info for describe()
        tf32 = getattr(trt.BuilderFlag, "TF32", None)
        if tf32 is not None and not self.requested["allow_tf32"]:
            config.clear_flag(tf32)
        if mode.startswith("fp16: BuilderFlag"):
            config.set_flag(trt.BuilderFlag.FP16)
        input_name = network.get_input(0).name
        profile = builder.create_optimization_profile()
        max_batch, opt_batch = int(self.requested["max_batch"]), int(self.requested["opt_batch"])
        profile.set_shape(input_name, (1, *OBS_SHAPE), (opt_batch, *OBS_SHAPE), (max_batch, *OBS_SHAPE))
        config.add_optimization_profile(profile)
        started = time.perf_counter()
        serialized = builder.build_serialized_network(network, config)
        build_s = time.perf_counter() - started
        if serialized is None:
            raise RuntimeError(f"TensorRT failed to build the {precision} engine: {self._logger.text()}")
        self._build_info = {
            "built": True,
            "mode": mode,
            "onnx_precision": file_precision,
            "build_s": build_s,
            "tf32_allowed": bool(tf32 is None or self.requested["allow_tf32"]),
            "workspace_bytes": int(self.requested["workspace_bytes"]),
            "warnings": list(self._logger.messages),
        }
        return bytes(serialized)

    def _setup_io(self) -> None:
        trt, cuda, engine = self._trt, self._cuda, self._engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        if len(inputs) != 1 or len(outputs) != 1:
            raise ValueError(f"engine must have one input and one output, got {inputs} -> {outputs}")
        self._input_name, self._output_name = inputs[0], outputs[0]
        in_dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(self._input_name)))
        out_dtype = np.dtype(trt.nptype(engine.get_tensor_dtype(self._output_name)))
        if in_dtype != np.uint8 or out_dtype != np.float32:
            raise ValueError(f"engine I/O must be uint8 -> float32, got {in_dtype} -> {out_dtype}")
        _, _, max_shape = engine.get_tensor_profile_shape(self._input_name, 0)
        self._max_batch = int(max_shape[0])
        self._context = engine.create_execution_context()
        if self._context is None:
            raise RuntimeError(f"TensorRT could not create an execution context: {self._logger.text()}")
        self._host_in = cuda.pagelocked_empty((self._max_batch, *OBS_SHAPE), np.uint8)
        actions = int(engine.get_tensor_shape(self._output_name)[-1])  # the model's own; its batch may be -1
        self._host_out = cuda.pagelocked_empty((self._max_batch, actions), np.float32)
        self._device_in = cuda.mem_alloc(self._host_in.nbytes)
        self._device_out = cuda.mem_alloc(self._host_out.nbytes)
        self._allocations = [self._device_in, self._device_out]
        self._context.set_tensor_address(self._input_name, int(self._device_in))
        self._context.set_tensor_address(self._output_name, int(self._device_out))
        self._stream = cuda.Stream()

    # -- running ------------------------------------------------------------------------------
    def _infer(self, obs: np.ndarray) -> np.ndarray:
        cuda = self._cuda
        batch = obs.shape[0]
        if batch > self._max_batch:
            raise ValueError(f"batch {batch} is larger than the engine's max_batch {self._max_batch}")
        np.copyto(self._host_in[:batch], obs)
        if not self._context.set_input_shape(self._input_name, (batch, *OBS_SHAPE)):
            raise RuntimeError(f"TensorRT refused input shape {(batch, *OBS_SHAPE)}")
        cuda.memcpy_htod_async(self._device_in, self._host_in[:batch], self._stream)
        if not self._context.execute_async_v3(stream_handle=self._stream.handle):
            raise RuntimeError(f"TensorRT execution failed: {self._logger.text()}")
        cuda.memcpy_dtoh_async(self._host_out[:batch], self._device_out, self._stream)
        self._stream.synchronize()
        return self._host_out[:batch].copy()  # the page-locked buffer is reused by the next call

    def _actual(self) -> ActualRun:
        major, minor = self._device.compute_capability()
        return ActualRun(
            device=f"cuda:{self.requested['device_index']}",
            precision=self.requested["precision"],
            details={
                "device_name": self._device.name(),
                "compute_capability": f"{major}.{minor}",
                "engine_path": str(self.engine_path),
                "engine_bytes": self.engine_bytes,
                "max_batch": self._max_batch,
                "io": f"{self._input_name} uint8 -> {self._output_name} float32",
                **self._build_info,
                **self._layer_summary(),
            },
        )

    def _layer_summary(self) -> dict[str, Any]:
        """Layer count and the output data types TensorRT chose, from the engine inspector."""
        trt = self._trt
        try:
            inspector = self._engine.create_engine_inspector()
            info = json.loads(inspector.get_engine_information(trt.LayerInformationFormat.JSON))
        except Exception as exc:  # informative only; never fails a load
            return {"layers_error": f"{type(exc).__name__}: {exc}"}
        layers = info.get("Layers", [])
        dtypes: dict[str, int] = {}
        for layer in layers:
            if isinstance(layer, dict):
                for out in layer.get("Outputs", []):
                    fmt = str(out.get("Format/Datatype", "unknown")) if isinstance(out, dict) else "unknown"
                    dtypes[fmt] = dtypes.get(fmt, 0) + 1
        return {"layer_count": len(layers), "layer_output_formats": dtypes}

    def _versions(self) -> dict[str, str]:
        versions = {"numpy": np.__version__}
        for dist in ("tensorrt", "pycuda"):
            version = installed_version(dist)
            if version is not None:
                versions[dist] = version
        return versions

    def _close(self) -> None:
        self._release()

    def _release(self) -> None:
        for allocation in getattr(self, "_allocations", []):
            try:
                allocation.free()
            except Exception:
                pass
        self._allocations = []
        self._context = self._engine = self._runtime = self._stream = None
        context = getattr(self, "_cuda_context", None)
        if context is not None:
            self._cuda_context = None
            try:
                context.pop()
            finally:
                context.detach()


def _make_logger(trt):
    """A TensorRT logger that keeps warnings and errors, to put in error messages."""

    class _Logger(trt.ILogger):
        def __init__(self):
            trt.ILogger.__init__(self)
            self.messages: list[str] = []

        def log(self, severity, msg):
            if int(severity) <= int(trt.ILogger.Severity.WARNING):
                self.messages.append(f"{getattr(severity, 'name', severity)}: {msg}")

        def text(self) -> str:
            return " | ".join(self.messages[-5:]) or "(no message from TensorRT)"

    return _Logger()
