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
from test_end_to_end import runner

from runner.store import schema
from runner.store.database import Store, utcnow
from runner.store.errors import StoreError

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
    assert [name for name, _ in first] == [name for name, _ in schema.migrations()]
    assert Store(path).schema_version() == [name for name, _ in first]

    with Store(path).writer() as con:  # a new process-like Store: nothing new to apply
        assert _objects(con) == objects
    assert _migrations(path) == first  # same names, same applied_at


# The commit before the schema was declared by its owners (runner.store.schema): the store then
# imported the kinds and the play server to collect it. Its databases must open unchanged.
BEFORE_OWNED_SCHEMA = "dcd7572"
SHIPPED_MIGRATIONS = ["0001_runs", "0002_spooled_batches", "0003_runs_heartbeat", "0100_episodes", "0200_train",
                      "0201_train_results_measured", "0300_throughput", "0400_runtime_status", "0410_export",
                      "0420_parity", "0430_latency", "0440_closed_loop", "0450_episode_inference",
                      "0600_training_history", "0900_play_games"]


def test_shipped_migrations_keep_their_names():
    names = [name for name, _ in schema.migrations()]
    assert [n for n in names if n in SHIPPED_MIGRATIONS] == SHIPPED_MIGRATIONS  # none renamed, same order


def test_a_database_written_before_the_owned_schema_opens_and_migrates(tmp_path):
    """The earlier runner's own code (git archive of that commit) writes a database with rows of
    the store, a kind and the shared runtime table; this runner opens it, finds nothing unknown,
    applies what is new, and its views read the old rows."""
    old = tmp_path / "old"
    old.mkdir()
    archive = subprocess.run(["git", "archive", BEFORE_OWNED_SCHEMA, "runner", "breakout_core"],
                             cwd=Path(__file__).parents[1], capture_output=True, timeout=60)
    assert archive.returncode == 0, archive.stderr.decode()[-500:]
    subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True, timeout=60)
    path = tmp_path / "old.duckdb"
    code = f"""
        import runner.store, json  # the runner of that commit: one module per file, flat
        assert runner.store.__file__.startswith({str(old)!r}), runner.store.__file__
        from runner.store import Store, utcnow
        store = Store({str(path)!r})
        store.begin_run({{"run_id": "r1", "spec_name": "s", "spec_hash": "h", "spec_text": "name: s\\n", "host": "h"}})
        store.append_rows("episodes", [{{"run_id": "r1", "measurement": "m", "policy": p, "seed": 0, "score": sc,
            "steps": 10, "frames": 40, "ended_by": "game_over", "action_noop": 1, "action_fire": 2, "action_right": 3,
            "action_left": 4, "wall_s": 0.1, "contract_hash": "c"}} for p, sc in (("a", 3.0), ("b", 1.0))])
        store.append_rows("runtime_status", [{{"run_id": "r1", "measurement": "m", "runtime": "t", "backend": "torch",
            "artifact": "x.pt", "precision": "fp32", "requested": "{{}}", "available": False, "reason": "none here",
            "recorded_at": utcnow()}}])
        store.finish_run("r1", "done")
    """
    written = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120,
                             cwd=old, env={**os.environ, "PYTHONPATH": str(old)})
    assert written.returncode == 0, written.stderr[-2000:]
    before = {name for name, _ in _migrations(path)}
    assert set(SHIPPED_MIGRATIONS) <= before

    store = Store(path)
    unread = path.read_bytes()
    with pytest.raises(StoreError, match="older runner .* `runner migrate` upgrades it"):
        with store.reader():
            pass
    assert path.read_bytes() == unread  # a reader refuses; it never migrates
    migrated = runner("migrate", "--db", str(path), cwd=tmp_path)
    assert migrated.returncode == 0 and "applied 0004_runs_spec_settings" in migrated.stdout, migrated.stderr
    with store.reader() as con:
        assert con.execute("SELECT status FROM runs").fetchall() == [("done",)]
        assert con.execute("SELECT candidate, baseline, diff FROM episode_pairs ORDER BY candidate").fetchall() == \
            [("a", "b", 2.0), ("b", "a", -2.0)]
        assert con.execute("SELECT runtime, reason FROM runtime_summary").fetchall() == [("t", "none here")]
    assert store.schema_version() == [name for name, _ in schema.migrations()]  # what was new is applied


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
    Store(path).append_rows("artifacts",
                            [{"run_id": "r", "measurement": "m", "label": "before", "path": "p", "bytes": 1}])
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


@pytest.mark.slow
def test_two_writer_processes_append_concurrently(tmp_path):
    """Both processes import first and start appending at one signal, so that they race on the
    blank file's creation and migration and their batches interleave from the first."""
    path = tmp_path / "r.duckdb"  # blank: both processes race to migrate it as well
    batches, per_batch = 40, 3
    code = f"""
        import sys
        from runner.store.database import Store
        store = Store({str(path)!r}, busy_timeout_s=120)
        tag = sys.argv[1]
        print("ready", flush=True)
        sys.stdin.readline()
        for i in range({batches}):
            store.append_rows("artifacts", [
                {{"run_id": tag, "measurement": "m", "label": f"{{tag}}-{{i}}-{{j}}", "path": "p", "bytes": j}}
                for j in range({per_batch})
            ])
    """
    children = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(code), tag], stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for tag in ("a", "b")
    ]
    for child in children:
        assert child.stdout.readline() == "ready\n", child.communicate(timeout=60)[1]
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        _, err = child.communicate(timeout=180)
        assert child.returncode == 0, err
    with Store(path).reader() as con:
        counts = dict(con.execute("SELECT run_id, count(DISTINCT label) FROM artifacts GROUP BY run_id").fetchall())
        total = con.execute("SELECT count(*) FROM artifacts").fetchone()[0]
        migrations = con.execute("SELECT name FROM schema_migrations").fetchall()
    assert counts == {"a": batches * per_batch, "b": batches * per_batch}
    assert total == 2 * batches * per_batch
    assert len(migrations) == len(schema.migrations())


def test_reader_without_a_database(tmp_path):
    path = tmp_path / "nothing.duckdb"
    with pytest.raises(StoreError, match="no results database"):
        with Store(path).reader():
            pass
    assert not path.exists()  # looking must not create it


def test_rows_appended_together_are_stored_all_or_none(tmp_path):
    """An evaluate policy's episodes and the file it played go in one transaction: a failure in
    the second table leaves no episode behind for a resume to take as done."""
    store = Store(tmp_path / "r.duckdb")
    episode = {"run_id": "r", "measurement": "m", "policy": "p", "seed": 0, "score": 1.0, "steps": 1, "frames": 4,
               "ended_by": "game_over", "action_noop": 1, "action_fire": 0, "action_right": 0, "action_left": 0,
               "wall_s": 0.1, "contract_hash": "c"}
    with pytest.raises(duckdb.Error):
        store.append_together({"episodes": [episode], "policy_files": [{"run_id": "r", "measurement": "m"}]})
    store.append_together({"episodes": [episode], "policy_files": [{"run_id": "r", "measurement": "m", "policy": "p",
                                                                    "path": "/m.pt", "sha256": "a" * 64}]})
    with store.reader() as con:
        assert con.execute("SELECT count(*) FROM episodes").fetchone()[0] == 1
        assert con.execute("SELECT count(*) FROM policy_files").fetchone()[0] == 1


def test_a_database_of_other_tables_is_refused_and_left_as_it_was(tmp_path):
    """A DuckDB file that is not a results database (tables of its own, even one named runs)
    is refused by reads and writes alike, and gets none of the runner's tables."""
    path = tmp_path / "theirs.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE mydata (a INTEGER)")
    con.execute("CREATE TABLE runs (x INTEGER)")
    con.close()
    for opening in (Store(path).reader, Store(path).writer):
        with pytest.raises(StoreError, match="not a runner results database"):
            with opening():
                pass
    con = duckdb.connect(str(path), read_only=True)
    assert sorted(r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()) == \
        ["mydata", "runs"]
    con.close()


def test_reader_sees_the_views_this_runner_defines(tmp_path):
    """A database last written by an older runner holds that runner's views; a query or report
    after the upgrade reads the current ones without a run first."""
    path = tmp_path / "r.duckdb"
    with Store(path).writer():
        pass
    old = duckdb.connect(str(path))
    old.execute("CREATE OR REPLACE VIEW episode_summary AS "
                "SELECT run_id, count(*) AS episodes FROM episodes GROUP BY run_id")
    old.close()
    with Store(path).reader() as con:
        columns = [row[0] for row in con.execute("DESCRIBE episode_summary").fetchall()]
    assert "distinct_scores" in columns and "mean" in columns
