"""INT8 ONNX files made with ONNX Runtime's quantizer (breakout_core.conversion.quantize) or with
NNCF's (breakout_core.conversion.nncf_quantize), as a spec declares them, and the `int8_files`
table that records how each was made.

    int8:
      - onnx: onnx_int8_minmax        # artifact written (precision: int8)
        source: onnx_fp32             # the FP32 file quantized; default: the measurement's own `onnx`
        quantizer: onnxruntime        # onnxruntime (default) or nncf: static only, its own ranges
                                      # (no calibrate_method), per-channel weights; the `openvino` extra
        method: static                # static (QDQ, calibrated) or dynamic (ranges at run time)
        calibrate_method: minmax      # static: minmax, entropy or percentile
        calibration_states: 64        # static: at least the engine's minimum for the method
        calibration: {episode_seeds: {start: 1000, count: 8}}  # the agent's own games, captured
                                      # as the fixed states are; disjoint from every seed the spec plays
        keep_float: [node_linear_1]   # nodes of the source graph kept in float

What can be checked before anything runs is checked when the spec loads (`problems`): the
method's fields, the engine's minimum number of states, the output's `precision: int8`, and,
on a source file that exists then, every keep_float name and that something is left to
quantize. The seeds are checked against the rest of the spec by runner.spec.deploy_checks
(each kind's `episode_seeds` and `held_out_seeds`).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from breakout_core.conversion.onnx_checks import not_a_node
from runner.kinds.shared.calibration import CalibrationCapture
from runner.spec.fields import Name, StrictModel, seed_list
from runner.spec.yaml_source import PlacedError, raise_placed
from runner.store import schema

if TYPE_CHECKING:
    from breakout_core.conversion.quantize import Int8Artifact

STATIC_ONLY = ("calibrate_method", "calibration_states", "calibration")


class Int8Export(StrictModel):
    onnx: Name = Field(description="artifact written: the INT8 ONNX file (precision: int8)")
    source: Name | None = Field(default=None, description="the FP32 ONNX artifact to quantize; default: the "
                                                          "FP32 file this measurement exports")
    method: Literal["static", "dynamic"] = Field(default="static", description="static: QDQ with calibrated "
                                                 "activation ranges; dynamic: activations quantized at run time")
    calibrate_method: Literal["minmax", "entropy", "percentile"] | None = Field(
        default=None, description="static only; default minmax")
    calibration_states: int | None = Field(default=None, ge=0, description="static only; default 64")
    calibration: CalibrationCapture | None = Field(default=None, description="static only (required there)")
    keep_float: list[str] = Field(default_factory=list, description="node names of the source graph kept in float")
    per_channel: bool = Field(default=True, description="one weight scale per output channel")
    quantizer: Literal["onnxruntime", "nncf"] = Field(
        default="onnxruntime", description="onnxruntime: onnxruntime.quantization; nncf: nncf.quantize on the "
        "ONNX graph (static, its own mean min/max ranges and fast bias correction, per-channel weights; the "
        "`openvino` extra), on the same calibration states")

    @model_validator(mode="after")
    def _method_fields(self) -> "Int8Export":
        from breakout_core.conversion.quantize import MIN_CALIBRATION_STATES

        if self.quantizer == "nncf":
            return self._nncf_fields()
        if self.method == "dynamic":
            raise_placed([PlacedError("dynamic quantization takes its activation ranges at run time: no "
                                      f"{key} here", (key,)) for key in STATIC_ONLY if getattr(self, key) is not None])
            return self
        if self.calibration is None:
            raise PlacedError("static quantization needs calibration states: give `calibration: {episode_seeds: "
                              "...}`, seeds no other part of the spec plays", ("calibration",))
        wanted = MIN_CALIBRATION_STATES[self.states_method]
        if self.states == 0:
            raise PlacedError(f"an empty calibration set: {self.states_method} calibration needs at least "
                              f"{wanted} states", ("calibration_states",))
        if self.states < wanted:
            raise PlacedError(f"{self.states_method} calibration needs at least {wanted} states, "
                              f"{self.states} asked", ("calibration_states",))
        per_game = math.ceil(self.states / len(seed_list(self.calibration.episode_seeds)))
        if self.calibration.candidates_per_episode < 2 * per_game:
            raise PlacedError(f"{self.states} states from {len(seed_list(self.calibration.episode_seeds))} games "
                              f"are {per_game} a game, which needs candidates_per_episode >= {2 * per_game}",
                              ("calibration", "candidates_per_episode"))
        return self

    def _nncf_fields(self) -> "Int8Export":
        from breakout_core.conversion.nncf_quantize import NNCF_MIN_CALIBRATION_STATES, PER_CHANNEL_ONLY

        if self.method != "static":
            raise PlacedError("nncf quantizes statically, from calibration states: method: static", ("method",))
        if self.calibrate_method is not None:
            raise PlacedError("nncf chooses its own ranges (the mean of each calibration state's min and max): "
                              "no calibrate_method with quantizer: nncf", ("calibrate_method",))
        if not self.per_channel:
            raise PlacedError(f"{PER_CHANNEL_ONLY}: no per_channel: false with quantizer: nncf", ("per_channel",))
        if self.calibration is None:
            raise PlacedError("nncf needs calibration states: give `calibration: {episode_seeds: ...}`, seeds no "
                              "other part of the spec plays", ("calibration",))
        if self.states < NNCF_MIN_CALIBRATION_STATES:
            raise PlacedError(f"nncf calibration needs at least {NNCF_MIN_CALIBRATION_STATES} states, "
                              f"{self.states} asked", ("calibration_states",))
        return self

    @property
    def states_method(self) -> str:
        return self.calibrate_method or "minmax"

    @property
    def states(self) -> int:
        return 64 if self.calibration_states is None else self.calibration_states


def problems(variants: list[Int8Export], own_fp32: str | None, spec, check_files: bool) -> list[tuple[tuple, str]]:
    """What is wrong with a measurement's INT8 variants given the spec's artifacts and files:
    (location under the measurement, message) each."""
    found: list[tuple[tuple, str]] = []
    for j, variant in enumerate(variants):
        where = ("int8", j)
        out = spec.artifacts.get(variant.onnx)
        if out is not None and out.precision != "int8":
            found.append(((*where, "onnx"), f"{variant.onnx!r} is an INT8 file: artifacts.{variant.onnx} needs "
                                            "precision: int8"))
        source_name = variant.source or own_fp32
        if source_name is None:
            found.append(((*where,), "no FP32 file to quantize: give `source:` an FP32 ONNX artifact, or the "
                                     "measurement an `onnx:` to export"))
            continue
        source = spec.artifacts.get(source_name)
        if source is None or source.type != "onnx":
            continue  # deploy_checks names the unknown or mistyped artifact
        if source.precision != "fp32":
            found.append(((*where, "source"), f"{source_name!r} holds {source.precision} weights; INT8 is made "
                                              "from an FP32 file"))
            continue
        if source.made_by == spec.name:
            if variant.keep_float:
                found.append(((*where, "keep_float"), f"keep_float names nodes of {source_name!r}, which this spec "
                                                      "writes, so they cannot be checked before it runs: give "
                                                      "`source:` an FP32 file on disk"))
            continue
        if check_files and Path(source.path).is_file():
            found += [((*where, *at), message) for at, message in _graph_problems(variant, Path(source.path))]
    return found


def _graph_problems(variant: Int8Export, path: Path) -> list[tuple[tuple, str]]:
    """keep_float names that are not nodes of the source graph, and a variant that leaves no
    node onnxruntime's quantizer handles for its method."""
    import onnx
    from onnxruntime.quantization.registry import IntegerOpsRegistry, QDQRegistry

    try:
        graph = onnx.load_model(str(path), load_external_data=False).graph
    except Exception:  # noqa: BLE001 -- file_checks reports an unreadable model
        return []
    names = [n.name for n in graph.node]
    found = []
    for k, name in enumerate(variant.keep_float):
        if name not in names:
            found.append((("keep_float", k), not_a_node(name, names, path.name)))
    handled = QDQRegistry if variant.method == "static" else IntegerOpsRegistry
    left = [n.name for n in graph.node if n.op_type in handled and n.name not in variant.keep_float]
    if not left:
        ops = sorted({n.op_type for n in graph.node})
        why = "every node onnxruntime would quantize is in keep_float" if variant.keep_float else \
            f"no op onnxruntime's {variant.method} quantizer handles (ops: {', '.join(ops)})"
        found.append((("keep_float",) if variant.keep_float else ("method",), f"nothing to quantize in {path.name}: "
                                                                               f"{why}"))
    return found


def capture_key(variant: Int8Export) -> str:
    """Variants with the same capture settings and number of states share their calibration states
    (whichever quantizer they go to)."""
    return json.dumps([variant.states, variant.calibration.model_dump(mode="json")], sort_keys=True)


def quantize(where: str, variant: Int8Export, source_path: str, out_path: str, states) -> tuple[Int8Artifact, dict]:
    """Quantize one variant; returns the engine's Int8Artifact and its `int8_files` columns.

    The engine's one-line QuantizeError (QuantizerUnavailable where NNCF is missing) is raised as
    a ValueError naming the variant (`where`)."""
    from breakout_core.conversion.nncf_quantize import quantize_nncf
    from breakout_core.conversion.quantize import QuantizeError, quantize_int8

    try:
        if variant.quantizer == "nncf":
            made = quantize_nncf(source_path, out_path, calibration=states.obs, nodes_to_exclude=variant.keep_float)
        else:
            made = quantize_int8(source_path, out_path, method=variant.method,
                                 calibration=None if states is None else states.obs,
                                 calibrate_method=variant.states_method, per_channel=variant.per_channel,
                                 nodes_to_exclude=variant.keep_float)
    except QuantizeError as exc:
        raise ValueError(f"{where}: {exc}") from None
    row = {
        "method": made.method, "calibrate_method": made.calibrate_method,
        "calibration_states": made.calibration_states,
        "calibration_seeds": None if states is None else json.dumps(seed_list(variant.calibration.episode_seeds)),
        "calibration_capture": None if states is None else json.dumps(variant.calibration.model_dump(mode="json")),
        "calibration_sha256": None if states is None else hashlib.sha256(states.obs.tobytes()).hexdigest(),
        "calibration_options": json.dumps(made.calibration_options), "per_channel": made.per_channel,
        "nodes_excluded": json.dumps(list(made.nodes_excluded)),
        "nodes_quantized": json.dumps(list(made.nodes_quantized)),
        "excluded_quantized_at_load": json.dumps(list(made.excluded_quantized_at_load)),
        "input_scale": made.input_scale, "source_sha256": made.source_sha256,
        "source_bytes": Path(source_path).stat().st_size, "onnxruntime_version": made.onnxruntime_version,
        "quantizer": made.quantizer,
    }
    return made, row


MIGRATIONS = [
    (
        "0412_int8_files",
        """
        CREATE TABLE int8_files (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, artifact VARCHAR NOT NULL,
            source_artifact VARCHAR NOT NULL, source_sha256 VARCHAR NOT NULL, source_bytes BIGINT NOT NULL,
            method VARCHAR NOT NULL, calibrate_method VARCHAR, calibration_states INTEGER NOT NULL,
            calibration_seeds JSON, calibration_capture JSON, calibration_sha256 VARCHAR, calibration_options JSON,
            per_channel BOOLEAN NOT NULL, nodes_excluded JSON NOT NULL, nodes_quantized JSON NOT NULL,
            excluded_quantized_at_load JSON NOT NULL, input_scale DOUBLE, onnxruntime_version VARCHAR NOT NULL
        )
        """,
    ),
    # the library that chose the ranges and wrote the file, with its version (onnxruntime or nncf)
    ("0413_int8_files_quantizer", "ALTER TABLE int8_files ADD COLUMN quantizer VARCHAR"),
]

schema.declare("int8_files", MIGRATIONS, [])
