"""No run stays 'running' for ever: a heartbeat, stale runs interrupted on any host, and a
command to mark one interrupted by hand."""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

import duckdb
from test_cli_inputs import assert_one_line_usage_error, cli
from test_end_to_end import runner

from runner.store.database import STALE_AFTER_S, Store, utcnow
from runner.store.heartbeat import Heartbeat


def _run(store: Store, run_id: str, *, host: str, pid: int, beat_age_s: float) -> None:
    beat = utcnow() - timedelta(seconds=beat_age_s)
    store.append_rows("runs", [{"run_id": run_id, "spec_name": "s", "spec_hash": "h", "spec_text": "name: s\n",
                                "host": host, "pid": pid, "started_at": beat, "heartbeat_at": beat,
                                "status": "running"}])


def _statuses(path) -> dict[str, str]:
    with duckdb.connect(str(path), read_only=True) as con:
        return dict(con.execute("SELECT run_id, status FROM runs").fetchall())


def test_a_run_whose_heartbeat_stopped_is_interrupted_wherever_it_ran(tmp_path):
    path = tmp_path / "r.duckdb"
    writer = Store(path)
    _run(writer, "gone_host", host="container-before-restart", pid=1, beat_age_s=STALE_AFTER_S + 60)
    _run(writer, "reused_pid", host=socket.gethostname(), pid=os.getpid(), beat_age_s=STALE_AFTER_S + 60)
    _run(writer, "beating", host="another-host", pid=1, beat_age_s=5)
    listed = runner("runs", "--db", str(path), cwd=tmp_path)  # a reader shows them ended, and writes nothing
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("interrupted") == 2 and "container-before-restart" in listed.stdout
    assert _statuses(path) == {"gone_host": "running", "reused_pid": "running", "beating": "running"}
    with Store(path).writer():  # the next writing command stores them as interrupted
        pass
    assert _statuses(path) == {"gone_host": "interrupted", "reused_pid": "interrupted", "beating": "running"}
    with duckdb.connect(str(path), read_only=True) as con:
        error = con.execute("SELECT error FROM runs WHERE run_id = 'gone_host'").fetchone()[0]
    assert "no heartbeat" in error and "container-before-restart" in error
    assert Store(path).unfinished_run("s", "h") in {"gone_host", "reused_pid"}  # --resume takes them


def test_the_heartbeat_stamps_its_run_until_stopped(tmp_path):
    store = Store(tmp_path / "r.duckdb")
    _run(store, "mine", host=socket.gethostname(), pid=os.getpid(), beat_age_s=60)

    def beat_at():
        with store.reader() as con:
            return con.execute("SELECT heartbeat_at FROM runs").fetchone()[0]

    first = beat_at()
    with Heartbeat(store, "mine", every_s=0.05):
        deadline = time.monotonic() + 30
        while beat_at() == first and time.monotonic() < deadline:
            time.sleep(0.05)
    stopped = beat_at()
    assert stopped > first
    time.sleep(0.2)
    assert beat_at() == stopped


def test_mark_interrupted_by_hand(tmp_path):
    path = tmp_path / "r.duckdb"
    store = Store(path)
    _run(store, "stuck", host="another-host", pid=1, beat_age_s=120)  # silent, not yet for STALE_AFTER_S
    _run(store, "alive", host="another-host", pid=1, beat_age_s=2)
    marked = cli("mark-interrupted", "stuck", "--db", str(path), cwd=tmp_path)
    assert marked.exit_code == 0, marked.output
    assert _statuses(path) == {"stuck": "interrupted", "alive": "running"}
    again = cli("mark-interrupted", "stuck", "--db", str(path), cwd=tmp_path)  # as opening the database does
    assert again.exit_code == 0 and "stuck was interrupted already: marked interrupted by hand" in again.stdout
    assert_one_line_usage_error(cli("mark-interrupted", "nope", "--db", str(path), cwd=tmp_path), "no run 'nope'")
    mistyped = cli("mark-interrupted", "stuck", "--db", "nowhere.duckdb", cwd=tmp_path)
    assert mistyped.exit_code == 3 and "no results database here yet" in mistyped.stderr
    assert not (tmp_path / "nowhere.duckdb").exists()
    assert_one_line_usage_error(cli("mark-interrupted", "alive", "--db", str(path), cwd=tmp_path),
                                "alive", "another-host")
