"""Calibration states for INT8: how many, by which method, from the agent's own games on seeds the
spec declares, and the check that those games are none of the games the spec judges by.

A calibration state sets a quantization range; a state the model is then judged on must not
have set it. So the calibration seeds must be disjoint from the fixed states' seeds (read
from the fixed-states files the spec names, and from the seeds of any export that captures
them in this spec) and from every episode seed the spec's measurements play.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, model_validator

from breakout_core.quantize import MIN_CALIBRATION_STATES
from runner.kinds.shared.state_capture import CaptureSpec
from runner.spec.fields import SeedRange, Seeds, StrictModel, seed_list
from runner.spec.yaml_source import PlacedError

PLAYED_SEED_FIELDS = ("seeds", "score_seeds", "episode_seeds")  # fields that name the episode seeds games play


class CalibrationCapture(CaptureSpec):
    episode_seeds: Seeds = Field(description="one calibration game per seed: none of the fixed states' seeds "
                                 "nor any episode seed the spec's measurements play")


class CalibrationSpec(StrictModel):
    methods: list[Literal["minmax", "entropy", "percentile"]] = Field(
        default_factory=lambda: ["minmax"], min_length=1, description="onnxruntime calibration methods to try")
    n_states: int = Field(default=64, le=10_000, description="calibration states, spread over the calibration games")
    capture: CalibrationCapture

    @model_validator(mode="after")
    def _enough(self) -> "CalibrationSpec":
        if len(set(self.methods)) != len(self.methods):
            raise PlacedError("calibration methods must be distinct", ("methods",))
        for method in self.methods:
            if self.n_states < MIN_CALIBRATION_STATES[method]:
                what = "an empty calibration set" if self.n_states <= 0 else f"{self.n_states} states"
                raise PlacedError(f"{what}: {method} calibration needs at least "
                                  f"{MIN_CALIBRATION_STATES[method]} states", ("n_states",))
        per_game = math.ceil(self.n_states / len(seed_list(self.capture.episode_seeds)))
        if self.capture.candidates_per_episode < 2 * per_game:
            raise PlacedError(f"{per_game} states from each calibration game need candidates_per_episode >= "
                              f"{2 * per_game}", ("capture", "candidates_per_episode"))
        return self


def played_seeds(spec, context: dict) -> dict[int, str]:
    """Every episode seed the spec's games are judged on or its fixed states come from: seed -> where."""
    import numpy as np

    found: dict[int, str] = {}
    for m in spec.measurements:
        for seed, where in _model_seeds(m, m.name):
            found.setdefault(seed, where)
        seed = getattr(m, "seed", None)  # a closed loop's one game
        if isinstance(seed, int) and not isinstance(seed, bool):
            found.setdefault(seed, f"measurement {m.name} (seed)")
    if context.get("check_files", True):
        for name, artifact in spec.artifacts.items():
            if artifact.type == "fixed_states" and Path(artifact.path).is_file():
                try:
                    with np.load(artifact.path, allow_pickle=False) as data:
                        seeds = np.unique(data["episode_seeds"]).tolist() if "episode_seeds" in data.files else []
                except Exception:  # noqa: BLE001 -- not a fixed-states file: the file checks report it
                    continue
                for seed in seeds:
                    found.setdefault(int(seed), f"the fixed states artifacts.{name}")
    return found


def _model_seeds(model: BaseModel, where: str):
    for key in type(model).model_fields:
        value = getattr(model, key)
        if isinstance(value, CalibrationSpec):
            continue  # calibration games are not judged
        if key in PLAYED_SEED_FIELDS and isinstance(value, (list, SeedRange)):
            yield from ((int(s), f"measurement {where} ({key})") for s in seed_list(value))
        elif isinstance(value, BaseModel):
            yield from _model_seeds(value, where)


def calibration_seed_problems(calibration: CalibrationSpec, spec, context: dict, at: tuple) -> list[tuple[tuple, str]]:
    """Calibration seeds that the spec also plays or took its fixed states from, each at its place."""
    played = played_seeds(spec, context)
    seeds = calibration.capture.episode_seeds
    problems = []
    for j, seed in enumerate(seed_list(seeds)):
        if seed in played:
            place = (*at, "capture", "episode_seeds") + ((j,) if isinstance(seeds, list) else ())
            problems.append((place, f"calibration seed {seed} is also played by {played[seed]}; calibration games "
                                    "must be disjoint from the fixed states' seeds and every evaluation seed"))
            if not isinstance(seeds, list):
                break  # one line for a range
    return problems
