"""A train measurement's unit of work: one (trial, training seed) training.

`train_one` runs one training and `score_one` scores its final checkpoint greedily on the
measurement's score seeds. Both yield (table, row) records and store nothing: the
in-process executor streams them to the store as they come, a Ray task sends them back
from its worker in one batch. Either way the same rows are stored.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal

if TYPE_CHECKING:
    from breakout_core.game.contract import Contract
    from breakout_core.learning.train_config import TrainConfig

Record = tuple[str, dict]  # (table, row)


@dataclass(frozen=True)
class Training:
    trial: str
    overrides: dict[str, Any]
    training_seed: int
    label: str  # the training in `episodes` and GIF names: the trial, with ",seed=N" where the study lists seeds


@dataclass(frozen=True)
class TrainingJob:
    """Everything a worker needs to run one training and score it; picklable."""

    run_id: str
    measurement: str
    training: Training
    config: "TrainConfig"
    contract: "Contract"
    out_dir: str
    attempt: int
    # how the attempt begins: "fresh", "trainer_state" (the state saved in out_dir by an interrupted
    # attempt) or "checkpoint" (a checkpoint's weights, a fresh optimizer); the replay starts empty
    # in both of the latter and is refilled by the current policy before learning resumes
    resume_mode: Literal["fresh", "trainer_state", "checkpoint"]
    resumed_from: str | None
    resumed_from_sha256: str | None  # the checkpoint's bytes in "checkpoint" mode, so a later resume can check them
    other_contract: bool  # the spec says a checkpoint from another contract is deliberate
    from_transition: int
    score_seeds: tuple[int, ...]  # empty: the measurement scores nothing
    score_batch: int

    @property
    def key(self) -> dict:
        return {"run_id": self.run_id, "measurement": self.measurement, "trial": self.training.trial,
                "training_seed": self.training.training_seed, "attempt": self.attempt}


def train_one(job: TrainingJob, on_transition: Callable[[int], None] | None = None) -> Iterator[Record]:
    """The attempt row, then every episode, diagnostics, checkpoint and result row of training.

    A consumer that stores a checkpoint row before asking for the next record stores it
    before the trainer saves the state that goes past it: a resume never starts past rows
    that were not stored."""
    import json

    from breakout_core.learning.trainer import CheckpointSaved, Diagnostics, EpisodeEnd, TrainDone, Trainer
    from runner.store.database import utcnow

    key = job.key
    if job.resume_mode == "checkpoint":
        _refuse_changed_file(job)
    trainer = Trainer(job.config, job.contract, job.out_dir)
    yield "train_attempts", {**key, "from_transition": job.from_transition, "config": json.dumps(asdict(job.config)),
                             "out_dir": job.out_dir, "started_at": utcnow(), "resume_mode": job.resume_mode,
                             "resumed_from": job.resumed_from, "resumed_from_sha256": job.resumed_from_sha256,
                             "learner_precision": json.dumps(asdict(trainer.precision))}
    tables = {EpisodeEnd: "train_episodes", Diagnostics: "train_diagnostics", CheckpointSaved: "train_checkpoints",
              TrainDone: "train_results"}
    records = trainer.run(resume=job.resume_mode == "trainer_state",
                          start_from=job.resumed_from if job.resume_mode == "checkpoint" else None,
                          other_contract=job.other_contract)
    for record in records:
        yield tables[type(record)], {**key, **asdict(record)}
        if on_transition is not None and isinstance(record, EpisodeEnd):
            on_transition(record.transition)


def _refuse_changed_file(job: TrainingJob) -> None:
    """The file a training starts from must still hold the bytes hashed when its job was made: trainings
    train one after another (or whenever a Ray worker is free), and a ship may replace a
    start file in between."""
    from breakout_core.common.hashing import file_sha256

    if (now := file_sha256(job.resumed_from)) != job.resumed_from_sha256:
        raise ValueError(f"{job.resumed_from}: replaced while the run was going "
                         f"(sha256 {job.resumed_from_sha256[:12]}… when the run began, {now[:12]}… now); "
                         f"{job.training.label} did not start")


def score_one(job: TrainingJob, checkpoint: str, transition: int,
               on_episode: Callable[[object], None] | None = None) -> Iterator[Record]:
    """One `train_scores` row per score seed: the checkpoint playing greedily (epsilon 0)."""
    from breakout_core.evaluation.evaluator import evaluate
    from breakout_core.evaluation.policies import QNetworkPolicy

    result = evaluate(QNetworkPolicy.from_checkpoint(checkpoint, epsilon=0.0), list(job.score_seeds), job.contract,
                      batch_size=job.score_batch, on_episode=on_episode)
    key = {k: v for k, v in job.key.items() if k != "attempt"}
    for e in result.episodes:
        yield "train_scores", {**key, "transition": transition, "checkpoint": str(Path(checkpoint).name),
                               "eval_seed": e.seed, "score": e.score, "steps": e.steps, "ended_by": e.ended_by}


def final_checkpoint(records: list[Record]) -> tuple[str, int]:
    """(path, transition) of the last checkpoint among a training's records: final.pt."""
    path, transition = next((row["path"], row["transition"]) for table, row in reversed(records)
                            if table == "train_checkpoints")
    return path, transition
