"""The `train` measurement as a spec declares it."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from breakout_core.learning.train_config import MAX_TRAINING_SEED
from runner.kinds.shared.training_settings import (
    SweptSettings,
    TrainSettings,
    training_sweep_trials,
    trial_lengths,
    where_swept,
)
from runner.kinds.train.metric_names import COMPARED, EPISODE_DIFFERENCES, SCORE_METRICS
from runner.kinds.train.trainings import Training
from runner.spec.fields import EpisodeSeed, Name, Seeds, StrictModel, checks_files, seed_list, spec_relative
from runner.spec.sweeps import expand_sweep
from runner.spec.yaml_source import PlacedError, raise_placed


class CheckpointEvaluation(StrictModel):
    """Evaluate every checkpoint of each trial on fixed seeds (rows in `episodes`, policy 'trial@transition'),
    in process as each checkpoint is written, before training goes on."""

    seeds: Seeds
    epsilon: float = Field(default=0.0, ge=0.0, le=1.0)
    batch_size: int = Field(default=4, ge=1, le=256)


class GifStrip(StrictModel):
    """One GIF per listed transition count: that checkpoint playing one fixed seed at epsilon 0."""

    seed: EpisodeSeed
    at: list[Annotated[int, Field(gt=0)]] = Field(min_length=1, description="transition counts, each a checkpoint")


class TrainMeasurement(SweptSettings):
    kind: Literal["train"]
    name: Name
    seeds: int | list[int] | None = Field(
        default=None, description="training seeds: a count N (seed, seed+1, ..., seed+N-1) or a list; each trial "
                                  "trains once per seed. Unset: one training seed, `seed`")
    score_seeds: Seeds | None = Field(
        default=None, description="episode seeds on which each (trial, seed)'s final checkpoint plays greedily; "
                                  "its mean is the training's score, what comparisons between trials judge")
    score_batch: int = Field(default=8, ge=1, le=256, description="episodes played at once while scoring")
    start_from: str | None = Field(
        default=None, description="a checkpoint (relative to the spec) that a training with no trainer state goes on "
                                  "from: its weights, at its transition count, with a fresh optimizer and an empty "
                                  "replay that the current policy refills before learning resumes")
    evaluate_checkpoints: CheckpointEvaluation | None = None
    gif: GifStrip | None = None

    @field_validator("seeds")
    @classmethod
    def _seeds_valid(cls, seeds: int | list[int] | None) -> int | list[int] | None:
        if isinstance(seeds, int) and not 1 <= seeds <= 64:
            raise ValueError(f"seeds: a count from 1 to 64, got {seeds}")
        if isinstance(seeds, list):
            if not 1 <= len(seeds) <= 64:
                raise ValueError(f"seeds: a list of 1 to 64 training seeds, got {len(seeds)}")
            if any(not 0 <= s <= MAX_TRAINING_SEED for s in seeds):
                raise ValueError(f"seeds: training seeds are from 0 to {MAX_TRAINING_SEED}")
            if len(set(seeds)) != len(seeds):
                raise ValueError("seeds: training seeds must be distinct")
        return seeds

    @field_validator("start_from")
    @classmethod
    def _checkpoint_file(cls, start_from: str | None, info: ValidationInfo) -> str | None:
        if start_from is None:
            return None
        path = spec_relative(start_from, info)
        if checks_files(info) and not path.is_file():
            raise ValueError(f"start_from: no checkpoint file {path}")
        return str(path)

    @model_validator(mode="after")
    def _sweep_valid(self) -> "TrainMeasurement":
        problems = []
        for trial, total in trial_lengths(self.sweep, self.total_transitions) if self.gif is not None else ():
            late = [at for at in self.gif.at if at > total]
            if late:
                problems.append(PlacedError(f"gif.at {late} beyond total_transitions {total}"
                                            f"{where_swept(trial, 'total_transitions')}",
                                            ("gif", "at", self.gif.at.index(late[0]))))
        # the trials are checked without the GIFs' checkpoints, which the lines above judge
        problems += training_sweep_trials(self.sweep, lambda overrides: self.settings_for(overrides, gifs=False))[1]
        if "seed" in self.sweep and self.seeds is not None:
            problems.append(PlacedError("both `seeds` and a sweep over `seed`: list the training seeds once, in "
                                        "`seeds`", ("sweep", "seed")))
        if isinstance(self.seeds, int) and self.seed + self.seeds - 1 > MAX_TRAINING_SEED:
            problems.append(PlacedError(f"seeds: {self.seeds} seeds from seed {self.seed} go past {MAX_TRAINING_SEED}",
                                        ("seeds",)))
        raise_placed(problems)
        return self

    def training_seeds(self, overrides: dict[str, Any] | None = None) -> list[int]:
        """The training seeds each trial trains with (a trial's own, given its `overrides`): those
        `seeds` lists, or else the one its sweep or `seed` gives."""
        if self.seeds is None:
            return [(overrides or {}).get("seed", self.seed)]
        if isinstance(self.seeds, int):
            return [self.seed + i for i in range(self.seeds)]
        return list(self.seeds)

    def trainings(self) -> list[Training]:
        """Every (trial, training seed) training, trial by trial."""
        return [Training(trial.name, trial.overrides, seed,
                     trial.name if self.seeds is None else f"{trial.name},seed={seed}")
                for trial in expand_sweep(self.sweep) for seed in self.training_seeds(trial.overrides)]

    def settings_for(self, overrides: dict[str, Any], *, gifs: bool = True) -> TrainSettings:
        """A trial's settings; with `gifs`, its checkpoints include those its GIFs are drawn from."""
        values = {**self.model_dump(include=set(TrainSettings.model_fields)), **overrides}
        marks = values["checkpoint_at"]
        if gifs and self.gif is not None and isinstance(marks, list) and all(isinstance(m, int) for m in marks):
            values["checkpoint_at"] = sorted(set(marks) | set(self.gif.at))  # every GIF needs its checkpoint
        return TrainSettings.model_validate(values)

    def training_config(self, training: Training):
        return self.settings_for({**training.overrides, "seed": training.training_seed}).to_config()

    def episode_seeds(self) -> list[tuple[tuple, list[int]]]:
        """The seeded games its checkpoints play: the final ones' scores, every checkpoint's
        evaluation, the GIFs. (Training's own games start from seeds drawn from the training
        seed, breakout_core.learning.trainer.slot_seed, and no verdict judges them.)"""
        played = [(("score_seeds",), seed_list(self.score_seeds))] if self.score_seeds is not None else []
        if self.evaluate_checkpoints is not None:
            played.append((("evaluate_checkpoints", "seeds"), seed_list(self.evaluate_checkpoints.seeds)))
        if self.gif is not None:
            played.append((("gif", "seed"), [self.gif.seed]))
        return played

    def metric_problem(self, metric: str) -> str | None:
        if metric in COMPARED:
            return (f"{metric} is one difference between single draws: judge its interval over training seeds, "
                    f"{metric}_ci_low or _ci_high")
        if metric in EPISODE_DIFFERENCES:
            return (f"{metric} is one difference between single draws, and training episodes have no interval over "
                    "training seeds: judge the greedy scores', score_mean_diff_ci_low or score_iqm_diff_ci_low "
                    "(with `score_seeds`)")
        if metric in SCORE_METRICS and self.score_seeds is None:
            return f"{metric} judges scores over training seeds: give measurement {self.name!r} `score_seeds`"
        return None
