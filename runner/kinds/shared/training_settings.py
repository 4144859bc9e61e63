"""The settings a `train` and a `throughput` measurement share, and the trials a sweep over
them makes: which values combine, which trial lengths follow, and where a swept value is
written (for an error that names its line)."""

from __future__ import annotations

import json
from typing import Any, Callable

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from breakout_core.learning.train_config import PROCESS_WIDE_SETTINGS, TrainConfig
from runner.spec.fields import StrictModel
from runner.spec.sweeps import (
    DEFAULT_MAX_TRIALS,
    MAX_TRIALS_LIMIT,
    Trial,
    expand_sweep,
    sweep_problems,
    sweep_size_problem,
)
from runner.spec.yaml_source import PlacedError


def _declared_settings() -> type[StrictModel]:
    """A spec model with one field per TrainConfig field: its type, default, description and bounds."""
    import typing
    from dataclasses import fields

    from pydantic import create_model

    hints = typing.get_type_hints(TrainConfig)
    declared = {}
    for f in fields(TrainConfig):
        meta = dict(f.metadata)
        if isinstance(f.default, tuple):  # a spec lists it; the trainer keeps it immutable
            declared[f.name] = (list[int], Field(default_factory=lambda d=f.default: list(d), **meta))
        else:
            declared[f.name] = (hints[f.name], Field(default=f.default, **meta))
    return create_model("DeclaredTrainSettings", __base__=StrictModel, **declared)


class TrainSettings(_declared_settings()):
    """Training fields (breakout_core.learning.train_config); units are transitions (one env step of one env)."""

    checkpoint_every: int | None = Field(default=None, gt=0, description="also checkpoint at every multiple")

    @field_validator("checkpoint_at")
    @classmethod
    def _positive_sorted(cls, marks: list[int]) -> list[int]:
        if any(m <= 0 for m in marks):
            raise ValueError("checkpoint transitions must be > 0")
        return sorted(set(marks))

    @field_validator("learner_precision")
    @classmethod
    def _precision_this_cpu_has(cls, precision: str, info: ValidationInfo) -> str:
        """bf16 where the CPU would emulate it is refused here, at the line that asks for it
        (learner_device is declared before)."""
        from breakout_core.learning.learner_precision import choose_learner_precision

        choose_learner_precision(precision, info.data.get("learner_device", "cpu"))
        return precision

    @model_validator(mode="after")
    def _consistent(self) -> "TrainSettings":
        from breakout_core.learning.replay_layout import replay_bytes
        from runner.store.provenance import memory_bytes

        if self.replay_capacity < self.num_envs * 64:
            raise ValueError(f"replay_capacity {self.replay_capacity} is too small for {self.num_envs} envs")
        needed, memory = replay_bytes(self.replay_capacity), memory_bytes()
        if self.replay_device in ("numpy", "cpu") and needed > memory:
            raise ValueError(f"replay_capacity {self.replay_capacity:,} needs {needed / 1e9:,.1f} GB of memory; "
                             f"this machine has {memory / 1e9:,.1f} GB")
        too_late = [m for m in self.checkpoint_at if m > self.total_transitions]
        if too_late:
            raise ValueError(f"checkpoint_at {too_late} beyond total_transitions {self.total_transitions}")
        return self

    def to_config(self) -> TrainConfig:
        values = self.model_dump()
        every = values.pop("checkpoint_every")
        marks = set(values["checkpoint_at"])
        if every:
            marks |= set(range(every, self.total_transitions + 1, every))
        values["checkpoint_at"] = tuple(sorted(marks))
        return TrainConfig(**values)


SWEEPABLE = tuple(TrainSettings.model_fields)


class SweptSettings(TrainSettings):
    """Training settings with a sweep over them: a measurement that makes one trial per
    combination of the listed values (`train`, `throughput`)."""

    sweep: dict[str, list[Any]] = Field(default_factory=dict, description="field -> values; one trial per combination")
    max_trials: int = Field(default=DEFAULT_MAX_TRIALS, ge=1, le=MAX_TRIALS_LIMIT,
                            description="the most trials the sweep may make (the product of its value counts)")

    @model_validator(mode="before")
    @classmethod
    def _sweep_size(cls, data: Any) -> Any:
        """Refuse a sweep too large to expand before any field is validated: every later check
        goes through its trials."""
        if isinstance(data, dict):
            limit = data.get("max_trials", DEFAULT_MAX_TRIALS)
            valid = type(limit) is int and 1 <= limit <= MAX_TRIALS_LIMIT  # else its own field error says so
            problem = sweep_size_problem(data.get("sweep"), limit if valid else DEFAULT_MAX_TRIALS)
            if problem is not None:
                raise problem
        return data
ONE_VALUE_PER_RUN = ("the setting lasts for the whole process once a training applies it, so a run takes one value: "
                     "run one spec per value and compare the runs")


def training_sweep_trials(sweep: dict[str, list[Any]], settings_for: Callable[[dict[str, Any]], TrainSettings]
                          ) -> tuple[list[tuple[Trial, TrainSettings]], list[PlacedError]]:
    """Every valid trial of `sweep` with its settings (`settings_for(overrides)`), and every
    problem, found in one pass: keys that are not training fields or are process-wide, values
    listed twice, and each trial's invalid settings. An error names the swept value at fault:
    the field it is about, or the one value that every failing trial, and no other, shares;
    else the trial, once for every trial that shares the message."""
    problems = sweep_problems(sweep, SWEEPABLE)
    problems += [PlacedError(f"sweep {key!r}: {ONE_VALUE_PER_RUN}", ("sweep", key))
                 for key in PROCESS_WIDE_SETTINGS if key in sweep]
    checkable = {key: values for key, values in sweep.items()
                 if key in SWEEPABLE and key not in PROCESS_WIDE_SETTINGS and values}
    checked, unplaced = [], {}  # unplaced: message -> the trials it holds for
    for trial in expand_sweep(checkable):
        try:
            checked.append((trial, settings_for(trial.overrides)))
        except ValidationError as exc:
            for error in exc.errors():
                field = error["loc"][0] if error["loc"] else None
                message = error["msg"].removeprefix("Value error, ")
                if field in trial.overrides:
                    problems.append(PlacedError(f"{swept_value(field, trial.overrides[field])}: {message}",
                                                swept_at(sweep, field, trial.overrides[field])))
                else:
                    unplaced.setdefault(message, []).append(trial)
    for message, failing in unplaced.items():
        if not failing[0].overrides:
            problems.append(PlacedError(message, ()))
        elif cause := _one_cause(checkable, [trial for trial, _ in checked], failing):
            field, value = cause
            problems.append(PlacedError(f"{swept_value(field, value)}: {message}", swept_at(sweep, field, value)))
        else:
            more = f" and {len(failing) - 1} more" if len(failing) > 1 else ""
            problems.append(PlacedError(f"sweep trial {failing[0].name!r}{more}: {message}", ("sweep",)))
    return checked, problems


def _one_cause(sweep: dict[str, list[Any]], passed: list[Trial], failing: list[Trial]) -> tuple[str, Any] | None:
    """(field, value) when exactly one swept value alone explains a failure: every failing trial
    has it, and each of them passes with any other value of that field in its place."""
    def place(overrides: dict[str, Any]) -> tuple[int, ...]:  # each value by its position in the sweep
        return tuple(_listed_at(sweep[f], overrides[f]) for f in sweep)

    passing = {place(trial.overrides) for trial in passed}
    places = [place(trial.overrides) for trial in failing]
    causes = []
    for j, field in enumerate(sweep):
        if len(sweep[field]) < 2 or len({p[j] for p in places}) != 1:
            continue
        if all(p[:j] + (k,) + p[j + 1:] in passing for p in places for k in range(len(sweep[field])) if k != p[j]):
            causes.append((field, sweep[field][places[0][j]]))
    return causes[0] if len(causes) == 1 else None


def _listed_at(values: list[Any], value: Any) -> int:
    """Where `values` lists `value`: the very object a trial took, not an equal one."""
    return next(i for i, listed in enumerate(values) if listed is value)


def swept_at(sweep: dict[str, list[Any]], field: str, value: Any) -> tuple:
    """Where in a measurement the sweep lists `value` for `field`."""
    return ("sweep", field, _listed_at(sweep[field], value))


def trial_lengths(sweep: dict[str, list[Any]], total_transitions: int) -> list[tuple[Trial, int]]:
    """Each trial of `sweep` (over the keys that list values) with its total_transitions, where
    that is a length: a value that is not is refused by the trials' own check."""
    trials = expand_sweep({key: values for key, values in sweep.items() if values})
    return [(trial, total) for trial in trials
            if type(total := trial.overrides.get("total_transitions", total_transitions)) is int and total >= 1]


def swept_value(field: str, value: Any) -> str:
    """Where a sweep lists a value, with the value as YAML spells it."""
    return f"sweep {field!r} value {json.dumps(value)}"


def where_swept(trial: Trial, field: str) -> str:
    """' (sweep 'field' value v)' where the trial's sweep sets `field`, else nothing."""
    return f" ({swept_value(field, trial.overrides[field])})" if field in trial.overrides else ""


def process_wide_problems(measurements: list) -> list[tuple[tuple, str]]:
    """(location, message) for each training measurement whose process-wide setting differs
    from the first training measurement's: one run is one process."""
    problems = []
    for key in PROCESS_WIDE_SETTINGS:
        first = None
        for i, m in enumerate(measurements):
            if not isinstance(m, TrainSettings):
                continue
            if first is None:
                first = m
            elif getattr(m, key) != getattr(first, key):
                here, there = (json.dumps(getattr(x, key)) for x in (m, first))  # as YAML spells them
                problems.append((("measurements", i, key),
                                 f"{key} is {here} here but {there} in measurement {first.name!r}: "
                                 f"{ONE_VALUE_PER_RUN}"))
    return problems
