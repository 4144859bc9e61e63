"""`train`: DQN-family training trials; every episode, diagnostics row and checkpoint stored.

A sweep lists values for any training field; each combination is a trial. `seeds:` trains
each trial once per training seed: a (trial, training seed) pair is the unit of work, and
every row carries its training seed. With `score_seeds:` each pair's final checkpoint plays
those episode seeds greedily; a pair's score is its mean, and comparisons between trials
judge the scores over training seeds (mean, IQM and probability of improvement, each with a
95% CI over seeds that accounts for how few seeds there are: breakout_core.stats). With one
training seed per arm a comparison is inconclusive: one training run says nothing about the
spread between runs.

`runner run SPEC --resume` continues the spec's last unfinished run: each unfinished pair
goes on from its last checkpoint (its replay refilled first), and rows the killed attempt
wrote past that checkpoint are superseded in the *_valid views.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Callable, Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from breakout_core.hashing import file_sha256
from breakout_core.train_config import MAX_TRAINING_SEED, PROCESS_WIDE_SETTINGS, TrainConfig
from runner.kinds.base import Kind, RunContext, Section
from runner.spec_base import MAX_SEED, Name, Seeds, StrictModel, checks_files, seed_list, spec_relative
from runner.sweeps import Trial, expand_sweep, sweep_problems
from runner.train_pairs import Pair, PairJob
from runner.yaml_source import PlacedError, raise_placed

if TYPE_CHECKING:
    from runner.store import Store


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
    """Training fields (breakout_core.train_config); units are transitions (one env step of one env)."""

    checkpoint_every: int | None = Field(default=None, gt=0, description="also checkpoint at every multiple")

    @field_validator("checkpoint_at")
    @classmethod
    def _positive_sorted(cls, marks: list[int]) -> list[int]:
        if any(m <= 0 for m in marks):
            raise ValueError("checkpoint transitions must be > 0")
        return sorted(set(marks))

    @model_validator(mode="after")
    def _consistent(self) -> "TrainSettings":
        from breakout_core.replay_layout import replay_bytes

        from runner.provenance import memory_bytes

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
                                 f"{key} is {here} here but {there} in measurement {first.name!r}: {ONE_VALUE_PER_RUN}"))
    return problems


class CheckpointEvaluation(StrictModel):
    """Evaluate every checkpoint of each trial on fixed seeds (rows in `episodes`, policy 'trial@transition'),
    in process as each checkpoint is written, before training goes on."""

    seeds: Seeds
    epsilon: float = Field(default=0.0, ge=0.0, le=1.0)
    batch_size: int = Field(default=4, ge=1, le=256)


class GifStrip(StrictModel):
    """One GIF per listed transition count: that checkpoint playing one fixed seed at epsilon 0."""

    seed: int = Field(ge=0, le=MAX_SEED)
    at: list[Annotated[int, Field(gt=0)]] = Field(min_length=1, description="transition counts, each a checkpoint")


class TrainMeasurement(TrainSettings):
    kind: Literal["train"]
    name: Name
    sweep: dict[str, list[Any]] = Field(default_factory=dict, description="field -> values; one trial per combination")
    seeds: int | list[int] | None = Field(
        default=None, description="training seeds: a count N (seed, seed+1, ..., seed+N-1) or a list; each trial "
                                  "trains once per seed. Unset: one training seed, `seed`")
    score_seeds: Seeds | None = Field(
        default=None, description="episode seeds on which each (trial, seed)'s final checkpoint plays greedily; "
                                  "its mean is the pair's score, what comparisons between trials judge")
    score_batch: int = Field(default=8, ge=1, le=256, description="episodes played at once while scoring")
    start_from: str | None = Field(
        default=None, description="a checkpoint (relative to the spec) that a pair with no trainer state goes on "
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

    def pairs(self) -> list[Pair]:
        """Every (trial, training seed) pair, trial by trial."""
        return [Pair(trial.name, trial.overrides, seed, trial.name if self.seeds is None else f"{trial.name},seed={seed}")
                for trial in expand_sweep(self.sweep) for seed in self.training_seeds(trial.overrides)]

    def settings_for(self, overrides: dict[str, Any], *, gifs: bool = True) -> TrainSettings:
        """A trial's settings; with `gifs`, its checkpoints include those its GIFs are drawn from."""
        values = {**self.model_dump(include=set(TrainSettings.model_fields)), **overrides}
        marks = values["checkpoint_at"]
        if gifs and self.gif is not None and isinstance(marks, list) and all(isinstance(m, int) for m in marks):
            values["checkpoint_at"] = sorted(set(marks) | set(self.gif.at))  # every GIF needs its checkpoint
        return TrainSettings.model_validate(values)

    def pair_config(self, pair: Pair):
        return self.settings_for({**pair.overrides, "seed": pair.training_seed}).to_config()

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


MIGRATIONS = [
    (
        "0200_train",
        """
        CREATE TABLE train_attempts (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, trial VARCHAR NOT NULL,
            attempt INTEGER NOT NULL, from_transition BIGINT NOT NULL, config JSON NOT NULL,
            out_dir VARCHAR NOT NULL, started_at TIMESTAMPTZ NOT NULL
        );
        CREATE TABLE train_episodes (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, trial VARCHAR NOT NULL, attempt INTEGER NOT NULL,
            env_index INTEGER NOT NULL, transition BIGINT NOT NULL, episode_return DOUBLE NOT NULL,
            length INTEGER NOT NULL, ended_by VARCHAR NOT NULL
        );
        CREATE TABLE train_diagnostics (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, trial VARCHAR NOT NULL, attempt INTEGER NOT NULL,
            transition BIGINT NOT NULL, "update" BIGINT NOT NULL, loss DOUBLE, q_mean DOUBLE, target_mean DOUBLE,
            td_abs_mean DOUBLE, td_abs_max DOUBLE, grad_norm DOUBLE, epsilon DOUBLE, replay_frames BIGINT
        );
        CREATE TABLE train_checkpoints (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, trial VARCHAR NOT NULL, attempt INTEGER NOT NULL,
            transition BIGINT NOT NULL, path VARCHAR NOT NULL
        );
        CREATE TABLE train_results (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, trial VARCHAR NOT NULL, attempt INTEGER NOT NULL,
            transitions BIGINT NOT NULL, updates BIGINT NOT NULL, target_syncs BIGINT NOT NULL,
            wall_s DOUBLE NOT NULL, transitions_per_s DOUBLE NOT NULL
        );
        """,
    ),
    (
        "0201_train_results_measured",  # throughput after warm-up; how far the weights moved
        """
        ALTER TABLE train_results ADD COLUMN measured_transitions BIGINT;
        ALTER TABLE train_results ADD COLUMN measured_s DOUBLE;
        ALTER TABLE train_results ADD COLUMN weights_moved DOUBLE;
        """,
    ),
    (
        "0202_train_seeds",  # every row carries its training seed; rows stored before take their config's
        """
        ALTER TABLE train_attempts ADD COLUMN training_seed BIGINT;
        UPDATE train_attempts SET training_seed = CAST(json_extract_string(config, '$.seed') AS BIGINT);
        """ + "".join(f"""
        ALTER TABLE {table} ADD COLUMN training_seed BIGINT;
        UPDATE {table} t SET training_seed = a.training_seed FROM train_attempts a
        WHERE a.run_id = t.run_id AND a.measurement = t.measurement AND a.trial = t.trial AND a.attempt = t.attempt;
        """ for table in ("train_episodes", "train_diagnostics", "train_checkpoints", "train_results")) + """
        CREATE TABLE train_scores (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, trial VARCHAR NOT NULL,
            training_seed BIGINT NOT NULL, transition BIGINT NOT NULL, checkpoint VARCHAR NOT NULL,
            eval_seed BIGINT NOT NULL, score DOUBLE NOT NULL, steps INTEGER NOT NULL, ended_by VARCHAR NOT NULL
        );
        """,
    ),
    (
        "0203_train_resume_modes",  # how each attempt began; attempts stored before began fresh or from their state
        """
        ALTER TABLE train_attempts ADD COLUMN resume_mode VARCHAR;
        ALTER TABLE train_attempts ADD COLUMN resumed_from VARCHAR;
        UPDATE train_attempts SET resume_mode = CASE WHEN from_transition = 0 THEN 'fresh' ELSE 'trainer_state' END;
        """,
    ),
    (
        "0204_train_start_file_sha256",  # which bytes a checkpoint-mode attempt began from; unknown for earlier rows
        "ALTER TABLE train_attempts ADD COLUMN resumed_from_sha256 VARCHAR;",
    ),
]

_SUPERSEDED = """
    NOT EXISTS (SELECT 1 FROM train_attempts a
                WHERE a.run_id = t.run_id AND a.measurement = t.measurement AND a.trial = t.trial
                  AND a.training_seed = t.training_seed AND a.attempt > t.attempt AND t.transition > a.from_transition)
"""

VIEWS = [
    f"CREATE OR REPLACE VIEW train_episodes_valid AS SELECT t.* FROM train_episodes t WHERE {_SUPERSEDED}",
    f"CREATE OR REPLACE VIEW train_diagnostics_valid AS SELECT t.* FROM train_diagnostics t WHERE {_SUPERSEDED}",
    # a resumed attempt writes again the checkpoint file it resumed from when that was the last one (final.pt)
    f"""CREATE OR REPLACE VIEW train_checkpoints_valid AS SELECT t.* FROM train_checkpoints t WHERE {_SUPERSEDED}
        QUALIFY row_number() OVER (PARTITION BY run_id, measurement, trial, training_seed, transition, path
                                   ORDER BY attempt DESC) = 1""",
    """
    CREATE OR REPLACE VIEW train_curve AS
    SELECT *, avg(episode_return) OVER (
               PARTITION BY run_id, measurement, trial, training_seed ORDER BY transition, env_index
               ROWS BETWEEN 19 PRECEDING AND CURRENT ROW) AS moving_avg_20
    FROM train_episodes_valid
    """,
    """
    CREATE OR REPLACE VIEW train_trial_summary AS
    WITH ranked AS (
        SELECT *, row_number() OVER (PARTITION BY run_id, measurement, trial, training_seed
                                     ORDER BY transition DESC, env_index DESC) AS back
        FROM train_episodes_valid)
    SELECT run_id, measurement, trial, training_seed, count(*) AS episodes, max(transition) AS last_episode_transition,
           avg(episode_return) FILTER (WHERE back <= 20) AS last20_mean,
           median(episode_return) FILTER (WHERE back <= 20) AS last20_median,
           avg(episode_return) FILTER (WHERE back <= 10) - avg(episode_return) FILTER (WHERE back BETWEEN 11 AND 20)
               AS last20_trend,
           max(episode_return) AS best_return
    FROM ranked GROUP BY run_id, measurement, trial, training_seed
    """,
    """
    CREATE OR REPLACE VIEW train_seed_scores AS
    SELECT run_id, measurement, trial, training_seed, any_value(transition) AS transition, count(*) AS episodes,
           avg(score) AS score, count(DISTINCT score) AS distinct_scores, count(DISTINCT steps) AS distinct_lengths,
           count(*) FILTER (WHERE ended_by = 'time_limit') AS time_limit_episodes
    FROM train_scores GROUP BY run_id, measurement, trial, training_seed
    """,
]


def _stored(ctx: RunContext, measurement: str, pair: Pair
            ) -> tuple[int, bool, str | None, tuple[str, int] | None, tuple[str, int] | None]:
    """(attempts so far, whether one finished, the folder they trained in, the final checkpoint
    and its transition when its score is still missing, the newest checkpoint whose file is still
    there and its transition) for one pair of this run."""
    where = "run_id = ? AND measurement = ? AND trial = ? AND training_seed = ?"
    args = [ctx.run_id, measurement, pair.trial, pair.training_seed]
    with ctx.store.reader() as con:
        attempts, out_dir = con.execute(f"SELECT count(*), arg_max(out_dir, attempt) FROM train_attempts WHERE {where}",
                                        args).fetchone()
        # newest first; at one transition the numbered checkpoint before final.pt (the same weights)
        checkpoints = con.execute(f"SELECT path, transition FROM train_checkpoints_valid WHERE {where} "
                                  "ORDER BY transition DESC, path", args).fetchall()
    stored = {"trial": pair.trial, "training_seed": pair.training_seed}
    finished = ctx.already_stored("train_results", measurement, **stored)
    scored = ctx.already_stored("train_scores", measurement, **stored)
    # the pair's score is its final.pt's (at the last transition, after the numbered file), as a
    # training that was not stopped scores it
    final = max(checkpoints, key=lambda row: (row[1], row[0]), default=None)
    unscored = None if scored else final
    latest = next(((p, t) for p, t in checkpoints if Path(p).is_file()), None)
    return attempts, finished, out_dir, unscored, latest


def execute(m: TrainMeasurement, ctx: RunContext) -> None:
    from runner.pair_executors import Executor, run_pairs, score_here

    executor = ctx.executor or Executor()
    # a Ray task trains its pair whole in its worker's own folder: it cannot go on from a state
    # or a checkpoint here, which a worker on another node does not have
    on_ray = executor.name == "ray"
    jobs = []
    for pair in m.pairs():
        attempts, finished, stored_dir, unscored, latest = _stored(ctx, m.name, pair)
        folder = ctx.artifacts_dir / m.name / pair.trial
        # a pair's folder: where its earlier attempts trained, so a resume finds its trainer state
        out_dir = Path(stored_dir) if stored_dir else folder if m.seeds is None else folder / f"seed={pair.training_seed}"
        config = m.pair_config(pair)
        state = out_dir / "trainer_state.pt"
        if attempts > 0 and state.exists() and not on_ray:
            mode, source, from_transition = "trainer_state", str(state), _saved_transitions(state)
        elif attempts > 0 and latest is not None and not on_ray:
            # its state is gone (a crash between its first checkpoint and the state after it, or the
            # state deleted): on from the pair's own newest checkpoint rather than from the start
            mode, source, from_transition = "checkpoint", latest[0], latest[1]
        elif m.start_from is not None:
            mode, source, from_transition = "checkpoint", m.start_from, _saved_transitions(Path(m.start_from))
        else:
            mode, source, from_transition = "fresh", None, 0
        source_sha256 = file_sha256(source) if mode == "checkpoint" else None
        if mode == "checkpoint" and source == m.start_from:
            _refuse_changed_start(ctx, m.name, m.start_from, source_sha256)
        job = PairJob(run_id=ctx.run_id, measurement=m.name, pair=pair, config=config, contract=ctx.contract,
                      out_dir=str(out_dir), attempt=attempts, resume_mode=mode, resumed_from=source,
                      resumed_from_sha256=source_sha256,
                      other_contract=ctx.spec.contract.other_contracts == "deliberate",
                      from_transition=from_transition,
                      score_seeds=tuple(seed_list(m.score_seeds)) if m.score_seeds is not None else (),
                      score_batch=m.score_batch)
        if not finished:
            jobs.append(job)
            if mode == "checkpoint" and m.evaluate_checkpoints is not None:
                # the curve's first point: what the training starts from, on the same seeds
                ctx.store.append_rows("episodes", _checkpoint_episodes(m, ctx, pair, from_transition, source))
        elif job.score_seeds and unscored:  # a run killed while scoring its pair does what is left
            score_here(job, ctx, *unscored)
    # in this process each checkpoint is scored as it lands, so a training stopped before its end
    # has scored what it reached; Ray pairs are scored here once they are stored
    on_checkpoint = None if m.evaluate_checkpoints is None else (
        lambda pair, transition, path: [("episodes", row) for row in _checkpoint_episodes(m, ctx, pair, transition, path)])
    run_pairs(jobs, ctx, executor, on_checkpoint)
    for pair in m.pairs():
        _after_training(m, ctx, pair)


def pairs_not_made(m: TrainMeasurement, store: Store, run_id: str) -> str | None:
    """Why a run cannot be resumed when it holds trainings under (trial, training seed) pairs
    that the spec does not make (a sweep over seed stored while every trial trained the base
    seed): it would train its pairs again beside those rows, in the same folders, and mix two
    sets of agents in one run."""
    made = {(pair.trial, pair.training_seed) for pair in m.pairs()}
    with store.reader() as con:
        stored = con.execute("SELECT DISTINCT trial, training_seed FROM train_attempts WHERE run_id = ? AND "
                             "measurement = ? ORDER BY ALL", [run_id, m.name]).fetchall()
    strangers = [f"{trial} with training seed {seed}" for trial, seed in stored if (trial, seed) not in made]
    if not strangers:
        return None
    return (f"measurement {m.name!r}: run {run_id} holds trainings this spec does not make "
            f"({', '.join(strangers)}); resuming would train again beside them: run the spec without --resume")


def _refuse_changed_start(ctx: RunContext, measurement: str, path: str, sha256: str) -> None:
    """A pair that starts from `start_from` in a run some pair already began from it must start
    from the same bytes: a ship that replaced the file in between would otherwise join a second
    agent's rows to the first's under one run. Each pair's first attempt records the start file
    (it has no checkpoint of its own yet), whatever path the spec was loaded by."""
    from runner.execute import NothingToResume

    with ctx.store.reader() as con:
        began = con.execute("SELECT resumed_from_sha256 FROM train_attempts WHERE run_id = ? AND measurement = ? "
                            "AND attempt = 0 AND resume_mode = 'checkpoint' AND resumed_from_sha256 IS NOT NULL "
                            "AND resumed_from_sha256 <> ? LIMIT 1", [ctx.run_id, measurement, sha256]).fetchone()
    if began is not None:
        raise NothingToResume(
            f"measurement {measurement!r}: start_from {path} is not the file run {ctx.run_id} began from "
            f"(sha256 {began[0][:12]}… then, {sha256[:12]}… now); resuming would join two agents' rows in one run: "
            "run the spec without --resume")


def _checkpoint_episodes(m: TrainMeasurement, ctx: RunContext, pair: Pair, transition: int, path: str) -> list[dict]:
    """The `episodes` rows of one checkpoint playing greedily on `evaluate_checkpoints`' seeds
    (policy 'trial@transition'); none when the database already holds them. The caller
    stores them: while training, through the run's row buffer, which keeps them when a
    reader holds the database."""
    from breakout_core.evaluator import evaluate
    from breakout_core.policies import QNetworkPolicy

    from runner.kinds.evaluate import episode_row

    policy = f"{pair.label}@{transition}"
    with ctx.store.reader() as con:  # a killed run scored some
        if con.execute("SELECT count(*) > 0 FROM episodes WHERE run_id = ? AND measurement = ? AND policy = ?",
                       [ctx.run_id, m.name, policy]).fetchone()[0]:
            return []
    spec = m.evaluate_checkpoints
    seeds = seed_list(spec.seeds)
    task = ctx.progress.add_task(f"{m.name} · evaluate {policy}", total=len(seeds), unit="episodes")
    result = evaluate(QNetworkPolicy.from_checkpoint(path, epsilon=spec.epsilon), seeds, ctx.contract,
                      batch_size=spec.batch_size, on_episode=lambda _e: ctx.progress.advance(task))
    _log_evaluation(ctx, m.name, policy, result.episodes)
    return [episode_row(ctx, m.name, policy, e) for e in result.episodes]


def _after_training(m: TrainMeasurement, ctx: RunContext, pair: Pair) -> None:
    """Evaluate the pair's checkpoints not yet evaluated and record its GIF strip, from the
    checkpoints stored. What a killed run already stored (a checkpoint's episodes, a GIF) is
    not done again."""
    from breakout_core.evaluator import evaluate, write_gif
    from breakout_core.policies import QNetworkPolicy

    from runner.kinds.evaluate import gif_row

    with ctx.store.reader() as con:
        checkpoints = con.execute(  # one per transition count: a last mark and final.pt hold the same weights
            "SELECT transition, min(path) FROM train_checkpoints_valid WHERE run_id = ? AND measurement = ? AND trial = ? "
            "AND training_seed = ? GROUP BY transition ORDER BY transition",
            [ctx.run_id, m.name, pair.trial, pair.training_seed]).fetchall()
        recorded = {row[0] for row in con.execute(
            "SELECT path FROM artifacts WHERE run_id = ? AND measurement = ?", [ctx.run_id, m.name]).fetchall()}
    if m.evaluate_checkpoints is not None:
        for transition, path in checkpoints:
            if episodes := _checkpoint_episodes(m, ctx, pair, transition, path):
                ctx.store.append_rows("episodes", episodes)
    if m.gif is not None:
        for transition, path in checkpoints:
            # zero-padded so the report, which lists GIFs by path, shows them in transition order
            gif_path = ctx.reports_dir / "gifs" / f"{ctx.run_id}-{m.name}-{pair.label}-{transition:09d}.gif"
            if transition not in m.gif.at or str(gif_path) in recorded:
                continue
            result = evaluate(QNetworkPolicy.from_checkpoint(path), [m.gif.seed], ctx.contract, batch_size=1,
                              record_seed=m.gif.seed)
            gif = write_gif(result.frames, gif_path)
            ctx.store.append_rows("artifacts", [gif_row(ctx, m.name, gif, f"{pair.label} @ {transition} transitions",
                                                        result.episodes[0], len(result.frames))])


def _log_evaluation(ctx: RunContext, measurement: str, policy: str, episodes) -> None:
    """One plain line per evaluated checkpoint: an evaluation of slow checkpoints (they stall to
    the time limit) can take many minutes, and a log file shows no progress bar."""
    import statistics

    scores = [e.score for e in episodes]
    stalled = sum(1 for e in episodes if e.ended_by == "time_limit")
    ctx.progress.console.log(f"{measurement} · evaluated {policy} on {len(scores)} seeds: mean score "
                             f"{statistics.fmean(scores):.2f}, median {statistics.median(scores):g}, "
                             f"{stalled} ended by the time limit")


def _saved_transitions(path: Path) -> int:
    """The transition count a trainer state or a checkpoint was saved at."""
    import torch

    return int(torch.load(path, map_location="cpu", weights_only=True)["transitions"])


HEALTH_METRICS = ("finished", "weights_moved", "replay_fill_fraction", "epsilon_schedule_error",
                  "non_finite_diagnostics")
# a health figure over several training seeds is its worst seed's
WORST_OVER_SEEDS = {"finished": min, "weights_moved": min, "replay_fill_fraction": min,
                    "epsilon_schedule_error": max, "non_finite_diagnostics": max}
LEARNING_METRICS = ("last20_mean", "last20_median", "last20_trend", "transitions_per_s")  # means over seeds
INTERVALS = ("_ci_low", "_ci_high")
SCORE_METRICS = tuple(f"score_{name}{bound}" for name in ("mean", "iqm") for bound in ("",) + INTERVALS)
# comparisons over training seeds, judged by their intervals; the raw values are evidence only
EPISODE_DIFFERENCES = tuple(f"{name}_diff" for name in LEARNING_METRICS[:3])
COMPARED = ("score_mean_diff", "score_iqm_diff", "probability_of_improvement", "transitions_per_s_speedup")
COMPARISON_METRICS = tuple(name + bound for name in COMPARED for bound in INTERVALS)
SCORE_METRICS += tuple(name for name in COMPARISON_METRICS if not name.startswith("transitions_per_s"))
RAW_COMPARISONS = COMPARED + EPISODE_DIFFERENCES
METRIC_NAMES = HEALTH_METRICS + LEARNING_METRICS + SCORE_METRICS[:6] + COMPARISON_METRICS + RAW_COMPARISONS
ONE_SEED = "one training seed per arm"


def participants(m: TrainMeasurement) -> list[str]:
    return [t.name for t in expand_sweep(m.sweep)]


def _pair_metrics(con, run_id: str, m: TrainMeasurement, pair: Pair) -> dict[str, float]:
    """Day 13's health checks and Day 14's learning figures for one (trial, training seed)."""
    found: dict[str, float] = {}
    where, args = "run_id = ? AND measurement = ? AND trial = ? AND training_seed = ?", [run_id, m.name, pair.trial,
                                                                                         pair.training_seed]
    result = con.execute(f"SELECT transitions, transitions_per_s, weights_moved FROM train_results WHERE {where} "
                         "ORDER BY attempt DESC LIMIT 1", args).fetchone()
    found["finished"] = 1.0 if result else 0.0
    if result:
        found["weights_moved"] = result[2]
        if result[1]:  # 0: the trainer measured nothing (an attempt that began at its last transition)
            found["transitions_per_s"] = result[1]
    config = m.pair_config(pair)
    diagnostics = con.execute(  # from_transition: where the row's attempt began, with an empty replay
        "SELECT d.transition, d.epsilon, d.replay_frames, d.loss, d.q_mean, d.target_mean, d.td_abs_mean, d.td_abs_max, "
        "d.grad_norm, a.from_transition FROM train_diagnostics_valid d JOIN train_attempts a "
        f"USING (run_id, measurement, trial, training_seed, attempt) WHERE {where} ORDER BY d.transition",
        args).fetchall()
    if diagnostics:
        import math

        last = diagnostics[-1]
        # the epsilon a diagnostics row reports was used on the step that reached its transition count
        slack = abs(config.epsilon_end - config.epsilon_start) * config.num_envs / config.epsilon_decay_transitions
        found["epsilon_schedule_error"] = max(
            max(0.0, abs(row[1] - config.epsilon(row[0])) - slack) for row in diagnostics)
        found["replay_fill_fraction"] = last[2] / min(config.replay_capacity, last[0] - last[9])
        found["non_finite_diagnostics"] = float(sum(
            1 for row in diagnostics for v in row[3:9] if v is None or not math.isfinite(v)))
    summary = con.execute(f"SELECT last20_mean, last20_median, last20_trend FROM train_trial_summary WHERE {where}",
                          args).fetchone()
    if summary:
        found.update({k: v for k, v in zip(("last20_mean", "last20_median", "last20_trend"), summary) if v is not None})
    score = con.execute(f"SELECT score FROM train_seed_scores WHERE {where}", args).fetchone()
    if score:
        found["score"] = score[0]
    return found


def _trial_metrics(con, run_id: str, m: TrainMeasurement, trial: str) -> tuple[dict[str, float], dict[str, list]]:
    """(the trial's figures over its training seeds, each per-seed figure by name)."""
    per_seed: dict[str, list] = {}
    for pair in m.pairs():
        if pair.trial == trial:
            for name, value in _pair_metrics(con, run_id, m, pair).items():
                per_seed.setdefault(name, []).append(value)
    seeds = len(m.training_seeds())
    found = {name: WORST_OVER_SEEDS[name](values) for name, values in per_seed.items()
             if name in WORST_OVER_SEEDS and len(values) == seeds}
    found.update({name: sum(values) / len(values) for name, values in per_seed.items() if name in LEARNING_METRICS})
    return found, per_seed


def metrics(con, run_id: str, m: TrainMeasurement, candidate: str, baseline: str | None) -> dict[str, float]:
    """A trial's health (its worst seed), its learning figures (means over seeds), its score over
    seeds with intervals, and against a baseline the differences of scores and the speed-up with
    their intervals over seeds. Fewer than MIN_SEEDS_FOR_INTERVAL seeds per arm: `inconclusive_reason`."""
    from breakout_core.stats import MIN_SEEDS_FOR_INTERVAL, seed_statistics

    found, mine = _trial_metrics(con, run_id, m, candidate)
    base_found, theirs = _trial_metrics(con, run_id, m, baseline) if baseline is not None else ({}, {})
    scores, rates = mine.get("score", []), mine.get("transitions_per_s", [])
    if scores:
        found.update({f"score_{k}": v for k, v in seed_statistics(scores).items()})
    if baseline is not None:
        for name in LEARNING_METRICS[:3]:
            if name in found and name in base_found:
                found[f"{name}_diff"] = found[name] - base_found[name]
        if scores and theirs.get("score"):
            both = seed_statistics(scores, theirs["score"], comparisons=("mean_diff", "iqm_diff",
                                                                           "probability_of_improvement"))
            found.update({(k if k.startswith("probability") else f"score_{k}"): v for k, v in both.items()
                          if k.startswith(("mean_diff", "iqm_diff", "probability"))})
        base_rates = theirs.get("transitions_per_s", [])
        if rates and base_rates:
            both = seed_statistics(rates, base_rates, comparisons=("speedup",))
            found.update({f"transitions_per_s_{k}": v for k, v in both.items() if k.startswith("speedup")})
    seeds = len(m.training_seeds())
    if seeds < MIN_SEEDS_FOR_INTERVAL:
        found["inconclusive_reason"] = (
            (ONE_SEED if baseline is not None else "one training seed") if seeds == 1 else
            f"{seeds} training seeds per arm: an interval over seeds needs at least {MIN_SEEDS_FOR_INTERVAL}")
    return found


def report(con, run_id: str, m: TrainMeasurement) -> list[Section]:
    return training_sections(con, run_id, m.name)


def training_sections(con, run_id: str, measurement: str) -> list[Section]:
    """The report of one training measurement of a run, by name: also how another kind shows
    a stored training (the shipped agent's history)."""
    from runner.report_html import MAX_CHART_POINTS, altair, gif_figure, table_html

    alt = altair()

    summary = con.execute(
        "SELECT s.trial, s.training_seed, s.episodes, s.last_episode_transition, s.last20_mean, s.last20_median, "
        "s.last20_trend, s.best_return, r.transitions, r.updates, r.wall_s, r.transitions_per_s "
        "FROM train_trial_summary s LEFT JOIN (SELECT * FROM train_results QUALIFY row_number() OVER (PARTITION BY "
        "run_id, measurement, trial, training_seed ORDER BY attempt DESC) = 1) r "
        "USING (run_id, measurement, trial, training_seed) WHERE s.run_id = ? AND s.measurement = ? "
        "ORDER BY s.trial, s.training_seed", [run_id, measurement]).df()
    sections = [Section(f"{measurement}: trials by training seed (training returns of the last 20 episodes; "
                        "trend = mean of last 10 − mean of the 10 before)", html=table_html(summary))]
    sections += _score_sections(con, run_id, measurement)
    curve = con.execute(
        "SELECT trial || ' · seed ' || training_seed AS run, trial, transition, episode_return, moving_avg_20 "
        "FROM train_curve WHERE run_id = ? AND measurement = ? ORDER BY trial, training_seed, transition",
        [run_id, measurement]).df()
    if not curve.empty:
        if len(curve) > MAX_CHART_POINTS:
            curve = curve.iloc[:: len(curve) // MAX_CHART_POINTS + 1]
        base = alt.Chart(curve).encode(x=alt.X("transition:Q", title="transitions"), color="run:N")
        chart = base.mark_circle(size=12, opacity=0.25).encode(y=alt.Y("episode_return:Q", title="raw episode return")) + \
            base.mark_line(strokeWidth=2).encode(y="moving_avg_20:Q")
        sections.append(Section(f"{measurement}: learning curves (points: episodes; lines: 20-episode moving average)",
                                charts=[chart.properties(width=720, height=320).to_dict()]))
    diagnostics = con.execute(
        "SELECT trial || ' · seed ' || training_seed AS run, transition, loss, q_mean, target_mean, td_abs_mean, "
        "td_abs_max, grad_norm, epsilon FROM train_diagnostics_valid WHERE run_id = ? AND measurement = ? "
        "ORDER BY trial, training_seed, transition", [run_id, measurement]).df()
    if not diagnostics.empty:
        long = diagnostics.melt(id_vars=["run", "transition"], var_name="quantity", value_name="value")
        chart = alt.Chart(long).mark_line().encode(
            x=alt.X("transition:Q", title="transitions"), y=alt.Y("value:Q", title=None), color="run:N"
        ).properties(width=330, height=140).facet(facet="quantity:N", columns=2).resolve_scale(y="independent")
        sections.append(Section(f"{measurement}: diagnostics over time", charts=[chart.to_dict()]))
    evaluated = con.execute(
        "SELECT policy AS checkpoint, episodes, distinct_scores, distinct_lengths, mean, median, std, p10, p90, min, max, "
        "time_limit_episodes FROM episode_summary WHERE run_id = ? AND measurement = ? "
        "ORDER BY split_part(policy, '@', 1), TRY_CAST(split_part(policy, '@', 2) AS BIGINT)",  # 25K before 100K
        [run_id, measurement]).df()
    if not evaluated.empty:
        sections.append(Section(f"{measurement}: checkpoints evaluated on fixed seeds (raw score, full games)",
                                html=table_html(evaluated)))
    gifs = con.execute("SELECT label, path FROM artifacts WHERE run_id = ? AND measurement = ? ORDER BY path",
                       [run_id, measurement]).fetchall()
    if gifs:
        sections.append(Section(f"{measurement}: checkpoints playing one fixed seed at epsilon 0 (what the agent sees)",
                                html="".join(gif_figure(label, path) for label, path in gifs)))
    return sections


def _score_sections(con, run_id: str, measurement: str) -> list[Section]:
    """Each pair's greedy score, and each trial's mean and IQM over training seeds with 95% CIs."""
    from breakout_core.stats import MIN_SEEDS_FOR_INTERVAL, seed_statistics
    from runner.report_html import table_html

    per_seed = con.execute(
        "SELECT trial, training_seed, transition, episodes, score, distinct_scores, distinct_lengths, time_limit_episodes "
        "FROM train_seed_scores WHERE run_id = ? AND measurement = ? ORDER BY trial, training_seed",
        [run_id, measurement]).df()
    if per_seed.empty:
        return []
    rows = []
    for trial, group in per_seed.groupby("trial", sort=False):
        stats = seed_statistics(group["score"].to_numpy())
        rows.append({"trial": trial, "training_seeds": len(group), **{k: round(v, 3) for k, v in stats.items()}})
    import pandas as pd

    return [Section(f"{measurement}: score of each training seed (its final checkpoint, greedy, mean raw score "
                    "over the score seeds)", html=table_html(per_seed)),
            Section(f"{measurement}: scores over training seeds (mean and IQM with 95% t intervals over "
                    f"seeds, the IQM's on the winsorized variance; no interval from fewer than "
                    f"{MIN_SEEDS_FOR_INTERVAL} seeds)", html=table_html(pd.DataFrame(rows)))]


KIND = Kind(
    name="train",
    model=TrainMeasurement,
    migrations=MIGRATIONS,
    views=VIEWS,
    execute=execute,
    participants=participants,
    metric_names=METRIC_NAMES,
    metrics=metrics,
    report=report,
    needs_baseline=False,
    comparison_metrics=COMPARISON_METRICS + RAW_COMPARISONS,
    metric_problem=TrainMeasurement.metric_problem,
    resume_problem=pairs_not_made,
)
