"""The results database: an append-only DuckDB file with ordered, recorded migrations.

DuckDB lets one process hold a file for writing and then no other process may open it,
not even to read. So nothing keeps a connection open: a writer opens the file, appends a
batch and closes it; a reader opens it read-only for one query. A long `runner run`
therefore leaves the file free between its batches, and a second process waits (up to
`busy_timeout_s`) for its turn instead of failing or corrupting anything. A run waits as
long as it takes (`busy_timeout_s=None`), saying so; rows it cannot append yet may be
spooled to files beside the database (`spool`) and are appended exactly once later.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from breakout_core.common.files import write_whole
from breakout_core.common.messages import first_line
from runner.store import schema
from runner.store.errors import RunNotRunning, StoreBusy, StoreError, damage, damage_told, transaction

DEFAULT_DB = "results.duckdb"
RUN_STATUSES = ("running", "done", "failed", "interrupted")
FIRST_WAIT_NOTICE_S, WAIT_NOTICE_S = 5.0, 60.0  # a patient store says it waits after 5 s, then every minute
HEARTBEAT_S = 10.0  # a running run stamps runs.heartbeat_at this often
STALE_AFTER_S = 600.0  # a 'running' run without a heartbeat for this long is interrupted, wherever it ran


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return "lock" in text and ("conflicting" in text or "could not set" in text)


class Store:
    def __init__(self, path: str | Path | None = None, *, busy_timeout_s: float | None = 60.0,
                 on_wait: Callable[[str], None] | None = None):
        """`busy_timeout_s` None: wait however long another process holds the file, telling
        `on_wait` after FIRST_WAIT_NOTICE_S seconds, then every WAIT_NOTICE_S."""
        self.path = Path(path or os.environ.get("RUNNER_DB") or DEFAULT_DB)
        self.busy_timeout_s = busy_timeout_s
        self.on_wait = on_wait
        self._prepared = False

    # -- connections ---------------------------------------------------------------
    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    def _deadline(self, wait: bool) -> float | None:
        if not wait:
            return time.monotonic()
        return None if self.busy_timeout_s is None else time.monotonic() + self.busy_timeout_s

    def _still_busy(self, deadline: float | None, since: float, notices: list[float], why: str) -> None:
        """Raise StoreBusy past the deadline; a patient store says every WAIT_NOTICE_S that it waits."""
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            waited = f"waited {self.busy_timeout_s:g} s" if deadline > since else "not waiting"
            raise StoreBusy(f"{self.path}: busy — {waited} for {why}")
        if deadline is None and self.on_wait is not None and \
                now - (notices[-1] if notices else since) >= (WAIT_NOTICE_S if notices else FIRST_WAIT_NOTICE_S):
            notices.append(now)
            self.on_wait(f"{self.path}: another process has held it for {now - since:.0f} s ({why}); "
                         "waiting, nothing is lost")

    @contextlib.contextmanager
    def _process_lock(self, exclusive: bool, deadline: float | None) -> Iterator[None]:
        """An OS lock on a file beside the database, taken before DuckDB opens it.

        DuckDB's own lock does not cover creating the file: two writers that open a new
        database at once can both initialise it, and one's first batch is lost. Writers
        take this lock exclusively and readers shared, so creation, migration and appends
        are serialised. Where no lock file can be made (a read-only folder, a link
        planted in its place, never followed), DuckDB's own lock is all there is."""
        try:  # a reader makes no file: where no writer made the lock file, there is none to take
            never = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC  # a link is not followed, a FIFO does not block
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | never, 0o644) if exclusive else \
                os.open(self.lock_path, os.O_RDONLY | never)
        except OSError:
            yield
            return
        try:
            delay, since, notices = 0.01, time.monotonic(), []
            while True:
                try:
                    fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    self._still_busy(deadline, since, notices, "another runner process to release it")
                    time.sleep(delay)
                    delay = min(delay * 2, 0.25)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _connect(self, read_only: bool, deadline: float | None,
                 config: dict | None = None) -> duckdb.DuckDBPyConnection:
        """Open the file, waiting out DuckDB's lock (held by a process that is not a runner, e.g. the CLI)."""
        delay, since, notices = 0.02, time.monotonic(), []
        while True:
            try:
                return duckdb.connect(str(self.path), read_only=read_only, config=config or {})
            except duckdb.IOException as exc:
                if not _is_lock_error(exc):
                    raise damage(self.path, exc) from None
                self._still_busy(deadline, since, notices,
                                 f"another process to release it: {first_line(exc)}")
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
            except duckdb.Error as exc:
                raise StoreError(f"{self.path}: not a usable DuckDB database ({exc})") from None

    @contextlib.contextmanager
    def writer(self, *, wait: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short read-write connection; migrations run on the first one. With `wait` False it
        raises StoreBusy at once when another process holds the file."""
        deadline = self._deadline(wait)
        with self._process_lock(exclusive=True, deadline=deadline):
            con = self._connect(read_only=False, deadline=deadline)
            try:
                with damage_told(self.path):
                    if not self._prepared:
                        self._migrate(con)
                        self._recover_stale_runs(con)
                        self._append_left_spools(con)
                        self._prepared = True
                    yield con
            finally:
                con.close()

    @contextlib.contextmanager
    def reader(self, *, files: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection for one query; it never writes the file. With `files` False it
        can touch no file but the database (no COPY TO, EXPORT, ATTACH or read_csv): ad-hoc SQL
        a user types. The views are this runner's, made for this connection alone (temporary
        views shadow those an older runner left in the file); a file an older runner wrote,
        which lacks some of this runner's tables, is refused until a writing command upgrades it."""
        self.must_exist()
        deadline = self._deadline(wait=True)
        with self._process_lock(exclusive=False, deadline=deadline):
            con = self._connect(read_only=True, deadline=deadline,
                                config=None if files else {"enable_external_access": False})
            try:
                with damage_told(self.path):
                    self._check_version(con, reading=True)
                    for view in schema.views():
                        con.execute(_temporary(view))
                    yield con
            finally:
                con.close()

    def verify_readable(self) -> None:
        """Read every row of every table, so that a damaged file is refused before a run appends to
        it (DuckDB finds a bad block only when a query reads it). A missing file passes."""
        if not self.path.exists():
            return
        deadline = self._deadline(wait=True)
        with self._process_lock(exclusive=False, deadline=deadline):
            con = self._connect(read_only=True, deadline=deadline)
            try:
                with damage_told(self.path):
                    tables = [r[0] for r in con.execute(
                        "SELECT table_name FROM information_schema.tables WHERE table_type = 'BASE TABLE' "
                        "AND table_catalog = current_database()").fetchall()]
                    for table in tables:
                        con.execute(f'SELECT bit_xor(hash(t)) FROM "{table}" t').fetchall()
            finally:
                con.close()

    def remove_files(self) -> None:
        """Remove the database and the files beside it (its WAL, lock and spool)."""
        for path in (self.path, self.path.with_name(self.path.name + ".wal"), self.lock_path):
            path.unlink(missing_ok=True)
        shutil.rmtree(self.spool_root, ignore_errors=True)

    def must_exist(self) -> None:
        """Raise unless the database file is there: reading, or ending a run, never creates one."""
        if not self.path.exists():
            raise StoreError(f"{self.path}: no results database here yet (run a spec first, or pass --db)")

    # -- schema --------------------------------------------------------------------
    def _applied(self, con: duckdb.DuckDBPyConnection) -> list[str]:
        """The migrations applied; raise for a database of someone else's tables, which this
        runner must not add its own to."""
        names = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables "
                                           "WHERE table_catalog = current_database()").fetchall()}
        if names and "schema_migrations" not in names:
            raise StoreError(f"{self.path}: not a runner results database (it holds tables or views of its own, "
                             "and no schema_migrations)")
        con.execute("CREATE TABLE IF NOT EXISTS schema_migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMPTZ)")
        return [r[0] for r in con.execute("SELECT name FROM schema_migrations ORDER BY name").fetchall()]

    def _applied_names(self, con: duckdb.DuckDBPyConnection) -> list[str]:
        try:
            return [r[0] for r in con.execute("SELECT name FROM schema_migrations").fetchall()]
        except duckdb.CatalogException:
            raise StoreError(f"{self.path}: not a runner results database (no schema_migrations table)") from None

    def _check_version(self, con: duckdb.DuckDBPyConnection, reading: bool = False) -> None:
        """Refuse a file of a newer runner; `reading`, also one that lacks migrations of this one."""
        known = {name for name, _ in schema.migrations()}
        applied = self._applied_names(con)
        unknown = sorted(set(applied) - known)
        if unknown:
            raise StoreError(
                f"{self.path}: written by a newer runner (unknown migrations: {', '.join(unknown)}); upgrade runner"
            )
        missing = sorted(known - set(applied))
        if reading and missing:
            raise StoreError(f"{self.path}: written by an older runner (migrations {', '.join(missing)} not applied); "
                             "reading commands never write it: `runner migrate` upgrades it")

    def _migrate(self, con: duckdb.DuckDBPyConnection) -> None:
        applied = set(self._applied(con))
        self._check_version(con)
        for name, sql in schema.migrations():
            if name in applied:
                continue
            with transaction(con):
                con.execute(sql)
                con.execute("INSERT INTO schema_migrations VALUES (?, ?)", [name, utcnow()])
        for view in schema.views():
            con.execute(view)

    def schema_version(self) -> list[str]:
        """The migrations the file has, read without judging them (a file to upgrade has fewer)."""
        self.must_exist()
        deadline = self._deadline(wait=True)
        with self._process_lock(exclusive=False, deadline=deadline):
            con = self._connect(read_only=True, deadline=deadline)
            try:
                with damage_told(self.path):
                    return sorted(self._applied_names(con))
            finally:
                con.close()

    # -- runs ----------------------------------------------------------------------
    def stale_runs(self, con: duckdb.DuckDBPyConnection) -> dict[str, str]:
        """Runs left 'running' that have ended, with why: those of a process of this host that no
        longer exists, and those of any host without a heartbeat for STALE_AFTER_S (a process on
        a host gone for good, or a reused pid). A writer stores them as interrupted; a reader
        shows them so."""
        host, now = socket.gethostname(), utcnow()
        rows = con.execute("SELECT run_id, host, pid, coalesce(heartbeat_at, started_at) FROM runs "
                           "WHERE status = 'running'").fetchall()
        stale = {}
        for run_id, run_host, pid, beat in rows:
            if run_host == host and not _process_alive(pid):
                stale[run_id] = f"process {pid} on {host} ended without finishing the run (killed?)"
            elif (now - beat).total_seconds() > STALE_AFTER_S:
                stale[run_id] = (f"no heartbeat from process {pid} on {run_host} since {beat:%Y-%m-%d %H:%M:%S %Z} "
                                 f"(more than {STALE_AFTER_S:g} s): it ended without finishing the run")
        return stale

    def _recover_stale_runs(self, con: duckdb.DuckDBPyConnection) -> None:
        for run_id, error in self.stale_runs(con).items():
            con.execute("UPDATE runs SET status = 'interrupted', ended_at = ?, error = ? WHERE run_id = ?",
                        [utcnow(), error, run_id])

    def begin_run(self, row: dict) -> None:
        now = utcnow()
        self.append_rows("runs", [dict(row, status="running", started_at=now, heartbeat_at=now, pid=os.getpid())])

    def beat(self, run_id: str) -> bool:
        """Stamp this process's run as alive, if the database is free now; False when it is not.
        A run another process took for stale (its file held past STALE_AFTER_S) runs again."""
        try:
            with self.writer(wait=False) as con:
                con.execute("UPDATE runs SET heartbeat_at = ?, status = 'running', ended_at = NULL, error = NULL "
                            "WHERE run_id = ? AND pid = ? AND host = ? AND status IN ('running', 'interrupted')",
                            [utcnow(), run_id, os.getpid(), socket.gethostname()])
            return True
        except StoreBusy:
            return False

    def mark_interrupted(self, run_id: str, reason: str) -> str | None:
        """End a run stuck 'running' by hand; refused for a run that is done or failed. Return None
        once marked, or the error already stored where the run was interrupted before (opening
        the database marks a run whose process is gone at once)."""
        self.must_exist()
        with self.writer() as con:
            row = con.execute("SELECT status, error FROM runs WHERE run_id = ?", [run_id]).fetchone()
            if row is None:
                raise RunNotRunning(f"no run {run_id!r} in {self.path}")
            if row[0] == "interrupted":
                return row[1] or "interrupted"
            if row[0] != "running":
                raise RunNotRunning(f"run {run_id} is {row[0]}, not running")
            host, pid, beat = con.execute("SELECT host, pid, coalesce(heartbeat_at, started_at) FROM runs "
                                          "WHERE run_id = ?", [run_id]).fetchone()
            age = (utcnow() - beat).total_seconds()
            if age < 3 * HEARTBEAT_S:
                raise RunNotRunning(f"run {run_id} is alive: process {pid} on {host} beat {age:.0f} s ago; "
                                    "stop that process instead")
            con.execute("UPDATE runs SET status = 'interrupted', ended_at = ?, error = ? WHERE run_id = ?",
                        [utcnow(), reason, run_id])
        return None

    def unfinished_run(self, spec_name: str, spec_hash: str) -> str | None:
        """The latest interrupted or failed run of this exact spec text, if any."""
        if not self.path.exists():
            return None
        with self.writer() as con:  # a writer first closes runs whose process is gone
            row = con.execute(
                "SELECT run_id FROM runs WHERE spec_name = ? AND spec_hash = ? AND status IN ('interrupted', 'failed') "
                "ORDER BY started_at DESC LIMIT 1", [spec_name, spec_hash]).fetchone()
        return row[0] if row else None

    def reopen_run(self, run_id: str) -> None:
        with self.writer() as con:
            con.execute("UPDATE runs SET status = 'running', host = ?, pid = ?, heartbeat_at = ?, ended_at = NULL, "
                        "error = NULL WHERE run_id = ?", [socket.gethostname(), os.getpid(), utcnow(), run_id])

    def finish_run(self, run_id: str, status: str, error: str | None = None) -> None:
        if status not in RUN_STATUSES:
            raise ValueError(f"unknown status {status!r}")
        with self.writer() as con:
            con.execute(
                "UPDATE runs SET status = ?, ended_at = ?, error = ? WHERE run_id = ?",
                [status, utcnow(), error, run_id],
            )

    # -- appends -------------------------------------------------------------------
    def append_rows(self, table: str, rows: Sequence[dict]) -> int:
        """Append dict rows by column name in one transaction."""
        if not rows:
            return 0
        import pyarrow as pa

        return self.append_arrow(table, pa.Table.from_pylist(list(rows)))

    def append_together(self, rows_by_table: dict[str, Sequence[dict]]) -> None:
        """Append dict rows to several tables in one transaction: all of them are stored, or none."""
        import pyarrow as pa

        with self.writer() as con, transaction(con):
            for table, rows in rows_by_table.items():
                if rows:
                    insert_arrow(con, table, pa.Table.from_pylist(list(rows)))

    def append_arrow(self, table: str, data) -> int:
        """Append an Arrow table (or anything DuckDB can scan) by column name."""
        with self.writer() as con:
            insert_arrow(con, table, data)
        return len(data)

    # -- spooled rows ----------------------------------------------------------------
    @property
    def spool_root(self) -> Path:
        return self.path.with_name(self.path.name + ".spool")

    def spool(self, run_id: str, table: str, rows: Sequence[dict]) -> Path:
        """Write rows that cannot be appended yet to a file beside the database, durably (a kill
        or a power cut after this returns loses nothing); `append_spooled` appends them later."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        folder = self.spool_root / run_id
        path = folder / f"{time.time_ns():020d}-{os.getpid()}-{table}.parquet"  # appended in name order
        buffer = pa.BufferOutputStream()
        pq.write_table(pa.Table.from_pylist(list(rows)), buffer)
        write_whole(path, buffer.getvalue().to_pybytes())
        _fsync_dir(folder)
        return path

    def append_spooled(self, con: duckdb.DuckDBPyConnection, run_id: str) -> int:
        """Append a run's spool files, oldest first, each once; returns the rows appended."""
        folder = self.spool_root / run_id
        appended = 0
        for path in sorted(folder.glob("*.parquet")) if folder.is_dir() else []:
            batch = f"{run_id}/{path.name}"
            if not con.execute("SELECT count(*) FROM spooled_batches WHERE batch = ?", [batch]).fetchone()[0]:
                table = path.stem.split("-", 2)[2]
                with transaction(con):
                    n = con.execute(f'INSERT INTO "{table}" BY NAME SELECT * FROM read_parquet(?)',
                                    [str(path)]).fetchone()[0]
                    con.execute("INSERT INTO spooled_batches VALUES (?, ?, ?)", [batch, n, utcnow()])
                appended += n
            path.unlink()
        if folder.is_dir() and not any(folder.iterdir()):
            folder.rmdir()
        return appended

    def _append_left_spools(self, con: duckdb.DuckDBPyConnection) -> None:
        """Rows spooled by runs that no longer run (killed while the database was busy)."""
        if not self.spool_root.is_dir():
            return
        running = {r[0] for r in con.execute("SELECT run_id FROM runs WHERE status = 'running'").fetchall()}
        for folder in sorted(self.spool_root.iterdir()):
            if folder.is_dir() and folder.name not in running:
                self.append_spooled(con, folder.name)


def _temporary(view: str) -> str:
    """A view statement of the schema as a temporary view of one connection."""
    head = "CREATE OR REPLACE VIEW"
    statement = view.lstrip()
    if not statement.startswith(head):
        raise ValueError(f"a schema view must begin with {head!r}: {statement[:60]!r}")
    return "CREATE OR REPLACE TEMP VIEW" + statement[len(head):]


def insert_arrow(con: duckdb.DuckDBPyConnection, table: str, data) -> None:
    """Insert an Arrow table (or anything DuckDB can scan) into `table` by column name."""
    con.register("incoming_rows", data)
    try:
        con.execute(f'INSERT INTO "{table}" BY NAME SELECT * FROM incoming_rows')
    finally:
        con.unregister("incoming_rows")


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
