"""A backend defined outside the engine, to show that a new one is one class plus one
registry line: the ONNX file run by onnx's own reference evaluator (pure numpy, no ONNX
Runtime). tests/test_backend_registry.py registers it and runs a spec on it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from breakout_core.runtimes.actual import ActualRun
from breakout_core.runtimes.base import Option, Runtime, import_error_reason


class ReferenceRuntime(Runtime):
    name = "onnx_reference"
    artifact_types = ("onnx",)
    OPTIONS = {
        "check_shapes": Option(False, (False, True), description="check every result against the graph's shape "
                               "annotations (ReferenceEvaluator's check_shape_annotations)"),
        "max_batch": Option(64, value_type=int, minimum=1, description="the largest batch infer() accepts"),
    }

    @classmethod
    def _available(cls, options: dict[str, Any]) -> tuple[bool, str]:
        try:
            import onnx.reference  # noqa: F401
        except Exception as exc:
            return False, import_error_reason("onnx.reference", exc)
        return True, ""

    def _load(self, path: Path) -> None:
        import onnx
        from onnx.reference import ReferenceEvaluator

        model = onnx.load(str(path))
        self._input = model.graph.input[0].name
        self._evaluator = ReferenceEvaluator(model, check_shape_annotations=self.requested["check_shapes"])

    def _infer(self, obs: np.ndarray) -> np.ndarray:
        if len(obs) > self.requested["max_batch"]:
            raise ValueError(f"batch {len(obs)} is larger than max_batch {self.requested['max_batch']}")
        return np.array(self._evaluator.run(None, {self._input: obs})[0], dtype=np.float32)

    def _actual(self) -> ActualRun:
        return ActualRun(device="cpu", precision="fp32", details={"evaluator": "onnx.reference.ReferenceEvaluator"})

    def _close(self) -> None:
        self._evaluator = None
