"""PyTorch: the reference runtime, on a checkpoint written by qnetwork.save_checkpoint.

FP16 runs on CUDA only. On a CPU, torch's half kernels are slow reference paths whose
accumulation differs from what an FP16 deployment computes, so their Q-values would not
stand for "FP16"; the CPU + fp16 combination is reported unavailable with that reason
(the ONNX FP16 model on ONNX Runtime is the CPU way to look at FP16 weights).

FP16 here is the whole network in half precision: the graph's own uint8 -> float32 / 255
stays as written in QNetwork.forward and its result is cast to half at the torso's input
(a forward pre-hook), so weights and every activation after it are float16; the output is
cast back to float32.

On CUDA, TF32 is off unless allow_tf32=True (torch enables it for cuDNN convolutions by
default, which would make "fp32" really TF32). These are process-wide torch flags: load()
sets them and describe() reports the values actually in force.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from breakout_core.runtimes.actual import ActualRun
from breakout_core.runtimes.base import Option, Runtime

CPU_FP16_REASON = (
    "torch fp16 on CPU is not offered: CPU half kernels are slow reference paths whose accumulation "
    "differs from an FP16 deployment's, so their Q-values would not stand for FP16; "
    "use device='cuda', or the ONNX FP16 model on onnxruntime"
)


class TorchRuntime(Runtime):
    name = "torch"
    artifact_types = ("checkpoint",)
    OPTIONS = {
        "device": Option("cpu", ("cpu", "cuda")),
        "precision": Option("fp32", ("fp32", "fp16")),
        "device_index": Option(0, value_type=int, minimum=0),
        "allow_tf32": Option(False, (False, True)),
        "threads": Option(None, value_type=int, minimum=1, description="torch.set_num_threads while this runtime "
                          "is loaded (process-wide, restored by close(); describe() records it); "
                          "None: torch's default"),
    }

    @classmethod
    def needs(cls, options: dict[str, Any]) -> frozenset[str]:
        return frozenset({"gpu"} if options.get("device") == "cuda" else ())

    @classmethod
    def _available(cls, options: dict[str, Any]) -> tuple[bool, str]:
        if options["device"] == "cpu":
            if options["precision"] == "fp16":
                return False, CPU_FP16_REASON
            return True, ""
        try:
            import torch
        except Exception as exc:  # pragma: no cover - torch is a dependency of the package
            return False, f"torch cannot be imported ({type(exc).__name__}: {exc})"
        if torch.version.cuda is None:
            return False, (f"torch {torch.__version__} is a CPU-only build (torch.version.cuda is None): "
                           "no CUDA device can be used")
        if not torch.cuda.is_available():
            return False, f"no CUDA device visible to torch {torch.__version__} (torch.cuda.is_available() is False)"
        count = torch.cuda.device_count()
        if not 0 <= int(options["device_index"]) < count:
            return False, f"CUDA device index {options['device_index']} does not exist ({count} device(s))"
        return True, ""

    def _load(self, path: Path) -> None:
        import torch

        from breakout_core.learning.qnetwork import load_checkpoint

        network, meta = load_checkpoint(path)
        self._torch = torch
        self.checkpoint_meta = meta
        if self.requested["device"] == "cuda":
            self._device = torch.device("cuda", int(self.requested["device_index"]))
            torch.backends.cudnn.allow_tf32 = bool(self.requested["allow_tf32"])
            torch.backends.cuda.matmul.allow_tf32 = bool(self.requested["allow_tf32"])
        else:
            self._device = torch.device("cpu")
        if self.requested["precision"] == "fp16":
            network = network.half()
            network.torso.register_forward_pre_hook(lambda _module, args: (args[0].half(),))
        self._network = network.to(self._device).eval()
        self._previous_threads = None
        if self.requested["threads"] is not None:
            self._previous_threads = torch.get_num_threads()
            torch.set_num_threads(self.requested["threads"])

    def _infer(self, obs: np.ndarray) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            x = torch.from_numpy(obs)
            if self._device.type != "cpu":
                x = x.to(self._device)
            q = self._network(x).float().cpu()  # .cpu() waits for the device
        return q.numpy().copy()

    def _actual(self) -> ActualRun:
        torch = self._torch
        param = next(self._network.parameters())
        details: dict[str, Any] = {
            "weights_dtype": str(param.dtype).replace("torch.", ""),
            "architecture": self.checkpoint_meta.get("architecture"),
            "contract_hash": self.checkpoint_meta.get("contract_hash"),
            "cpu_threads": torch.get_num_threads(),
        }
        if param.device.type == "cuda":
            details["device_name"] = torch.cuda.get_device_name(param.device)
            details["cudnn_allow_tf32"] = bool(torch.backends.cudnn.allow_tf32)
            details["matmul_allow_tf32"] = bool(torch.backends.cuda.matmul.allow_tf32)
        return ActualRun(
            device=str(param.device),
            precision={torch.float32: "fp32", torch.float16: "fp16"}.get(param.dtype, str(param.dtype)),
            details=details,
        )

    def _versions(self) -> dict[str, str]:
        import torch

        versions = {"numpy": np.__version__, "torch": torch.__version__}
        if torch.version.cuda is not None:
            versions["cuda"] = torch.version.cuda
            if torch.backends.cudnn.is_available():
                versions["cudnn"] = str(torch.backends.cudnn.version())
        return versions

    def _close(self) -> None:
        self._network = None
        if self._previous_threads is not None:
            self._torch.set_num_threads(self._previous_threads)
        if self._device.type == "cuda":
            self._torch.cuda.empty_cache()
