"""How a `train` measurement runs: its (trial, seed) trainings trained, scored and stored, and
what a `--resume` may go on with."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from breakout_core.common.hashing import file_sha256
from runner.kinds.train.model import TrainMeasurement
from runner.kinds.train.trainings import Training, TrainingJob
from runner.run.context import RunContext
from runner.spec.fields import seed_list

if TYPE_CHECKING:
    from runner.store.database import Store


class StoredTraining(NamedTuple):
    """What this run has stored of one training, read before it trains (again)."""

    attempts: int  # attempts so far
    finished: bool  # whether one of them finished
    out_dir: str | None  # the folder they trained in
    unscored: tuple[str, int] | None  # (final checkpoint, its transition) while its score is missing
    latest: tuple[str, int] | None  # (newest checkpoint whose file is still there, its transition)


def _stored(ctx: RunContext, measurement: str, training: Training) -> StoredTraining:
    """What this run has stored of one training."""
    where = "run_id = ? AND measurement = ? AND trial = ? AND training_seed = ?"
    args = [ctx.run_id, measurement, training.trial, training.training_seed]
    with ctx.store.reader() as con:
        attempts, out_dir = con.execute(f"SELECT count(*), arg_max(out_dir, attempt) FROM train_attempts WHERE {where}",
                                        args).fetchone()
        # newest first; at one transition the numbered checkpoint before final.pt (the same weights)
        checkpoints = con.execute(f"SELECT path, transition FROM train_checkpoints_valid WHERE {where} "
                                  "ORDER BY transition DESC, path", args).fetchall()
    stored = {"trial": training.trial, "training_seed": training.training_seed}
    finished = ctx.already_stored("train_results", measurement, **stored)
    scored = ctx.already_stored("train_scores", measurement, **stored)
    # the training's score is its final.pt's (at the last transition, after the numbered file), as a
    # training that was not stopped scores it
    final = max(checkpoints, key=lambda row: (row[1], row[0]), default=None)
    unscored = None if scored else final
    latest = next(((p, t) for p, t in checkpoints if Path(p).is_file()), None)
    return StoredTraining(attempts, finished, out_dir, unscored, latest)


def execute(m: TrainMeasurement, ctx: RunContext) -> None:
    from runner.kinds.train.executors import Executor, run_trainings, score_here

    executor = ctx.executor or Executor()
    # a Ray task runs its training whole in its worker's own folder: it cannot go on from a state
    # or a checkpoint here, which a worker on another node does not have
    on_ray = executor.name == "ray"
    jobs = []
    for training in m.trainings():
        stored = _stored(ctx, m.name, training)
        folder = ctx.artifacts_dir / m.name / training.trial
        # a training's folder: where its earlier attempts trained, so a resume finds its trainer state
        out_dir = (Path(stored.out_dir) if stored.out_dir else folder if m.seeds is None
                   else folder / f"seed={training.training_seed}")
        config = m.training_config(training)
        state = out_dir / "trainer_state.pt"
        if stored.attempts > 0 and state.exists() and not on_ray:
            mode, source, from_transition = "trainer_state", str(state), _saved_transitions(state)
        elif stored.attempts > 0 and stored.latest is not None and not on_ray:
            # its state is gone (a crash between its first checkpoint and the state after it, or the
            # state deleted): on from the training's own newest checkpoint rather than from the start
            mode, source, from_transition = "checkpoint", *stored.latest
        elif m.start_from is not None:
            mode, source, from_transition = "checkpoint", m.start_from, _saved_transitions(Path(m.start_from))
        else:
            mode, source, from_transition = "fresh", None, 0
        source_sha256 = file_sha256(source) if mode == "checkpoint" else None
        if mode == "checkpoint" and source == m.start_from:
            _refuse_changed_start(ctx, m.name, m.start_from, source_sha256)
        job = TrainingJob(run_id=ctx.run_id, measurement=m.name, training=training, config=config,
                          contract=ctx.contract, out_dir=str(out_dir), attempt=stored.attempts, resume_mode=mode,
                          resumed_from=source, resumed_from_sha256=source_sha256,
                          other_contract=ctx.spec.contract.other_contracts == "deliberate",
                          from_transition=from_transition,
                          score_seeds=tuple(seed_list(m.score_seeds)) if m.score_seeds is not None else (),
                          score_batch=m.score_batch)
        if not stored.finished:
            jobs.append(job)
            if mode == "checkpoint" and m.evaluate_checkpoints is not None:
                # the curve's first point: what the training starts from, on the same seeds
                ctx.store.append_rows("episodes", _checkpoint_episodes(m, ctx, training, from_transition, source))
        elif job.score_seeds and stored.unscored:  # a run killed while scoring its training does what is left
            score_here(job, ctx, *stored.unscored)
    # in this process each checkpoint is scored as it lands, so a training stopped before its end
    # has scored what it reached; Ray trainings are scored here once they are stored
    on_checkpoint = None if m.evaluate_checkpoints is None else (
        lambda training, transition, path: [("episodes", row)
                                        for row in _checkpoint_episodes(m, ctx, training, transition, path)])
    run_trainings(jobs, ctx, executor, on_checkpoint)
    for training in m.trainings():
        _after_training(m, ctx, training)


def trainings_not_made(m: TrainMeasurement, store: Store, run_id: str) -> str | None:
    """Why a run cannot be resumed when it holds (trial, training seed) trainings
    that the spec does not make (a sweep over seed stored while every trial trained the base
    seed): it would run its trainings again beside those rows, in the same folders, and mix two
    sets of agents in one run."""
    made = {(training.trial, training.training_seed) for training in m.trainings()}
    with store.reader() as con:
        stored = con.execute("SELECT DISTINCT trial, training_seed FROM train_attempts WHERE run_id = ? AND "
                             "measurement = ? ORDER BY ALL", [run_id, m.name]).fetchall()
    strangers = [f"{trial} with training seed {seed}" for trial, seed in stored if (trial, seed) not in made]
    if not strangers:
        return None
    return (f"measurement {m.name!r}: run {run_id} holds trainings this spec does not make "
            f"({', '.join(strangers)}); resuming would train again beside them: run the spec without --resume")


def _refuse_changed_start(ctx: RunContext, measurement: str, path: str, sha256: str) -> None:
    """A training that starts from `start_from` in a run some training already began from it must start
    from the same bytes: a ship that replaced the file in between would otherwise join a second
    agent's rows to the first's under one run. Each training's first attempt records the start file
    (it has no checkpoint of its own yet), whatever path the spec was loaded by."""
    from runner.run.errors import ResumeRefused

    with ctx.store.reader() as con:
        began = con.execute("SELECT resumed_from_sha256 FROM train_attempts WHERE run_id = ? AND measurement = ? "
                            "AND attempt = 0 AND resume_mode = 'checkpoint' AND resumed_from_sha256 IS NOT NULL "
                            "AND resumed_from_sha256 <> ? LIMIT 1", [ctx.run_id, measurement, sha256]).fetchone()
    if began is not None:
        raise ResumeRefused(
            f"measurement {measurement!r}: start_from {path} is not the file run {ctx.run_id} began from "
            f"(sha256 {began[0][:12]}… then, {sha256[:12]}… now); resuming would join two agents' rows in one run: "
            "run the spec without --resume")


def _checkpoint_episodes(m: TrainMeasurement, ctx: RunContext, training: Training, transition: int,
                         path: str) -> list[dict]:
    """The `episodes` rows of one checkpoint playing greedily on `evaluate_checkpoints`' seeds
    (policy 'trial@transition'); none when the database already holds them. The caller
    stores them: while training, through the run's row buffer, which keeps them when a
    reader holds the database."""
    from breakout_core.evaluation.evaluator import evaluate
    from breakout_core.evaluation.policies import QNetworkPolicy
    from runner.kinds.shared.episode_scores import episode_row

    policy = f"{training.label}@{transition}"
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


def _after_training(m: TrainMeasurement, ctx: RunContext, training: Training) -> None:
    """Evaluate the training's checkpoints not yet evaluated and record its GIF strip, from the
    checkpoints stored. What a killed run already stored (a checkpoint's episodes, a GIF) is
    not done again."""
    from breakout_core.evaluation.evaluator import evaluate, write_gif
    from breakout_core.evaluation.policies import QNetworkPolicy
    from runner.kinds.shared.episode_scores import gif_row

    with ctx.store.reader() as con:
        checkpoints = con.execute(  # one per transition count: a last mark and final.pt hold the same weights
            "SELECT transition, min(path) FROM train_checkpoints_valid WHERE run_id = ? AND measurement = ? "
            "AND trial = ? AND training_seed = ? GROUP BY transition ORDER BY transition",
            [ctx.run_id, m.name, training.trial, training.training_seed]).fetchall()
        recorded = {row[0] for row in con.execute(
            "SELECT path FROM artifacts WHERE run_id = ? AND measurement = ?", [ctx.run_id, m.name]).fetchall()}
    if m.evaluate_checkpoints is not None:
        for transition, path in checkpoints:
            if episodes := _checkpoint_episodes(m, ctx, training, transition, path):
                ctx.store.append_rows("episodes", episodes)
    if m.gif is not None:
        for transition, path in checkpoints:
            # zero-padded so the report, which lists GIFs by path, shows them in transition order
            gif_path = ctx.reports_dir / "gifs" / f"{ctx.run_id}-{m.name}-{training.label}-{transition:09d}.gif"
            if transition not in m.gif.at or str(gif_path) in recorded:
                continue
            result = evaluate(QNetworkPolicy.from_checkpoint(path), [m.gif.seed], ctx.contract, batch_size=1,
                              record_seed=m.gif.seed)
            gif = write_gif(result.frames, gif_path)
            ctx.store.append_rows("artifacts", [gif_row(ctx, m.name, gif,
                                                        f"{training.label} @ {transition} transitions",
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
