"""`train`: DQN-family training trials; every episode, diagnostics row and checkpoint stored.

A sweep lists values for any training field; each combination is a trial with its own
rows. `runner run SPEC --resume` continues the spec's last unfinished run: each trial
goes on from its last checkpoint (its replay refilled first), and rows the killed
attempt wrote past that checkpoint are superseded in the *_valid views.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from runner.kinds.base import Kind, RunContext, Section
from runner.spec_base import MAX_SEED, Name, Seeds, StrictModel, seed_list
from runner.sweeps import expand_sweep

FLUSH_EVERY_S = 5.0  # seconds between appends while training: readers get the file in between


class TrainSettings(StrictModel):
    """Training fields; units are transitions (one env step of one env) unless named."""

    algorithm: Literal["dqn", "double", "dueling"] = "dqn"
    total_transitions: int = Field(default=100_000, gt=0)
    num_envs: int = Field(default=1, ge=1, le=64)
    learning_rate: float = Field(default=1e-4, gt=0, lt=1)
    batch_size: int = Field(default=32, ge=1, le=4096)
    gamma: float = Field(default=0.99, gt=0, le=1)
    replay_capacity: int = Field(default=100_000, ge=1_000)
    replay_device: str = Field(default="numpy", pattern=r"^(numpy|cpu|cuda(:\d+)?)$")
    learning_starts: int = Field(default=1_000, ge=0)
    train_every: int = Field(default=4, ge=1)
    target_sync_every: int = Field(default=1_000, ge=1)
    epsilon_start: float = Field(default=1.0, ge=0, le=1)
    epsilon_end: float = Field(default=0.05, ge=0, le=1)
    epsilon_decay_transitions: int = Field(default=10_000, ge=1)
    max_grad_norm: float = Field(default=10.0, gt=0)
    life_loss_terminal: bool = True
    seed: int = Field(default=42, ge=0, le=2**32 - 1, description="a 32-bit seed: envs, exploration, weights")
    torch_threads: int | None = Field(default=None, ge=1, le=256)
    channels_last: bool = False
    fused_adam: bool = True
    diagnostics_every: int = Field(default=1_000, ge=1)
    measure_from: int = Field(default=0, ge=0, description="warm-up transitions before the throughput clock starts")
    checkpoint_at: list[int] = Field(default_factory=list)
    checkpoint_every: int | None = Field(default=None, gt=0, description="also checkpoint at every multiple")
    learner_device: str = Field(default="cpu", pattern=r"^(cpu|cuda(:\d+)?)$")

    @field_validator("checkpoint_at")
    @classmethod
    def _positive_sorted(cls, marks: list[int]) -> list[int]:
        if any(m <= 0 for m in marks):
            raise ValueError("checkpoint transitions must be > 0")
        return sorted(set(marks))

    @model_validator(mode="after")
    def _consistent(self) -> "TrainSettings":
        from breakout_core.replay import replay_bytes

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

    def to_config(self):
        from breakout_core.trainer import TrainConfig

        values = self.model_dump()
        every = values.pop("checkpoint_every")
        marks = set(values["checkpoint_at"])
        if every:
            marks |= set(range(every, self.total_transitions + 1, every))
        values["checkpoint_at"] = tuple(sorted(marks))
        return TrainConfig(**values)


SWEEPABLE = tuple(TrainSettings.model_fields)


class CheckpointEvaluation(StrictModel):
    """Evaluate every checkpoint of each trial on fixed seeds (rows in `episodes`, policy 'trial@transition')."""

    seeds: Seeds
    epsilon: float = Field(default=0.0, ge=0.0, le=1.0)
    batch_size: int = Field(default=4, ge=1, le=256)


class GifStrip(StrictModel):
    """One GIF per listed transition count: that checkpoint playing one fixed seed at epsilon 0."""

    seed: int = Field(ge=0, le=MAX_SEED)
    at: list[int] = Field(min_length=1)


class TrainMeasurement(TrainSettings):
    kind: Literal["train"]
    name: Name
    sweep: dict[str, list[Any]] = Field(default_factory=dict, description="field -> values; one trial per combination")
    evaluate_checkpoints: CheckpointEvaluation | None = None
    gif: GifStrip | None = None

    @model_validator(mode="after")
    def _sweep_valid(self) -> "TrainMeasurement":
        for key, values in self.sweep.items():
            if key not in SWEEPABLE:
                raise ValueError(f"sweep key {key!r} is not a training field; fields: {', '.join(SWEEPABLE)}")
            if not values:
                raise ValueError(f"sweep {key!r} lists no values")
        for trial in expand_sweep(self.sweep):
            self.settings_for(trial.overrides)
        return self

    def settings_for(self, overrides: dict[str, Any]) -> TrainSettings:
        base = self.model_dump(include=set(TrainSettings.model_fields))
        if self.gif is not None:  # every GIF needs its checkpoint
            base["checkpoint_at"] = sorted(set(base["checkpoint_at"]) | set(self.gif.at))
        return TrainSettings.model_validate({**base, **overrides})


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
]

_SUPERSEDED = """
    NOT EXISTS (SELECT 1 FROM train_attempts a
                WHERE a.run_id = t.run_id AND a.measurement = t.measurement AND a.trial = t.trial
                  AND a.attempt > t.attempt AND t.transition > a.from_transition)
"""

VIEWS = [
    f"CREATE OR REPLACE VIEW train_episodes_valid AS SELECT t.* FROM train_episodes t WHERE {_SUPERSEDED}",
    f"CREATE OR REPLACE VIEW train_diagnostics_valid AS SELECT t.* FROM train_diagnostics t WHERE {_SUPERSEDED}",
    # a resumed attempt writes again the checkpoint file it resumed from when that was the last one (final.pt)
    f"""CREATE OR REPLACE VIEW train_checkpoints_valid AS SELECT t.* FROM train_checkpoints t WHERE {_SUPERSEDED}
        QUALIFY row_number() OVER (PARTITION BY run_id, measurement, trial, transition, path ORDER BY attempt DESC) = 1""",
    """
    CREATE OR REPLACE VIEW train_curve AS
    SELECT *, avg(episode_return) OVER (
               PARTITION BY run_id, measurement, trial ORDER BY transition, env_index
               ROWS BETWEEN 19 PRECEDING AND CURRENT ROW) AS moving_avg_20
    FROM train_episodes_valid
    """,
    """
    CREATE OR REPLACE VIEW train_trial_summary AS
    WITH ranked AS (
        SELECT *, row_number() OVER (PARTITION BY run_id, measurement, trial
                                     ORDER BY transition DESC, env_index DESC) AS back
        FROM train_episodes_valid)
    SELECT run_id, measurement, trial, count(*) AS episodes, max(transition) AS last_episode_transition,
           avg(episode_return) FILTER (WHERE back <= 20) AS last20_mean,
           median(episode_return) FILTER (WHERE back <= 20) AS last20_median,
           avg(episode_return) FILTER (WHERE back <= 10) - avg(episode_return) FILTER (WHERE back BETWEEN 11 AND 20)
               AS last20_trend,
           max(episode_return) AS best_return
    FROM ranked GROUP BY run_id, measurement, trial
    """,
]


def _previous_attempts(ctx: RunContext, measurement: str, trial: str) -> tuple[int, bool]:
    """(attempts so far, whether one of them finished) for this trial of this run."""
    with ctx.store.reader() as con:
        attempts = con.execute(
            "SELECT count(*) FROM train_attempts WHERE run_id = ? AND measurement = ? AND trial = ?",
            [ctx.run_id, measurement, trial]).fetchone()[0]
        finished = con.execute(
            "SELECT count(*) FROM train_results WHERE run_id = ? AND measurement = ? AND trial = ?",
            [ctx.run_id, measurement, trial]).fetchone()[0]
    return attempts, finished > 0


def execute(m: TrainMeasurement, ctx: RunContext) -> None:
    from breakout_core.trainer import CheckpointSaved, Diagnostics, EpisodeEnd, Trainer, TrainDone

    from runner.row_buffer import RowBuffer
    from runner.store import utcnow

    for trial in expand_sweep(m.sweep):
        settings = m.settings_for(trial.overrides)
        config = settings.to_config()
        out_dir = ctx.artifacts_dir / m.name / trial.name
        attempt, finished = _previous_attempts(ctx, m.name, trial.name)
        if finished:  # resumed: a run killed while evaluating its checkpoints does what is left
            _after_training(m, ctx, trial.name)
            continue
        trainer = Trainer(config, ctx.contract, out_dir)
        resume = attempt > 0 and trainer.state_path().exists()
        from_transition = _state_transitions(trainer) if resume else 0
        ctx.store.append_rows("train_attempts", [{
            "run_id": ctx.run_id, "measurement": m.name, "trial": trial.name, "attempt": attempt,
            "from_transition": from_transition, "config": json.dumps(asdict(config)), "out_dir": str(out_dir),
            "started_at": utcnow()}])
        key = {"run_id": ctx.run_id, "measurement": m.name, "trial": trial.name, "attempt": attempt}
        rows = RowBuffer(ctx.store, ctx.run_id, ctx.progress.console.log)
        task = ctx.progress.add_task(f"{m.name} · {trial.name}", total=config.total_transitions,
                                     completed=from_transition, unit="transitions")
        last_flush = time.monotonic()
        try:
            for record in trainer.run(resume=resume):
                if isinstance(record, EpisodeEnd):
                    rows.add("train_episodes", {**key, **asdict(record)})
                    ctx.progress.update(task, completed=record.transition, transitions=record.transition)
                elif isinstance(record, Diagnostics):
                    rows.add("train_diagnostics", {**key, **asdict(record)})
                elif isinstance(record, CheckpointSaved):
                    rows.add("train_checkpoints", {**key, **asdict(record)})
                    # the trainer saves its state when it gets control back: what that state
                    # covers is stored (or spooled) first, so a resume never starts past lost rows
                    rows.flush(durable=True)
                    last_flush = time.monotonic()
                    _log_checkpoint(ctx, m.name, trial.name, record)
                elif isinstance(record, TrainDone):
                    rows.add("train_results", {**key, **asdict(record)})
                    ctx.progress.update(task, completed=record.transitions, transitions=record.transitions)
                if time.monotonic() - last_flush >= FLUSH_EVERY_S:
                    rows.flush()
                    last_flush = time.monotonic()
        finally:
            rows.close()
        _after_training(m, ctx, trial.name)


def _after_training(m: TrainMeasurement, ctx: RunContext, trial: str) -> None:
    """Evaluate the trial's checkpoints and record its GIF strip, from the checkpoints stored.
    What a killed run already stored (a checkpoint's episodes, a GIF) is not done again."""
    from breakout_core.evaluator import evaluate, write_gif
    from breakout_core.policies import QNetworkPolicy

    from runner.kinds.evaluate import episode_row, gif_row

    with ctx.store.reader() as con:
        checkpoints = con.execute(  # one per transition count: a last mark and final.pt hold the same weights
            "SELECT transition, min(path) FROM train_checkpoints_valid WHERE run_id = ? AND measurement = ? AND trial = ? "
            "GROUP BY transition ORDER BY transition", [ctx.run_id, m.name, trial]).fetchall()
        evaluated = {row[0] for row in con.execute(
            "SELECT DISTINCT policy FROM episodes WHERE run_id = ? AND measurement = ?", [ctx.run_id, m.name]).fetchall()}
        recorded = {row[0] for row in con.execute(
            "SELECT path FROM artifacts WHERE run_id = ? AND measurement = ?", [ctx.run_id, m.name]).fetchall()}
    if m.evaluate_checkpoints is not None:
        spec = m.evaluate_checkpoints
        seeds = seed_list(spec.seeds)
        for transition, path in checkpoints:
            policy = f"{trial}@{transition}"
            if policy in evaluated:
                continue
            task = ctx.progress.add_task(f"{m.name} · evaluate {policy}", total=len(seeds), unit="episodes")
            result = evaluate(QNetworkPolicy.from_checkpoint(path, epsilon=spec.epsilon), seeds, ctx.contract,
                              batch_size=spec.batch_size, on_episode=lambda _e: ctx.progress.advance(task))
            ctx.store.append_rows("episodes", [episode_row(ctx, m.name, policy, e) for e in result.episodes])
            _log_evaluation(ctx, m.name, policy, result.episodes)
    if m.gif is not None:
        for transition, path in checkpoints:
            # zero-padded so the report, which lists GIFs by path, shows them in transition order
            gif_path = ctx.reports_dir / "gifs" / f"{ctx.run_id}-{m.name}-{trial}-{transition:09d}.gif"
            if transition not in m.gif.at or str(gif_path) in recorded:
                continue
            result = evaluate(QNetworkPolicy.from_checkpoint(path), [m.gif.seed], ctx.contract, batch_size=1,
                              record_seed=m.gif.seed)
            gif = write_gif(result.frames, gif_path)
            ctx.store.append_rows("artifacts", [gif_row(ctx, m.name, gif, f"{trial} @ {transition} transitions",
                                                        result.episodes[0], len(result.frames))])


def _log_checkpoint(ctx: RunContext, measurement: str, trial: str, record) -> None:
    """One plain line per checkpoint, readable in a log file where no progress bar draws."""
    with ctx.store.reader() as con:
        row = con.execute(
            "SELECT last20_mean, episodes FROM train_trial_summary WHERE run_id = ? AND measurement = ? AND trial = ?",
            [ctx.run_id, measurement, trial]).fetchone()
    mean = f"{row[0]:.2f} over the last 20 of {row[1]} episodes" if row and row[0] is not None else "no episode yet"
    ctx.progress.console.log(f"{measurement} · {trial}: checkpoint at {record.transition} transitions "
                             f"({record.path}); training return {mean}")


def _log_evaluation(ctx: RunContext, measurement: str, policy: str, episodes) -> None:
    """One plain line per evaluated checkpoint: an evaluation of slow checkpoints (they stall to
    the time limit) can take many minutes, and a log file shows no progress bar."""
    import statistics

    scores = [e.score for e in episodes]
    stalled = sum(1 for e in episodes if e.ended_by == "time_limit")
    ctx.progress.console.log(f"{measurement} · evaluated {policy} on {len(scores)} seeds: mean score "
                             f"{statistics.fmean(scores):.2f}, median {statistics.median(scores):g}, "
                             f"{stalled} ended by the time limit")


def _state_transitions(trainer) -> int:
    import torch

    return int(torch.load(trainer.state_path(), map_location="cpu", weights_only=True)["transitions"])


HEALTH_METRICS = ("finished", "weights_moved", "replay_fill_fraction", "epsilon_schedule_error",
                  "non_finite_diagnostics")
LEARNING_METRICS = ("last20_mean", "last20_median", "last20_trend", "transitions_per_s")
COMPARISON_METRICS = tuple(f"{name}_diff" for name in LEARNING_METRICS) + ("transitions_per_s_speedup",)
METRIC_NAMES = HEALTH_METRICS + LEARNING_METRICS + COMPARISON_METRICS


def participants(m: TrainMeasurement) -> list[str]:
    return [t.name for t in expand_sweep(m.sweep)]


def _trial_metrics(con, run_id: str, m: TrainMeasurement, trial: str) -> dict[str, float]:
    """Day 13's health checks and Day 14's learning figures for one trial."""
    found: dict[str, float] = {}
    result = con.execute(
        "SELECT transitions, transitions_per_s, weights_moved FROM train_results WHERE run_id = ? AND measurement = ? "
        "AND trial = ? ORDER BY attempt DESC LIMIT 1", [run_id, m.name, trial]).fetchone()
    found["finished"] = 1.0 if result else 0.0
    if result:
        found["transitions_per_s"], found["weights_moved"] = result[1], result[2]
    config = {t.name: m.settings_for(t.overrides) for t in expand_sweep(m.sweep)}[trial].to_config()
    diagnostics = con.execute(  # from_transition: where the row's attempt began, with an empty replay
        "SELECT d.transition, d.epsilon, d.replay_frames, d.loss, d.q_mean, d.target_mean, d.td_abs_mean, d.td_abs_max, "
        "d.grad_norm, a.from_transition FROM train_diagnostics_valid d JOIN train_attempts a "
        "USING (run_id, measurement, trial, attempt) WHERE run_id = ? AND measurement = ? AND trial = ? "
        "ORDER BY d.transition", [run_id, m.name, trial]).fetchall()
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
    summary = con.execute(
        "SELECT last20_mean, last20_median, last20_trend FROM train_trial_summary WHERE run_id = ? AND measurement = ? "
        "AND trial = ?", [run_id, m.name, trial]).fetchone()
    if summary:
        found.update({k: v for k, v in zip(("last20_mean", "last20_median", "last20_trend"), summary) if v is not None})
    return found


def metrics(con, run_id: str, m: TrainMeasurement, candidate: str, baseline: str | None) -> dict[str, float]:
    found = _trial_metrics(con, run_id, m, candidate)
    if baseline is not None:
        other = _trial_metrics(con, run_id, m, baseline)
        for name in LEARNING_METRICS:
            if name in found and name in other:
                found[f"{name}_diff"] = found[name] - other[name]
        # a rate of 0 is the trainer's "nothing measured": no speed-up then, so the verdict is unavailable
        if found.get("transitions_per_s") and other.get("transitions_per_s"):
            found["transitions_per_s_speedup"] = found["transitions_per_s"] / other["transitions_per_s"]
    return found


def report(con, run_id: str, m: TrainMeasurement) -> list[Section]:
    from runner.report_html import MAX_CHART_POINTS, altair, gif_figure, table_html

    alt = altair()

    summary = con.execute(
        "SELECT s.trial, s.episodes, s.last_episode_transition, s.last20_mean, s.last20_median, s.last20_trend, "
        "s.best_return, r.transitions, r.updates, r.wall_s, r.transitions_per_s FROM train_trial_summary s "
        "LEFT JOIN train_results r USING (run_id, measurement, trial) WHERE s.run_id = ? AND s.measurement = ? "
        "ORDER BY s.trial", [run_id, m.name]).df()
    sections = [Section(f"{m.name}: trials (last 20 episodes; trend = mean of last 10 − mean of the 10 before)",
                        html=table_html(summary))]
    curve = con.execute(
        "SELECT trial, transition, episode_return, moving_avg_20 FROM train_curve WHERE run_id = ? AND measurement = ? "
        "ORDER BY trial, transition", [run_id, m.name]).df()
    if not curve.empty:
        if len(curve) > MAX_CHART_POINTS:
            curve = curve.iloc[:: len(curve) // MAX_CHART_POINTS + 1]
        base = alt.Chart(curve).encode(x=alt.X("transition:Q", title="transitions"), color="trial:N")
        chart = base.mark_circle(size=12, opacity=0.25).encode(y=alt.Y("episode_return:Q", title="raw episode return")) + \
            base.mark_line(strokeWidth=2).encode(y="moving_avg_20:Q")
        sections.append(Section(f"{m.name}: learning curves (points: episodes; lines: 20-episode moving average)",
                                charts=[chart.properties(width=720, height=320).to_dict()]))
    diagnostics = con.execute(
        "SELECT trial, transition, loss, q_mean, target_mean, td_abs_mean, td_abs_max, grad_norm, epsilon "
        "FROM train_diagnostics_valid WHERE run_id = ? AND measurement = ? ORDER BY trial, transition",
        [run_id, m.name]).df()
    if not diagnostics.empty:
        long = diagnostics.melt(id_vars=["trial", "transition"], var_name="quantity", value_name="value")
        chart = alt.Chart(long).mark_line().encode(
            x=alt.X("transition:Q", title="transitions"), y=alt.Y("value:Q", title=None), color="trial:N"
        ).properties(width=330, height=140).facet(facet="quantity:N", columns=2).resolve_scale(y="independent")
        sections.append(Section(f"{m.name}: diagnostics over time", charts=[chart.to_dict()]))
    evaluated = con.execute(
        "SELECT policy AS checkpoint, episodes, distinct_scores, distinct_lengths, mean, median, std, p10, p90, min, max, "
        "time_limit_episodes FROM episode_summary WHERE run_id = ? AND measurement = ? "
        "ORDER BY split_part(policy, '@', 1), TRY_CAST(split_part(policy, '@', 2) AS BIGINT)",  # 25K before 100K
        [run_id, m.name]).df()
    if not evaluated.empty:
        sections.append(Section(f"{m.name}: checkpoints evaluated on fixed seeds (raw score, full games)",
                                html=table_html(evaluated)))
    gifs = con.execute("SELECT label, path FROM artifacts WHERE run_id = ? AND measurement = ? ORDER BY path",
                       [run_id, m.name]).fetchall()
    if gifs:
        sections.append(Section(f"{m.name}: checkpoints playing one fixed seed at epsilon 0 (what the agent sees)",
                                html="".join(gif_figure(label, path) for label, path in gifs)))
    return sections


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
    comparison_metrics=COMPARISON_METRICS,
)
