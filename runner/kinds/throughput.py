"""`throughput`: transitions per second of the training pipeline for a sweep of settings.

Each sweep point runs in each listed mode, from a fresh random initialisation, `repeats`
times, interleaved (every point and mode once, then again), so a drift of the machine
falls on all of them alike:
  full     acting, stepping, replay insertion and learning (the trainer as it trains)
  collect  the same with no learning (learning_starts beyond the end)
  explore  collect with epsilon held at 1: stepping, replay insertion and bookkeeping with no
           network forward, so collect vs explore vs env splits acting cost from loop cost
  learner  bare gradient steps on a replay of random frames; reported as the learner-bound
           limit train_every x updates/s
  env      the vector env alone, random actions
The first `warmup_transitions` of full/collect/explore trials are excluded from the clock.
View `throughput_ratios` sets full against its learner bound, collect and explore against env
(means over repeats). A verdict judges a ratio of two rates timed in the same repeat (a speed-up
of one sweep point over a baseline point, or one point's full rate over its learner bound):
its geometric mean over the repeats with a 95% t interval; with fewer than three repeats it is
inconclusive.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from runner.compare.rows import Row, RunSide, over_seeds, samples_row
from runner.kinds.kind import Kind
from runner.kinds.shared.training_settings import (
    SweptSettings,
    TrainSettings,
    swept_at,
    training_sweep_trials,
    trial_lengths,
    where_swept,
)
from runner.report.section import Section
from runner.run.context import RunContext
from runner.spec.fields import Name
from runner.spec.sweeps import expand_sweep
from runner.spec.yaml_source import PlacedError, raise_placed

Mode = Literal["full", "collect", "explore", "learner", "env"]


class ThroughputMeasurement(SweptSettings):
    kind: Literal["throughput"]
    name: Name
    modes: list[Mode] = Field(default_factory=lambda: ["full"], min_length=1)
    repeats: int = Field(default=1, ge=1, le=20, description="timings of each setting and mode, interleaved; "
                                                             "a speed-up interval needs at least 3")
    warmup_transitions: int = Field(default=1_000, ge=0)
    learner_updates: int = Field(default=60, ge=10)
    env_steps: int = Field(default=2_000, ge=100, description="vector steps for the env mode")

    @model_validator(mode="before")
    @classmethod
    def _old_spelling(cls, data: Any) -> Any:
        if isinstance(data, dict) and "grid" in data:
            raise ValueError("`grid:` is now spelled `sweep:`, as in every kind")
        return data

    @model_validator(mode="after")
    def _sweep_valid(self) -> "ThroughputMeasurement":
        _, problems = training_sweep_trials(self.sweep, self.settings_for)
        for trial, total in trial_lengths(self.sweep, self.total_transitions):  # valid trials or not
            if self.warmup_transitions >= total:
                problems.append(PlacedError(
                    f"warmup_transitions {self.warmup_transitions} must be below total_transitions {total}"
                    f"{where_swept(trial, 'total_transitions')}",
                    ("warmup_transitions",) if "total_transitions" not in trial.overrides else
                    swept_at(self.sweep, "total_transitions", total)))
        raise_placed(problems)
        return self

    def settings_for(self, overrides: dict[str, Any]) -> TrainSettings:
        base = self.model_dump(include=set(TrainSettings.model_fields))
        return TrainSettings.model_validate({**base, **overrides})

    def metric_problem(self, metric: str) -> str | None:
        if metric in RAW_RATIOS:
            return f"{metric} is one ratio of single timings: judge its interval over repeats, {metric}_ci_low"
        needed = {"full", "learner"} if metric.startswith(BOUND_RATIO) else {metric.split("_", 1)[0]}
        if missing := sorted(needed - set(self.modes)):
            return f"{metric} needs mode {' and '.join(missing)} in this measurement's modes"
        return None


MIGRATIONS = [
    (
        "0300_throughput",
        """
        CREATE TABLE throughput_trials (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, trial VARCHAR NOT NULL, mode VARCHAR NOT NULL,
            settings JSON NOT NULL, warmup_transitions BIGINT NOT NULL, measured_transitions BIGINT,
            measured_s DOUBLE, updates BIGINT, transitions_per_s DOUBLE NOT NULL
        )
        """,
    ),
    (
        "0301_throughput_repeats",  # rows stored before were each setting's one timing
        """
        ALTER TABLE throughput_trials ADD COLUMN "repeat" INTEGER;
        UPDATE throughput_trials SET "repeat" = 0;
        """,
    ),
]

_MEAN_RATES = """(SELECT run_id, measurement, trial, mode, avg(transitions_per_s) AS transitions_per_s
                   FROM throughput_trials GROUP BY run_id, measurement, trial, mode)"""

VIEWS = [
    f"""
    CREATE OR REPLACE VIEW throughput_ratios AS
    WITH r AS {_MEAN_RATES}
    SELECT t.run_id, t.measurement, t.trial,
           f.transitions_per_s AS full_tps, l.transitions_per_s AS learner_bound_tps,
           f.transitions_per_s / l.transitions_per_s AS full_over_learner_bound,
           c.transitions_per_s AS collect_tps, e.transitions_per_s AS env_tps,
           c.transitions_per_s / e.transitions_per_s AS collect_over_env,
           x.transitions_per_s AS explore_tps, x.transitions_per_s / e.transitions_per_s AS explore_over_env
    FROM (SELECT DISTINCT run_id, measurement, trial FROM throughput_trials) t
    """ + "".join(f"""
    LEFT JOIN r {alias} ON {alias}.run_id = t.run_id AND {alias}.measurement = t.measurement AND {alias}.trial = t.trial
                        AND {alias}.mode = '{mode}'"""
        for alias, mode in (("f", "full"), ("l", "learner"), ("c", "collect"), ("e", "env"), ("x", "explore"))),
]


def _run_trainer(config, ctx: RunContext, task) -> dict:
    from breakout_core.learning.trainer import TrainDone, Trainer

    with tempfile.TemporaryDirectory(prefix="throughput-") as out_dir:  # checkpoints of a timing trial are not kept
        for record in Trainer(config, ctx.contract, out_dir).run():
            if isinstance(record, TrainDone):
                ctx.progress.update(task, completed=record.transitions, transitions=record.transitions)
                return {"measured_transitions": record.measured_transitions, "measured_s": record.measured_s,
                        "updates": record.updates, "transitions_per_s": record.transitions_per_s}
    raise RuntimeError("the trainer ended without its summary record")


def execute(m: ThroughputMeasurement, ctx: RunContext) -> None:
    for repeat in range(m.repeats):
        for trial in expand_sweep(m.sweep):
            for mode in m.modes:
                if not ctx.already_stored("throughput_trials", m.name, trial=trial.name, mode=mode, repeat=repeat):
                    _time_one(m, ctx, trial, mode, repeat)


def _time_one(m: ThroughputMeasurement, ctx: RunContext, trial, mode: str, repeat: int) -> None:
    from breakout_core.game.driver import bare_stepping_rate
    from breakout_core.learning.trainer import learner_rate

    settings = m.settings_for(trial.overrides)
    suffix = f" · repeat {repeat + 1}/{m.repeats}" if m.repeats > 1 else ""
    task = ctx.progress.add_task(f"{m.name} · {mode} · {trial.name}{suffix}", total=settings.total_transitions,
                                 unit="transitions")
    config = settings.to_config()
    row = {"measured_transitions": None, "measured_s": None, "updates": None}
    if mode in ("full", "collect", "explore"):
        changes = {"measure_from": m.warmup_transitions, "checkpoint_at": ()}
        if mode in ("collect", "explore"):
            changes["learning_starts"] = settings.total_transitions + 1
        if mode == "explore":
            changes.update(epsilon_start=1.0, epsilon_end=1.0)
        row.update(_run_trainer(config.__class__(**{**asdict(config), **changes}), ctx, task))
    elif mode == "learner":
        row["transitions_per_s"] = settings.train_every * learner_rate(config, ctx.contract, updates=m.learner_updates)
        row["updates"] = m.learner_updates
    else:
        row["transitions_per_s"] = bare_stepping_rate(ctx.contract, settings.num_envs, m.env_steps)
        row["measured_transitions"] = m.env_steps * settings.num_envs
    ctx.progress.update(task, completed=settings.total_transitions)
    ctx.store.append_rows("throughput_trials", [{
        "run_id": ctx.run_id, "measurement": m.name, "trial": trial.name, "mode": mode, "repeat": repeat,
        "settings": json.dumps(settings.model_dump()), "warmup_transitions": m.warmup_transitions, **row}])


SPEEDUP_MODES = ("full", "collect")
RAW_SPEEDUPS = tuple(f"{mode}_speedup" for mode in SPEEDUP_MODES)
BOUND_RATIO = "full_over_learner_bound"  # one setting's full rate over its learner bound
RAW_RATIOS = RAW_SPEEDUPS + (BOUND_RATIO,)
METRIC_NAMES = RAW_RATIOS + tuple(f"{name}{bound}" for name in RAW_RATIOS for bound in ("_ci_low", "_ci_high"))


def participants(m: ThroughputMeasurement) -> list[str]:
    return [t.name for t in expand_sweep(m.sweep)]


def metrics(con, run_id: str, m: ThroughputMeasurement, candidate: str, baseline: str | None) -> dict[str, float]:
    """The candidate sweep point's full rate over its learner bound and, given a baseline,
    speed-ups over that point (e.g. N=2 over N=1): each the geometric mean of the ratios
    within a repeat (the two rates were timed side by side), with a 95% t interval over the
    repeats (breakout_core.statistics.stats.paired_ratio_interval)."""
    from breakout_core.statistics.stats import MIN_SEEDS_FOR_INTERVAL, geometric_mean_ratio, paired_ratio_interval

    rates: dict[tuple[str, str], dict[int, float]] = {}
    for trial, mode, repeat, rate in con.execute(
            "SELECT trial, mode, \"repeat\", transitions_per_s FROM throughput_trials WHERE run_id = ? "
            "AND measurement = ? AND trial IN (?, ?)", [run_id, m.name, candidate, baseline]).fetchall():
        rates.setdefault((trial, mode), {})[repeat] = rate
    ratios = [(BOUND_RATIO, rates.get((candidate, "full"), {}), rates.get((candidate, "learner"), {}))]
    if baseline is not None:
        ratios += [(f"{mode}_speedup", rates.get((candidate, mode), {}), rates.get((baseline, mode), {}))
                   for mode in SPEEDUP_MODES]
    found: dict = {}
    for name, over, under in ratios:
        repeats = sorted(r for r in over.keys() & under.keys() if under[r] > 0)
        if not repeats:
            continue
        x, y = [over[r] for r in repeats], [under[r] for r in repeats]
        found[name] = geometric_mean_ratio(x, y)
        if len(repeats) >= MIN_SEEDS_FOR_INTERVAL:
            found[f"{name}_ci_low"], found[f"{name}_ci_high"] = paired_ratio_interval(x, y)
    if m.repeats < MIN_SEEDS_FOR_INTERVAL:
        found["inconclusive_reason"] = ("one timing per setting: no interval over repeated measurements"
                                        if m.repeats == 1 else
                                        f"{m.repeats} timings per setting: an interval needs at least "
                                        f"{MIN_SEEDS_FOR_INTERVAL} (`repeats:`)")
    return found


def report(con, run_id: str, m: ThroughputMeasurement) -> list[Section]:
    from runner.report.html import altair, table_html

    alt = altair()
    trials = con.execute(
        "SELECT trial, mode, \"repeat\", transitions_per_s, measured_transitions, measured_s, updates "
        "FROM throughput_trials WHERE run_id = ? AND measurement = ? ORDER BY trial, mode, \"repeat\"",
        [run_id, m.name]).df()
    ratios = con.execute(
        "SELECT trial, full_tps, learner_bound_tps, full_over_learner_bound, collect_tps, explore_tps, env_tps, "
        "collect_over_env, explore_over_env "
        "FROM throughput_ratios WHERE run_id = ? AND measurement = ? ORDER BY trial", [run_id, m.name]).df()
    sections = [Section(f"{m.name}: transitions/s by setting and mode (warm-up of {m.warmup_transitions} "
                        f"transitions excluded from full/collect/explore)", html=table_html(trials))]
    if not trials.empty:
        chart = alt.Chart(trials).mark_bar().encode(
            x=alt.X("transitions_per_s:Q", title="transitions / s"), y=alt.Y("trial:N", title=None),
            color="mode:N", yOffset="mode:N", tooltip=["trial", "mode", "transitions_per_s"])
        sections.append(Section(f"{m.name}: throughput", charts=[chart.properties(width=640).to_dict()]))
    sections.append(Section(f"{m.name}: ratios (full vs learner bound = {m.train_every} × bare updates/s; "
                            f"collect, acting at epsilon {m.epsilon_start:g} -> {m.epsilon_end:g} over "
                            f"{m.epsilon_decay_transitions} transitions, and explore, epsilon 1 with no forward pass, "
                            "vs the bare vector env)", html=table_html(ratios)))
    return sections


# -- runner compare ---------------------------------------------------------------------------

def compare_throughput(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    name = m_a["name"]
    values = {label: {(t, mode): np.asarray(v, dtype=np.float64) for t, mode, v in con.execute(
        "SELECT trial, mode, list(transitions_per_s) FROM throughput_trials WHERE run_id = ? AND measurement = ? "
        "GROUP BY ALL", [side.run_id, name]).fetchall()} for label, side in (("A", a), ("B", b))}
    rows = []
    for trial, mode in sorted(set(values["A"]) | set(values["B"])):
        va, vb = values["A"].get((trial, mode), np.empty(0)), values["B"].get((trial, mode), np.empty(0))
        rows.append(samples_row(name, f"{trial} / {mode}", "transitions_per_s", va, vb, lower_is_better=False,
                                 machine_bound=True))
    for mode in sorted({mode for side in values.values() for _, mode in side}):
        per_trial = [{t: float(v.mean()) for (t, m), v in values[label].items() if m == mode} for label in "AB"]
        rows += over_seeds(name, "transitions_per_s", *per_trial, lower_is_better=False, machine_bound=True,
                            suffix=f" / {mode}")
    return rows


KIND = Kind(
    name="throughput",
    model=ThroughputMeasurement,
    migrations=MIGRATIONS,
    views=VIEWS,
    execute=execute,
    participants=participants,
    metric_names=METRIC_NAMES,
    metrics=metrics,
    report=report,
    needs_baseline=False,
    comparison_metrics=tuple(name for name in METRIC_NAMES if name.startswith(RAW_SPEEDUPS)),
    metric_problem=ThroughputMeasurement.metric_problem,
    compare=compare_throughput,
    # grid: the spelling of specs stored before
    not_settings=frozenset({"sweep", "max_trials", "grid", "modes", "repeats"}),
)
