"""Moving one run between databases as Parquet: every table's rows of that run, one file each.

A shipped export lets a clean clone show a long training's curves without retraining:
`runner import DIR` appends the rows, and the run's report works as on the machine that
trained it.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import duckdb
import yaml

from breakout_core.common.files import NoSpaceLeft
from breakout_core.common.messages import first_line
from runner.spec.fields import NAME_PATTERN
from runner.spec.stored import stored_spec_problem
from runner.spec.yaml_source import read_spec_text
from runner.store.database import Store
from runner.store.errors import StoreError, transaction

RUN_ID_PATTERN = r"[0-9A-Za-z][0-9A-Za-z_\-]{0,63}"  # safe in a file name, as a runner's ids are


class TransferRefused(StoreError):
    """The user's folder or run does not fit (a folder already holding files, rows of another
    run, a run already stored); nothing was written."""


def _run_tables(con) -> list[str]:
    return [r[0] for r in con.execute(
        "SELECT table_name FROM information_schema.columns WHERE column_name = 'run_id' AND table_schema = 'main' "
        "AND table_name IN (SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE') "
        "ORDER BY table_name").fetchall()]


def export_run(store: Store, run_id: str, out_dir: Path) -> dict[str, int]:
    """Write <table>.parquet for every table holding rows of `run_id`; returns rows per table.

    The files are written in a hidden folder beside `out_dir` and renamed to it at the end, so
    `out_dir` either does not exist or holds exactly this run's export. A folder that already
    holds anything is refused: two runs' files in one folder would import as one."""
    with store.reader() as con:  # before any folder is made
        if con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchone()[0] == 0:
            raise TransferRefused(f"no run {run_id!r} in {store.path}")
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise TransferRefused(f"{out_dir}: not empty; export each run to a folder of its own")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".export-{run_id}-", dir=out_dir.parent))
    try:
        counts = {}
        with store.reader() as con:
            for table in _run_tables(con):
                n = con.execute(f'SELECT count(*) FROM "{table}" WHERE run_id = ?', [run_id]).fetchone()[0]
                if n:
                    target = str(staging / f"{table}.parquet").replace("'", "''")
                    try:
                        con.execute(f"""COPY (SELECT * FROM "{table}" WHERE run_id = ?) TO '{target}' """
                                    "(FORMAT parquet)", [run_id])
                    except duckdb.IOException as exc:
                        if "no space left" in str(exc).lower():
                            raise NoSpaceLeft(out_dir) from None
                        raise
                    counts[table] = n
        if out_dir.exists():
            out_dir.rmdir()  # still empty (checked above); rename needs it gone
        staging.rename(out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return counts


def exported_run_id(con, in_dir: Path) -> str:
    """The one run id in an export folder's runs.parquet."""
    run_ids = [r[0] for r in con.execute("SELECT DISTINCT run_id FROM read_parquet(?)",
                                         [str(in_dir / "runs.parquet")]).fetchall()]
    if len(run_ids) != 1:
        raise TransferRefused(f"{in_dir}/runs.parquet holds {len(run_ids)} runs, expected 1")
    return run_ids[0]


def _run_row_problem(con, in_dir: Path) -> str | None:
    """Why the exported run row cannot be stored as a run of this runner: a run id or spec name
    that could not name a report file, or a spec text that does not read as a spec."""
    row = con.execute("SELECT * FROM read_parquet(?)", [str(in_dir / "runs.parquet")]).fetchone()
    columns = [d[0] for d in con.description]
    run = dict(zip(columns, row))
    if not re.fullmatch(RUN_ID_PATTERN, str(run["run_id"])):
        return f"run id {run['run_id']!r} is not one a runner writes"
    if not isinstance(run.get("spec_name"), str) or not re.fullmatch(NAME_PATTERN, run["spec_name"]):
        return f"spec name {run.get('spec_name')!r} is not a spec name (letters, digits, _ and -)"
    try:
        if problem := stored_spec_problem(read_spec_text(run.get("spec_text") or "")):
            return f"its spec text is not a spec: {problem}"
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        return f"its spec text does not read as YAML ({first_line(exc)})"
    if run.get("spec_settings") is not None:
        try:
            settings = json.loads(run["spec_settings"])
        except (TypeError, ValueError):
            return "its spec_settings are not JSON"
        if problem := stored_spec_problem(settings):
            return f"its spec_settings are not a spec: {problem}"
    return None


def _foreign_rows(con, files: list[Path], run_id: str) -> list[str]:
    """'file: run ids' for each file holding rows of a run other than `run_id`."""
    found = []
    for f in files:
        others = [r[0] for r in con.execute(
            "SELECT DISTINCT run_id FROM read_parquet(?) WHERE run_id IS DISTINCT FROM ? ORDER BY 1 LIMIT 3",
            [str(f), run_id]).fetchall()]
        if others:
            found.append(f"{f.name} holds rows of run {', '.join(map(str, others))}")
    return found


def import_run(store: Store, in_dir: Path) -> tuple[str, dict[str, int]]:
    """Append an exported run; refuses one whose run id is already stored."""
    files = sorted(in_dir.glob("*.parquet"))
    if not (in_dir / "runs.parquet").is_file():
        raise TransferRefused(f"{in_dir}: no runs.parquet here (not a `runner export` folder)")
    counts = {}
    with store.writer() as con:
        known = set(_run_tables(con))
        run_id = exported_run_id(con, in_dir)
        if con.execute("SELECT count(*) FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]:
            raise TransferRefused(f"run {run_id} is already in {store.path}")
        if problem := _run_row_problem(con, in_dir):
            raise TransferRefused(f"{in_dir}/runs.parquet: {problem}; nothing imported")
        unknown = [f.stem for f in files if f.stem not in known]
        if unknown:
            raise TransferRefused(f"{in_dir}: tables this runner does not know: {', '.join(unknown)}")
        foreign = _foreign_rows(con, files, run_id)
        if foreign:
            raise TransferRefused(f"{in_dir}: {'; '.join(foreign)}, not of run {run_id} (runs.parquet); "
                                  "nothing imported")
        with transaction(con):
            for f in files:
                con.execute(f'INSERT INTO "{f.stem}" BY NAME SELECT * FROM read_parquet(?)', [str(f)])
                counts[f.stem] = con.execute(f'SELECT count(*) FROM "{f.stem}" WHERE run_id = ?',
                                             [run_id]).fetchone()[0]
    return run_id, counts
