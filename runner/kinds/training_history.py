"""`training_history`: a shipped training run's curves in this run's report, without retraining.

`rows:` names a `runner export` folder (one Parquet file per table) committed beside a
checkpoint. execute() appends that run to this database unless it is already there
(runner.store.transfer.import_run) and records which run and measurement it holds; the report
shows them with the train kind's own report (summary, learning curve with its 20-episode
moving average, diagnostics, checkpoints). A clean clone thus shows how the shipped agent
learned from the shipped rows alone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from runner.kinds.kind import Kind
from runner.report.section import Section
from runner.run.context import RunContext
from runner.spec.fields import Name, StrictModel, checks_files, spec_relative


class TrainingHistoryMeasurement(StrictModel):
    kind: Literal["training_history"]
    name: Name
    rows: str = Field(description="a `runner export` folder (Parquet), relative to the spec file")
    training: Name = Field(default="reference", description="the train measurement inside the shipped run")

    @field_validator("rows")
    @classmethod
    def _export_folder(cls, rows: str, info: ValidationInfo) -> str:
        folder = spec_relative(rows, info)
        if checks_files(info) and not (folder / "runs.parquet").is_file():
            raise ValueError(f"{folder} is not a `runner export` folder (no runs.parquet in it)")
        return str(folder)


MIGRATIONS = [
    (
        "0600_training_history",
        """
        CREATE TABLE training_history (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, source_run_id VARCHAR NOT NULL,
            source_measurement VARCHAR NOT NULL, rows_path VARCHAR NOT NULL, imported_rows BIGINT NOT NULL
        );
        """,
    )
]


def execute(m: TrainingHistoryMeasurement, ctx: RunContext) -> None:
    from runner.store.transfer import exported_run_id, import_run

    folder = Path(m.rows)
    with ctx.store.reader() as con:
        source = exported_run_id(con, folder)
        present = con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [source]).fetchone()[0] > 0
    imported = 0 if present else sum(import_run(ctx.store, folder)[1].values())
    with ctx.store.reader() as con:
        episodes = con.execute("SELECT count(*) FROM train_episodes WHERE run_id = ? AND measurement = ?",
                               [source, m.training]).fetchone()[0]
    if episodes == 0:
        raise ValueError(f"{folder}: run {source} has no training episodes of measurement {m.training!r}")
    ctx.store.append_rows("training_history", [{
        "run_id": ctx.run_id, "measurement": m.name, "source_run_id": source, "source_measurement": m.training,
        "rows_path": str(folder), "imported_rows": imported}])


def report(con, run_id: str, m: TrainingHistoryMeasurement) -> list[Section]:
    from runner.kinds.shared.training_report import training_sections

    row = con.execute("SELECT source_run_id, source_measurement, rows_path FROM training_history "
                      "WHERE run_id = ? AND measurement = ?", [run_id, m.name]).fetchone()
    if row is None:
        return [Section(f"{m.name}: training history", html="<p>Not recorded.</p>")]
    source, measurement, path = row
    intro = Section(f"{m.name}: how the shipped agent was trained",
                    html=f"<p>Training run <code>{source}</code>, measurement <code>{measurement}</code>, "
                         f"from the shipped rows in <code>{path}</code>.</p>")
    return [intro] + training_sections(con, source, measurement)


KIND = Kind(
    name="training_history",
    model=TrainingHistoryMeasurement,
    migrations=MIGRATIONS,
    views=[],
    execute=execute,
    participants=lambda m: [],
    metric_names=(),
    metrics=lambda con, run_id, m, candidate, baseline: {},
    report=report,
)
