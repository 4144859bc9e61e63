"""Where a train measurement's (trial, training seed) trainings run: in this process, or as Ray tasks.

The runner process stays the only writer to the database and to the run's folder either way.
In process, a training's rows are stored as it trains (a killed run resumes each training from
its last checkpoint). On Ray, each training is one task that trains in its worker's own folder and
sends back its rows and checkpoint files when it ends; the runner writes the files into the
run's folder and appends the rows in one transaction, so a training is stored whole or not at all.
A task whose worker dies is retried `ray_retries` times, then its training is reported failed and
the run ends failed once the other trainings are stored: `runner run --resume` runs what is missing.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from breakout_core.common.files import write_whole
from breakout_core.common.messages import described
from runner.kinds.train.trainings import Record, Training, TrainingJob, final_checkpoint, score_one, train_one
from runner.run.executor import Executor

if TYPE_CHECKING:
    from runner.run.context import RunContext

FLUSH_EVERY_S = 5.0  # seconds between appends while training: readers get the file in between
DURABLE_TABLES = ("train_attempts", "train_checkpoints")  # stored before the trainer goes on past them


class TrainingsFailed(RuntimeError):
    """Some trainings could not run; every other training is stored."""


OnCheckpoint = Callable[[Training, int, str], list[Record]]  # (training, transition, path) -> rows to store


def run_trainings(jobs: list[TrainingJob], ctx: "RunContext", executor: Executor,
                  on_checkpoint: OnCheckpoint | None = None) -> None:
    """Run the trainings. In this process, `on_checkpoint` runs on each checkpoint once it is
    stored, while the trainer waits, and its rows are stored before the trainer goes on; Ray
    trainings send theirs back whole, so it is not called."""
    if not jobs:
        return
    if executor.name == "ray":
        _run_on_ray(jobs, ctx, executor)
    else:
        for job in jobs:
            _run_here(job, ctx, on_checkpoint)


def score_here(job: TrainingJob, ctx: "RunContext", checkpoint: str, transition: int) -> None:
    """Score a training that is stored but whose score is not (a run killed while scoring)."""
    task = ctx.progress.add_task(f"{job.measurement} · score {job.training.label}", total=len(job.score_seeds),
                                 unit="episodes")
    rows = list(score_one(job, checkpoint, transition, on_episode=lambda _e: ctx.progress.advance(task)))
    _store_whole(ctx, rows)


def _run_here(job: TrainingJob, ctx: "RunContext", on_checkpoint: OnCheckpoint | None) -> None:
    from runner.store.row_buffer import RowBuffer

    rows = RowBuffer(ctx.store, ctx.run_id, ctx.progress.console.log)
    task = ctx.progress.add_task(f"{job.measurement} · {job.training.label}", total=job.config.total_transitions,
                                 completed=job.from_transition, unit="transitions")
    checkpoint: tuple[str, int] | None = None
    called: set[int] = set()  # transitions on_checkpoint ran for
    last_flush = time.monotonic()
    try:
        for table, row in train_one(job, lambda t: ctx.progress.update(task, completed=t, transitions=t)):
            rows.add(table, row)
            if table in DURABLE_TABLES:
                rows.flush(durable=True)
                last_flush = time.monotonic()
            if table == "train_checkpoints":
                checkpoint = (row["path"], row["transition"])
                _log_checkpoint(ctx, job, row)
                if on_checkpoint is not None and row["transition"] not in called:  # final.pt repeats the last mark
                    called.add(row["transition"])
                    for record in on_checkpoint(job.training, row["transition"], row["path"]):
                        rows.add(*record)
                    rows.flush(durable=True)  # kept on disk if a reader holds the database
            elif table == "train_results":
                ctx.progress.update(task, completed=row["transitions"], transitions=row["transitions"])
            elif time.monotonic() - last_flush >= FLUSH_EVERY_S:
                rows.flush()
                last_flush = time.monotonic()
    finally:
        rows.close()
    if job.score_seeds and checkpoint is not None:
        score_here(job, ctx, *checkpoint)


def _log_checkpoint(ctx: "RunContext", job: TrainingJob, row: dict) -> None:
    """One plain line per checkpoint, readable in a log file where no progress bar draws."""
    with ctx.store.reader() as con:
        found = con.execute(
            "SELECT last20_mean, episodes FROM train_trial_summary WHERE run_id = ? AND measurement = ? AND trial = ? "
            "AND training_seed = ?",
            [ctx.run_id, job.measurement, job.training.trial, job.training.training_seed]).fetchone()
    mean = (f"{found[0]:.2f} over the last 20 of {found[1]} episodes" if found and found[0] is not None
            else "no episode yet")
    ctx.progress.console.log(f"{job.measurement} · {job.training.label}: checkpoint at {row['transition']} transitions "
                             f"({row['path']}); training return {mean}")


def _store_whole(ctx: "RunContext", records: list[Record]) -> None:
    """Append every record in one transaction (spooled first if the database is busy)."""
    from runner.store.row_buffer import RowBuffer

    rows = RowBuffer(ctx.store, ctx.run_id, ctx.progress.console.log)
    for table, row in records:
        rows.add(table, row)
    rows.close()


# -- Ray --------------------------------------------------------------------------------------

def _training_task(job: TrainingJob, torch_threads: int) -> tuple[list[Record], dict[str, bytes]]:
    """Runs in a Ray worker: run the training in a folder of its own, score it, and return the
    rows and the checkpoint files. Nothing is written where the runner keeps its files."""
    import torch

    torch.set_num_threads(torch_threads)
    with tempfile.TemporaryDirectory(prefix="training-") as folder:
        local = replace(job, out_dir=folder)
        records = list(train_one(local))
        if job.score_seeds:
            records += list(score_one(local, *final_checkpoint(records)))
        files = {path.name: path.read_bytes() for path in Path(folder).glob("*.pt") if path.name != "trainer_state.pt"}
    return records, files


def _received(job: TrainingJob, records: list[Record], files: dict[str, bytes]) -> list[Record]:
    """Write the training's checkpoint files into the run's folder; its rows then name them there."""
    out_dir = Path(job.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        write_whole(out_dir / name, data)
    fixed = []
    for table, row in records:
        if table == "train_attempts":
            row = {**row, "out_dir": job.out_dir}
        elif table == "train_checkpoints":
            row = {**row, "path": str(out_dir / Path(row["path"]).name)}
        fixed.append((table, row))
    return fixed


def _run_on_ray(jobs: list[TrainingJob], ctx: "RunContext", executor: Executor) -> None:
    import ray

    if not ray.is_initialized():
        if executor.ray_address:
            ray.init(address=executor.ray_address, log_to_driver=False)
        else:
            ray.init(include_dashboard=False, log_to_driver=False,
                     object_store_memory=executor.ray_object_store_bytes)
    pending = {}
    for job in jobs:
        threads = job.config.torch_threads or 1
        remote = ray.remote(_training_task).options(num_cpus=threads, max_retries=executor.ray_retries,
                                                name=f"train {job.measurement} {job.training.label}")
        pending[remote.remote(job, threads)] = job
    task = ctx.progress.add_task(f"{jobs[0].measurement} · {len(jobs)} trainings on Ray", total=len(jobs),
                                 unit="trainings")
    failed: list[str] = []
    while pending:
        done, _ = ray.wait(list(pending), num_returns=1)
        job = pending.pop(done[0])
        try:
            records, files = ray.get(done[0])
        except (ray.exceptions.RayError) as exc:
            cause = getattr(exc, "cause", None) or exc  # a task's own exception, under Ray's header
            failed.append(f"{job.training.label} ({described(cause)})")
            ctx.progress.console.log(f"{job.measurement} · {job.training.label}: failed on Ray, nothing stored for it")
        else:
            _store_whole(ctx, _received(job, records, files))
            ctx.progress.console.log(f"{job.measurement} · {job.training.label}: trained on Ray, "
                                     f"{len(records)} rows and {len(files)} checkpoints stored")
        ctx.progress.advance(task)
    if failed:
        raise TrainingsFailed(f"{len(failed)} of {len(jobs)} trainings failed on Ray: {'; '.join(failed)}; "
                          "every other training is stored, and `runner run --resume` runs the missing ones")

