"""ONNX Runtime on an exported model (FP32 or FP16 file), on the CPU or the CUDA provider.

What actually ran is read back from ONNX Runtime itself, not assumed:
- the providers the session uses (`session.get_providers()`); if the requested provider is
  not the session's first, load() refuses with RuntimeUnavailable instead of running on
  whatever ONNX Runtime fell back to;
- node placement: load() runs one profiled inference (batch 1) in a throw-away session and
  reads each node's provider, op and output type from the profile JSON, then opens the
  session used for inference without profiling. With `disable_cpu_ep_fallback=True`
  (session option `session.disable_cpu_ep_fallback`, only for a non-CPU provider, and then
  without the CPU provider in the list, as ONNX Runtime requires) a node that would land on
  the CPU makes session creation fail, reported as unavailable with ONNX Runtime's text.

An FP16 model on the CPU provider runs partly emulated: ops without an FP16 CPU kernel run
in FP32 between casts that ONNX Runtime inserts (`InsertedPrecisionFreeCast*` nodes);
describe() counts them.

A file whose batch dimension is fixed (torch.onnx.export's default without dynamic_axes is
1) is fed any batch in calls of that batch; describe() records it as `static_batch`.

An INT8 file (breakout_core.conversion.quantize) is described by what its quantizer recorded (method,
the source graph's nodes it quantized) and by what ran: the nodes whose kernel computes on
integers (QLinearConv, QGemm, ConvInteger, ... in the placement profile). On the CPU provider
describe() also records the CPU's INT8 instruction sets (quantize.cpu_isa: AVX2, AVX-512,
VNNI, AMX), since INT8 speed, and on AVX2 alone even INT8 results, depend on them.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from breakout_core.common.batch_calls import in_calls
from breakout_core.conversion.export import onnx_precision
from breakout_core.conversion.model_prechecks import file_fixed_batch
from breakout_core.runtimes.actual import ActualRun, Int8Run
from breakout_core.runtimes.base import OBS_SHAPE, Option, Runtime, RuntimeUnavailable, import_error_reason

PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}
OPTIMIZATION_LEVELS = {
    "disable": "ORT_DISABLE_ALL",
    "basic": "ORT_ENABLE_BASIC",
    "extended": "ORT_ENABLE_EXTENDED",
    "all": "ORT_ENABLE_ALL",
}
INSERTED_CAST_PREFIX = "InsertedPrecisionFreeCast"


class OnnxRuntimeRuntime(Runtime):
    name = "onnxruntime"
    artifact_types = ("onnx",)
    OPTIONS = {
        "provider": Option("cpu", tuple(PROVIDERS)),
        "device_index": Option(0, value_type=int, minimum=0),
        "graph_optimization_level": Option("all", tuple(OPTIMIZATION_LEVELS)),
        "intra_op_threads": Option(None, value_type=int, minimum=1,
                                   description="None: ONNX Runtime's default (one per physical core)"),
        "disable_cpu_ep_fallback": Option(False, (False, True)),
        "node_placement": Option(True, (False, True),
                                 description="profile one run at load to read each node's provider"),
    }

    @classmethod
    def needs(cls, options: dict[str, Any]) -> frozenset[str]:
        return frozenset({"gpu"} if options.get("provider", "cpu") != "cpu" else ())

    @classmethod
    def resolve_options(cls, **options: Any) -> dict[str, Any]:
        resolved = super().resolve_options(**options)
        if resolved["disable_cpu_ep_fallback"] and resolved["provider"] == "cpu":
            raise ValueError("runtime 'onnxruntime': disable_cpu_ep_fallback applies to a non-CPU provider "
                             "(onnxruntime rejects it together with the CPU provider)")
        return resolved

    @classmethod
    def _available(cls, options: dict[str, Any]) -> tuple[bool, str]:
        try:
            import onnxruntime as ort
        except Exception as exc:
            return False, import_error_reason("onnxruntime", exc)
        wanted = PROVIDERS[options["provider"]]
        have = ort.get_available_providers()
        if wanted not in have:
            cuda = options["provider"] == "cuda"
            hint = " (the CUDA provider comes with the onnxruntime-gpu package)" if cuda else ""
            return False, f"{wanted} is not in onnxruntime {ort.__version__}'s available providers {have}{hint}"
        return True, ""

    # -- loading ----------------------------------------------------------------------------
    def _session_options(self, profile_prefix: str | None = None):
        ort = self._ort
        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(
            ort.GraphOptimizationLevel, OPTIMIZATION_LEVELS[self.requested["graph_optimization_level"]]
        )
        if self.requested["intra_op_threads"] is not None:
            options.intra_op_num_threads = int(self.requested["intra_op_threads"])
        if self.requested["disable_cpu_ep_fallback"]:
            options.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        if profile_prefix is not None:
            options.enable_profiling = True
            options.profile_file_prefix = profile_prefix
        return options

    def _providers(self) -> list:
        if self.requested["provider"] == "cpu":
            return ["CPUExecutionProvider"]
        accelerator = (PROVIDERS[self.requested["provider"]], {"device_id": int(self.requested["device_index"])})
        if self.requested["disable_cpu_ep_fallback"]:
            return [accelerator]  # onnxruntime refuses an explicit CPU provider with fallback disabled
        return [accelerator, "CPUExecutionProvider"]

    def _session(self, path: Path, profile_prefix: str | None = None):
        wanted = PROVIDERS[self.requested["provider"]]
        try:
            session = self._ort.InferenceSession(str(path), self._session_options(profile_prefix),
                                                 providers=self._providers())
        except Exception as exc:
            text = " ".join(str(exc).split())
            if self.requested["provider"] != "cpu":
                raise RuntimeUnavailable(self.name,
                                         f"onnxruntime could not create a {wanted} session: {text}") from None
            raise ValueError(f"{path}: onnxruntime cannot load this model: {text}") from None
        used = session.get_providers()
        if not used or used[0] != wanted:
            raise RuntimeUnavailable(
                self.name, f"requested {wanted} but the session runs on {used}; refusing the fallback"
            )
        return session

    def _load(self, path: Path) -> None:
        import onnxruntime as ort

        self._ort = ort
        self._nodes: list[dict[str, Any]] | None = None
        self._static_batch = file_fixed_batch(path)
        if self.requested["node_placement"]:
            self._nodes = self._profile_placement(path)
        self._session_obj = self._session(path)
        inputs, outputs = self._session_obj.get_inputs(), self._session_obj.get_outputs()
        if len(inputs) != 1 or len(outputs) != 1 or inputs[0].type != "tensor(uint8)":
            raise ValueError(
                f"{path}: expected one uint8 input and one output, got "
                f"{[(i.name, i.type) for i in inputs]} -> {[(o.name, o.type) for o in outputs]}"
            )
        self._input_name, self._output_name = inputs[0].name, outputs[0].name
        self._output_type = outputs[0].type
        meta = self._session_obj.get_modelmeta().custom_metadata_map
        self._model_meta = dict(meta)
        self._precision = onnx_precision(path)

    def _profile_placement(self, path: Path) -> list[dict[str, Any]]:
        """Each node's provider, op and output type, from the profile of one batch-1 run."""
        folder = tempfile.mkdtemp(prefix="ort-profile-")
        try:
            session = self._session(path, profile_prefix=str(Path(folder) / "placement"))
            name = session.get_inputs()[0].name
            session.run(None, {name: np.zeros((self._static_batch or 1, *OBS_SHAPE), dtype=np.uint8)})
            profile_file = session.end_profiling()
            events = json.loads(Path(profile_file).read_text())
            del session
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        nodes = []
        for event in events:
            if event.get("cat") != "Node" or not event.get("name", "").endswith("_kernel_time"):
                continue
            args = event.get("args", {})
            outputs = args.get("output_type_shape") or []
            nodes.append({
                "node": event["name"][: -len("_kernel_time")],
                "op": args.get("op_name"),
                "provider": args.get("provider"),
                "output_dtypes": [next(iter(o)) for o in outputs if isinstance(o, dict) and o],
            })
        return nodes

    # -- running ------------------------------------------------------------------------------
    def _infer(self, obs: np.ndarray) -> np.ndarray:
        """Q-values of `obs`, in calls of the file's fixed batch where it has one."""
        return in_calls(self._call, obs, self._static_batch)

    def _call(self, obs: np.ndarray) -> np.ndarray:
        q = self._session_obj.run([self._output_name], {self._input_name: obs})[0]
        if q.ndim != 2 or q.shape[0] != len(obs):
            raise ValueError(f"model output has shape {q.shape}, expected ({len(obs)}, actions)")
        return np.array(q, dtype=np.float32, copy=True)

    def _actual(self) -> ActualRun:
        session = self._session_obj
        providers = session.get_providers()
        on_cpu = providers[0] == "CPUExecutionProvider"
        details: dict[str, Any] = {
            "providers": providers,
            "provider_options": session.get_provider_options(),
            "graph_optimization_level": OPTIMIZATION_LEVELS[self.requested["graph_optimization_level"]],
            "intra_op_threads": self.requested["intra_op_threads"] or "onnxruntime default",
            "cpu_ep_fallback_disabled": bool(self.requested["disable_cpu_ep_fallback"]),
            "output_type": self._output_type,
            "static_batch": self._static_batch,  # a batch fixed in the file: larger ones run in calls of it
            "model_metadata": self._model_meta,
        }
        by_provider = off_provider = None
        if self._nodes is not None:
            by_provider = {}
            for node in self._nodes:
                by_provider[node["provider"]] = by_provider.get(node["provider"], 0) + 1
            off_provider = tuple(n["node"] for n in self._nodes if n["provider"] != providers[0])
            inserted = sum(n["op"] == "Cast" and n["node"].startswith(INSERTED_CAST_PREFIX) for n in self._nodes)
            details.update(nodes=self._nodes, node_count=len(self._nodes), inserted_precision_casts=inserted)
            if inserted and self._precision == "fp16":
                details["precision_note"] = (
                    f"{inserted} cast(s) inserted by onnxruntime: ops without an FP16 kernel on "
                    f"{providers[0]} ran in FP32 on the FP16 weights (see nodes[].output_dtypes)"
                )
        from breakout_core.conversion.quantize import cpu_isa

        return ActualRun(
            device="cpu" if on_cpu else f"cuda:{self.requested['device_index']}",
            precision=self._precision,
            provider=providers[0],
            cpu_isa=cpu_isa() if on_cpu else None,
            int8=self._int8() if self._precision == "int8" else None,
            nodes_by_provider=by_provider,
            nodes_not_on_requested_provider=off_provider,
            details=details,
        )

    def _int8(self) -> Int8Run:
        """How the INT8 file was quantized (its metadata) and which nodes ran integer kernels."""
        from breakout_core.conversion.quantize import INTEGER_OPS

        kernels = None if self._nodes is None else tuple(n["node"] for n in self._nodes if n["op"] in INTEGER_OPS)
        return Int8Run.from_metadata(self._model_meta, kernels)

    def _versions(self) -> dict[str, str]:
        versions = {"numpy": np.__version__}
        try:
            import onnxruntime as ort

            versions["onnxruntime"] = ort.__version__
        except Exception:
            pass
        return versions

    def _close(self) -> None:
        self._session_obj = None

