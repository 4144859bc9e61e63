"""Calibration states for INT8: how many, by which method, from the agent's own games on seeds the
spec declares.

A calibration state sets a quantization range; a state the model is then judged on must not
have set it. So the calibration seeds must be disjoint from the fixed states' seeds and from
every episode seed the spec's measurements play: a kind that calibrates declares them as its
`held_out_seeds`, and runner.spec.deploy_checks refuses any overlap.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from breakout_core.conversion.nncf_quantize import NNCF_MIN_CALIBRATION_STATES
from breakout_core.conversion.quantize import MIN_CALIBRATION_STATES
from breakout_core.diagnosis.repair import NNCF_METHOD
from runner.kinds.shared.state_capture import CaptureSpec
from runner.spec.fields import Seeds, StrictModel, seed_list
from runner.spec.yaml_source import PlacedError


class CalibrationCapture(CaptureSpec):
    episode_seeds: Seeds = Field(description="one calibration game per seed: none of the fixed states' seeds "
                                 "nor any episode seed the spec's measurements play")


class CalibrationSpec(StrictModel):
    methods: list[Literal["minmax", "entropy", "percentile", "nncf"]] = Field(
        default_factory=lambda: ["minmax"], min_length=1,
        description="calibration methods to try: onnxruntime's quantizer with minmax, entropy or percentile, or "
                    "nncf (NNCF's quantizer and its own ranges; the `openvino` extra)")
    n_states: int = Field(default=64, le=10_000, description="calibration states, spread over the calibration games")
    capture: CalibrationCapture

    @model_validator(mode="after")
    def _enough(self) -> "CalibrationSpec":
        if len(set(self.methods)) != len(self.methods):
            raise PlacedError("calibration methods must be distinct", ("methods",))
        least = {**MIN_CALIBRATION_STATES, NNCF_METHOD: NNCF_MIN_CALIBRATION_STATES}
        for method in self.methods:
            if self.n_states < least[method]:
                what = "an empty calibration set" if self.n_states <= 0 else f"{self.n_states} states"
                raise PlacedError(f"{what}: {method} calibration needs at least {least[method]} states", ("n_states",))
        per_game = math.ceil(self.n_states / len(seed_list(self.capture.episode_seeds)))
        if self.capture.candidates_per_episode < 2 * per_game:
            raise PlacedError(f"{per_game} states from each calibration game need candidates_per_episode >= "
                              f"{2 * per_game}", ("capture", "candidates_per_episode"))
        return self
