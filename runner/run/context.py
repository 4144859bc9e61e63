"""What a measurement's execution is given: the run, its spec and contract, the store, and where
its files go."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.progress import Progress

    from breakout_core.game.contract import Contract
    from runner.run.artifact_files import RunFiles
    from runner.run.executor import Executor
    from runner.store.database import Store


@dataclass
class RunContext:
    """Everything a kind's execute() needs; it writes through `store`, never holding it open."""

    run_id: str
    spec: Any  # runner.spec.document.Spec
    contract: "Contract"
    store: "Store"
    reports_dir: Path
    progress: "Progress"
    artifacts_dir: Path  # runs/<run_id>: checkpoints and other files a run makes
    resume: bool = False  # continuing an unfinished run: kinds skip or go on with finished work
    executor: "Executor | None" = None  # where trainings run; None: in this process
    files: "RunFiles | None" = None  # the artifacts' hashes and output paths; None: no spec artifacts are checked
    confirm: bool = False  # `--confirm`: drawn seeds come from the confirmation range (runner.spec.seed_pools)

    def already_stored(self, table: str, measurement: str, **columns: Any) -> bool:
        """On --resume: whether `table` holds rows of this run's `measurement` where each of
        `columns` equals its value (the work they come from is done); always False otherwise."""
        if not self.resume:
            return False
        where = "".join(f" AND {column} = ?" for column in columns)
        with self.store.reader() as con:
            return con.execute(f"SELECT count(*) > 0 FROM {table} WHERE run_id = ? AND measurement = ?{where}",
                               [self.run_id, measurement, *columns.values()]).fetchone()[0]
