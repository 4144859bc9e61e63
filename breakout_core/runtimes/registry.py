"""The runtime registry: one line per backend, and runtimes made by name.

    from breakout_core.runtimes.registry import make_runtime
    with make_runtime("onnxruntime", provider="cpu") as rt:
        rt.load("model.onnx")
        q = rt.infer(states.obs)

Importing it imports no backend library: torch, onnxruntime, openvino, tensorrt, pycuda,
playwright and aiohttp are imported by available() and load(), so a machine without a GPU
stack can list every runtime and say why one cannot run.
"""

from __future__ import annotations

from typing import Any

from breakout_core.runtimes.base import Runtime
from breakout_core.runtimes.browser_runtime import BrowserRuntime
from breakout_core.runtimes.onnxruntime_runtime import OnnxRuntimeRuntime
from breakout_core.runtimes.openvino_runtime import OpenVINORuntime
from breakout_core.runtimes.tensorrt_runtime import TensorRTRuntime
from breakout_core.runtimes.torch_runtime import TorchRuntime

# The registry: one line per backend. The spec language (runner.runtime_specs) is derived from it.
RUNTIMES: dict[str, type[Runtime]] = {
    TorchRuntime.name: TorchRuntime,
    OnnxRuntimeRuntime.name: OnnxRuntimeRuntime,
    OpenVINORuntime.name: OpenVINORuntime,
    TensorRTRuntime.name: TensorRTRuntime,
    BrowserRuntime.name: BrowserRuntime,
}


def runtime_class(name: str) -> type[Runtime]:
    try:
        return RUNTIMES[name]
    except KeyError:
        raise ValueError(f"unknown runtime {name!r}; known: {', '.join(sorted(RUNTIMES))}") from None


def make_runtime(name: str, **options: Any) -> Runtime:
    """A runtime by registry name with its options (validated; nothing loaded yet)."""
    return runtime_class(name)(**options)


def runtime_available(name: str, **options: Any) -> tuple[bool, str]:
    """available() of a runtime by name, with its options."""
    return runtime_class(name).available(**options)
