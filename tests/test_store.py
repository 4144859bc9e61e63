"""The DuckDB store: migrations, stale runs, and several processes sharing one file."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import duckdb
import pytest

from runner.store import Store, StoreError, _all_migrations, utcnow

TABLES = {"runs", "episodes", "verdicts", "artifacts", "schema_migrations"}
VIEWS = {"episode_summary", "episode_pairs", "latest_verdicts"}


def _objects(con) -> dict[str, str]:
    rows = con.execute(
        "SELECT table_name, table_type FROM information_schema.tables WHERE table_schema = 'main'"
    ).fetchall()
    return dict(rows)


def _migrations(path: Path) -> list[tuple]:
    con = duckdb.connect(str(path), read_only=True)
    try:
        return con.execute("SELECT name, applied_at FROM schema_migrations ORDER BY name").fetchall()
    finally:
        con.close()


def _run_row(run_id: str, pid: int, host: str | None = None) -> dict:
    return {
        "run_id": run_id, "spec_name": "s", "spec_hash": "h", "spec_text": "name: s\n",
        "host": host or socket.gethostname(), "pid": pid, "started_at": utcnow(), "status": "running",
    }


def _python(code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], text=True, **kwargs)


def test_migrations_from_blank_database(tmp_path):
    path = tmp_path / "r.duckdb"
    with Store(path).writer() as con:
        objects = _objects(con)
    # other measurement kinds may add their own tables and views
    assert TABLES <= {n for n, t in objects.items() if t == "BASE TABLE"}
    assert VIEWS <= {n for n, t in objects.items() if t == "VIEW"}
    first = _migrations(path)
    assert [name for name, _ in first] == sorted(m.name for m in _all_migrations())
    assert Store(path).schema_version() == [name for name, _ in first]

    with Store(path).writer() as con:  # a new process-like Store: nothing new to apply
        assert _objects(con) == objects
    assert _migrations(path) == first  # same names, same applied_at


def test_database_from_a_newer_runner_is_refused(tmp_path):
    path = tmp_path / "r.duckdb"
    with Store(path).writer() as con:
        con.execute("INSERT INTO schema_migrations VALUES ('9999_from_the_future', now())")
    with pytest.raises(StoreError, match="newer") as info:
        with Store(path).writer():
            pass
    assert "9999_from_the_future" in str(info.value)
    with pytest.raises(StoreError, match="newer"):
        with Store(path).reader():
            pass


def test_stale_running_runs_are_marked_interrupted(tmp_path):
    path = tmp_path / "r.duckdb"
    dead = subprocess.Popen(["true"])
    dead.wait()
    Store(path).append_rows("runs", [
        _run_row("dead", dead.pid),
        _run_row("alive", os.getpid()),
        _run_row("elsewhere", dead.pid, host="some-other-host"),  # cannot be judged from here
    ])
    with Store(path).writer():  # the next writer open recovers stale runs
        pass
    with Store(path).reader() as con:
        rows = {r[0]: r[1:] for r in con.execute("SELECT run_id, status, error, ended_at FROM runs").fetchall()}
    status, error, ended_at = rows["dead"]
    assert status == "interrupted"
    assert str(dead.pid) in error and ended_at is not None
    assert rows["alive"] == ("running", None, None)
    assert rows["elsewhere"] == ("running", None, None)


def test_reader_waits_for_a_writer(tmp_path):
    path = tmp_path / "r.duckdb"
    Store(path).append_rows("artifacts", [{"run_id": "r", "measurement": "m", "label": "before", "path": "p", "bytes": 1}])
    child = _python(f"""
        import time, duckdb
        con = duckdb.connect({str(path)!r})
        con.execute("INSERT INTO artifacts VALUES ('r', 'm', 'child', 'p', 2)")
        print("locked", flush=True)
        time.sleep(1.5)
        con.close()
    """, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == "locked"
        start = time.monotonic()
        with Store(path, busy_timeout_s=30).reader() as con:
            labels = sorted(r[0] for r in con.execute("SELECT label FROM artifacts").fetchall())
        elapsed = time.monotonic() - start
    finally:
        assert child.wait(timeout=30) == 0
    assert elapsed >= 1.0
    assert labels == ["before", "child"]  # it read after the writer's commit, not around it


@pytest.fixture
def locked_db(tmp_path):
    """A migrated database held read-write by another process until the test ends."""
    path = tmp_path / "r.duckdb"
    with Store(path).writer():
        pass
    child = _python(f"""
        import sys, duckdb
        con = duckdb.connect({str(path)!r})
        print("locked", flush=True)
        sys.stdin.readline()
        con.close()
    """, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert child.stdout.readline().strip() == "locked"
        yield path
    finally:
        child.communicate("release\n", timeout=30)


def test_reader_gives_up_when_busy(locked_db):
    start = time.monotonic()
    with pytest.raises(StoreError, match="busy"):
        with Store(locked_db, busy_timeout_s=0.3).reader():
            pass
    assert 0.3 <= time.monotonic() - start < 5


def test_busy_message_states_the_timeout(locked_db):
    with pytest.raises(StoreError) as info:
        with Store(locked_db, busy_timeout_s=0.3).writer():
            pass
    assert "0.3 s" in str(info.value)


def test_two_writer_processes_append_concurrently(tmp_path):
    path = tmp_path / "r.duckdb"  # blank: both processes race to migrate it as well
    batches, per_batch = 200, 3
    code = f"""
        import sys
        from runner.store import Store
        store = Store({str(path)!r}, busy_timeout_s=120)
        tag = sys.argv[1]
        for i in range({batches}):
            store.append_rows("artifacts", [
                {{"run_id": tag, "measurement": "m", "label": f"{{tag}}-{{i}}-{{j}}", "path": "p", "bytes": j}}
                for j in range({per_batch})
            ])
    """
    children = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), tag], stderr=subprocess.PIPE, text=True)
        for tag in ("a", "b")
    ]
    for child in children:
        _, err = child.communicate(timeout=180)
        assert child.returncode == 0, err
    with Store(path).reader() as con:
        counts = dict(con.execute("SELECT run_id, count(DISTINCT label) FROM artifacts GROUP BY run_id").fetchall())
        total = con.execute("SELECT count(*) FROM artifacts").fetchone()[0]
        migrations = con.execute("SELECT name FROM schema_migrations").fetchall()
    assert counts == {"a": batches * per_batch, "b": batches * per_batch}
    assert total == 2 * batches * per_batch
    assert len(migrations) == len(_all_migrations())


def test_reader_without_a_database(tmp_path):
    path = tmp_path / "nothing.duckdb"
    with pytest.raises(StoreError, match="no results database"):
        with Store(path).reader():
            pass
    assert not path.exists()  # looking must not create it


def test_reader_sees_the_views_this_runner_defines(tmp_path):
    """A database last written by an older runner holds that runner's views; a query or report
    after the upgrade reads the current ones without a run first."""
    path = tmp_path / "r.duckdb"
    with Store(path).writer():
        pass
    old = duckdb.connect(str(path))
    old.execute("CREATE OR REPLACE VIEW episode_summary AS SELECT run_id, count(*) AS episodes FROM episodes GROUP BY run_id")
    old.close()
    with Store(path).reader() as con:
        columns = [row[0] for row in con.execute("DESCRIBE episode_summary").fetchall()]
    assert "distinct_scores" in columns and "mean" in columns
