"""What the results database and the run files promise at their edges: reading commands never
write the file, a damaged file is told in one line by every command (and refused by a run), a
full disk says so and leaves no temporary file, and a spec is read with a size limit."""

from __future__ import annotations

import hashlib
import os
import random
import re
import subprocess
from pathlib import Path

import pytest
from cli_process import Outcome, run_in_one_process
from test_cli_inputs import cli
from test_end_to_end import TINY, runner

from breakout_core.common.files import NoSpaceLeft
from runner.spec.yaml_source import MAX_SPEC_BYTES
from runner.store.database import Store
from runner.store.errors import StoreDamaged

READ_COMMANDS = (("runs",), ("sql", "SELECT count(*) FROM episodes"), ("report", "--verdicts"))


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _one_line_error(result: subprocess.CompletedProcess | Outcome, *mentions: str) -> str:
    assert (result.returncode if isinstance(result, subprocess.CompletedProcess) else result.exit_code) != 0, \
        result.stdout
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for mention in mentions:
        assert mention in lines[0], (mention, lines[0])
    return lines[0]


def _database_with_rows(path: Path, episodes: int = 100_000, runs: tuple[str, ...] = ("r1",)) -> Path:
    """A results database of finished runs of one spec (`runs`), the first with many episode rows
    (several MB of blocks)."""
    store = Store(path)
    for run_id in runs:
        store.begin_run({"run_id": run_id, "spec_name": "s", "spec_hash": "h", "spec_text": "name: s\n", "host": "h"})
    rng = random.Random(0)
    store.append_rows("episodes", [
        {"run_id": "r1", "measurement": "m", "policy": "p", "seed": i, "score": rng.random() * 100, "steps": 10,
         "frames": 40, "ended_by": "game_over", "action_noop": 1, "action_fire": 2, "action_right": 3,
         "action_left": 4, "wall_s": 0.1, "contract_hash": "c"} for i in range(episodes)])
    for run_id in runs:
        store.finish_run(run_id, "done")
    return path


@pytest.mark.slow
def test_read_commands_leave_the_database_bytes_unchanged(tmp_path, checkpoint, write_spec):
    """The two runs are written in this process; the reading commands run in a process of their
    own, so that whatever it writes as it exits (a connection left open) shows as well."""
    spec = write_spec(re.sub(r"max_episode_frames: \d+", "max_episode_frames: 400", TINY)  # short games: any rows do
                      .replace("seeds: [4, 5, 6, 7]", "seeds: [4, 5]"))
    db = tmp_path / "results.duckdb"
    run_ids = []
    for _ in range(2):
        done = cli("run", str(spec), "--db", str(db), "--no-report", cwd=tmp_path)
        assert done.exit_code == 0, (done.output, done.exception)
        run_ids.append(done.stdout.split()[1])
    before = _sha256(db)
    reads = [*READ_COMMANDS, ("report", run_ids[0]), ("compare", *run_ids), ("export", run_ids[0])]
    outcomes = run_in_one_process([[*command, "--db", str(db)] for command in reads], cwd=tmp_path, watched=db)
    assert len(outcomes) == len(reads)
    for outcome in outcomes:
        assert outcome.exit_code == 0 and outcome.exited, (outcome.args, outcome.stderr)
        assert outcome.sha256 == before, f"runner {' '.join(outcome.args)} changed the database file"
    assert _sha256(db) == before, "the process of the reading commands changed the database file as it exited"
    assert not db.with_name(db.name + ".wal").exists()


@pytest.fixture(scope="module")
def damaged(tmp_path_factory) -> dict[str, Path]:
    """The same database cut to half its length, and with garbage written over a third of its blocks."""
    folder = tmp_path_factory.mktemp("damaged")
    good = _database_with_rows(folder / "good.duckdb", runs=("r1", "r2"))  # two, for `runner compare`
    data = good.read_bytes()
    cut = folder / "cut.duckdb"
    cut.write_bytes(data[: len(data) // 2])
    garbled = bytearray(data)
    noise = random.Random(1)
    for offset in range(len(data) // 3, len(data) // 3 + 200_000, 4096):
        garbled[offset:offset + 64] = noise.randbytes(64)
    scribbled = folder / "scribbled.duckdb"
    scribbled.write_bytes(bytes(garbled))
    return {"cut": cut, "scribbled": scribbled}


@pytest.mark.parametrize("kind", ["cut", "scribbled"])
def test_a_damaged_database_is_one_line_from_every_command(tmp_path, damaged, kind, checkpoint, write_spec):
    """Every command that reads the damaged rows says the file is damaged, in one line and with
    a non-zero exit; `runner run` reads every table first and refuses to append to it."""
    db = tmp_path / f"{kind}.duckdb"
    db.write_bytes(damaged[kind].read_bytes())
    commands = [("sql", "SELECT sum(score) FROM episodes"), ("report", "r1"), ("export", "r1", "--out", "ex"),
                ("compare", "r1", "r2"), ("run", str(write_spec(TINY)), "--no-report")]
    if kind == "scribbled":  # a block of the catalog is hit: nothing reads
        commands += [("runs",), ("report", "--verdicts"), ("mark-interrupted", "r1"), ("migrate",)]
    outcomes = run_in_one_process([[*command, "--db", str(db)] for command in commands], cwd=tmp_path, watched=db)
    assert len(outcomes) == len(commands)
    for outcome in outcomes:
        assert outcome.exit_code != 0 and outcome.exited, (outcome.args, outcome.exit_code, outcome.stderr)
        _one_line_error(outcome, "damaged or unreadable", str(db))
    assert not (tmp_path / "ex").exists()


def test_a_run_refuses_a_damaged_database_and_appends_nothing(tmp_path, damaged):
    db = tmp_path / "cut.duckdb"
    db.write_bytes(damaged["cut"].read_bytes())
    with pytest.raises(StoreDamaged, match="damaged or unreadable"):
        Store(db).verify_readable()
    assert db.read_bytes() == damaged["cut"].read_bytes()


def _fill(disk: Path, leave_bytes: int) -> None:
    free = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    (disk / "filler").write_bytes(b"\0" * max(0, free - leave_bytes))


def _temporary_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


def test_a_full_disk_under_the_database_is_one_line(small_disk, tmp_path):
    db = small_disk / "r.duckdb"
    Store(db).begin_run({"run_id": "r0", "spec_name": "s", "spec_hash": "h", "spec_text": "name: s\n", "host": "h"})
    _fill(small_disk, 64 * 1024)
    with pytest.raises(StoreDamaged, match=f"no space left on device: {db}"):
        Store(db).begin_run({"run_id": "r1", "spec_name": "s", "spec_hash": "h", "spec_text": "x" * 400_000,
                             "host": "h"})
    listed = runner("runs", "--db", str(db), cwd=tmp_path)  # what was stored before still reads
    assert listed.returncode == 0 and "r0" in listed.stdout, listed.stderr


def test_a_full_disk_under_checkpoints_spool_and_reports_says_so_and_leaves_no_temporary_file(small_disk):
    import torch

    from breakout_core.game.contract import CONTRACTS
    from breakout_core.learning.qnetwork import QNetwork, save_checkpoint

    _fill(small_disk, 64 * 1024)
    torch.manual_seed(0)
    with pytest.raises(NoSpaceLeft, match=f"no space left on device: {small_disk / 'runs' / 'model.pt'}"):
        save_checkpoint(small_disk / "runs" / "model.pt", QNetwork(), CONTRACTS["breakout-v3"], transitions=0)
    store = Store(small_disk / "r.duckdb")
    with pytest.raises(NoSpaceLeft, match="no space left on device"):
        store.spool("r1", "episodes", [{"run_id": "r1", "note": os.urandom(100).hex()} for _ in range(5000)])
    assert _temporary_files(small_disk) == []
    assert not (small_disk / "runs" / "model.pt").exists()


def test_the_cli_says_no_space_left_for_a_report(small_disk, tmp_path):
    db = _database_with_rows(tmp_path / "r.duckdb", episodes=10)
    _fill(small_disk, 1024)
    result = runner("report", "r1", "--db", str(db), "--reports", str(small_disk / "reports"), cwd=tmp_path)
    _one_line_error(result, "no space left on device", str(small_disk / "reports"))
    assert _temporary_files(small_disk) == [] and not list((small_disk / "reports").glob("*.html"))


@pytest.mark.parametrize("source", ["/dev/zero", "huge"])
def test_a_spec_is_read_with_a_size_limit(tmp_path, source):
    if source == "huge":
        source = tmp_path / "huge.yaml"
        source.write_text("name: x\nmeasurements:\n- kind: evaluate\n  seeds: [" + ",".join(["1"] * 1_500_000) + "]\n")
    result = runner("validate", str(source), cwd=tmp_path, timeout=30)
    assert result.returncode == 2
    _one_line_error(result, str(source), f"larger than {MAX_SPEC_BYTES // 1024} KiB")


def test_sql_reads_a_comment_as_a_query_not_an_option(tmp_path):
    db = _database_with_rows(tmp_path / "r.duckdb", episodes=1)
    _one_line_error(runner("sql", "-- only a comment", "--db", str(db), cwd=tmp_path), "SQL: no statement")
    counted = runner("sql", "SELECT count(*) AS n FROM runs -- how many", "--db", str(db), "--csv", cwd=tmp_path)
    assert counted.returncode == 0 and counted.stdout.split() == ["n", "1"], counted.stderr


def test_a_failed_import_leaves_no_database_where_there_was_none(tmp_path):
    folder = tmp_path / "export"
    folder.mkdir()
    (folder / "runs.parquet").write_bytes(b"not parquet")
    db = tmp_path / "new.duckdb"
    result = runner("import", str(folder), "--db", str(db), cwd=tmp_path)
    _one_line_error(result, str(folder))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export"]
