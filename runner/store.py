"""The results database: an append-only DuckDB file with ordered, recorded migrations.

DuckDB lets one process hold a file for writing and then no other process may open it,
not even to read. So nothing keeps a connection open: a writer opens the file, appends a
batch and closes it; a reader opens it read-only for one query. A long `runner run`
therefore leaves the file free between its batches, and a second process waits (up to
`busy_timeout_s`) for its turn instead of failing or corrupting anything.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterator, Sequence

import duckdb

DEFAULT_DB = "results.duckdb"
RUN_STATUSES = ("running", "done", "failed", "interrupted")

CORE_MIGRATIONS: list[tuple[str, str]] = [
    (
        "0001_runs",
        """
        CREATE TABLE runs (
            run_id VARCHAR PRIMARY KEY,
            spec_name VARCHAR NOT NULL,
            spec_path VARCHAR,
            spec_hash VARCHAR NOT NULL,
            spec_text VARCHAR NOT NULL,
            git_commit VARCHAR,
            contract_hash VARCHAR,
            contract JSON,
            host VARCHAR NOT NULL,
            pid INTEGER NOT NULL,
            cpu VARCHAR,
            gpu VARCHAR,
            packages JSON,
            started_at TIMESTAMPTZ NOT NULL,
            ended_at TIMESTAMPTZ,
            status VARCHAR NOT NULL CHECK (status IN ('running', 'done', 'failed', 'interrupted')),
            error VARCHAR
        );
        CREATE TABLE verdicts (
            run_id VARCHAR NOT NULL,
            verdict VARCHAR NOT NULL,
            measurement VARCHAR NOT NULL,
            candidate VARCHAR NOT NULL,
            baseline VARCHAR NOT NULL,
            outcome VARCHAR NOT NULL CHECK (outcome IN ('deployment-worthy', 'rejected', 'inconclusive', 'unavailable')),
            reason VARCHAR NOT NULL,
            evidence JSON NOT NULL,
            decided_at TIMESTAMPTZ NOT NULL
        );
        CREATE TABLE artifacts (
            run_id VARCHAR NOT NULL,
            measurement VARCHAR NOT NULL,
            label VARCHAR NOT NULL,
            path VARCHAR NOT NULL,
            bytes BIGINT NOT NULL
        );
        """,
    ),
]

CORE_VIEWS = [
    """
    CREATE OR REPLACE VIEW latest_verdicts AS  -- per machine and contract: one never stands in for another
    SELECT v.*, r.spec_name, r.started_at, r.host, r.contract_hash
    FROM verdicts v JOIN runs r USING (run_id)
    QUALIFY row_number() OVER (PARTITION BY r.spec_name, v.verdict, r.host, r.contract_hash
                               ORDER BY v.decided_at DESC) = 1
    """,
]


class StoreError(RuntimeError):
    """A database problem a user can act on (busy, missing, newer schema)."""


@dataclass(frozen=True)
class Migration:
    name: str
    sql: str


def _all_migrations() -> list[Migration]:
    from runner import play
    from runner.kinds import KINDS

    migrations = [Migration(n, s) for n, s in CORE_MIGRATIONS]
    for kind in KINDS.values():
        migrations += [Migration(n, s) for n, s in kind.migrations]
    return migrations + [Migration(n, s) for n, s in play.MIGRATIONS]


def _all_views() -> list[str]:
    from runner.kinds import KINDS

    return CORE_VIEWS + [v for kind in KINDS.values() for v in kind.views]


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _is_lock_error(exc: Exception) -> bool:
    text = str(exc).lower()
    return "lock" in text and ("conflicting" in text or "could not set" in text)


class Store:
    def __init__(self, path: str | Path | None = None, *, busy_timeout_s: float = 60.0):
        self.path = Path(path or os.environ.get("RUNNER_DB") or DEFAULT_DB)
        self.busy_timeout_s = busy_timeout_s
        self._prepared = False

    # -- connections ---------------------------------------------------------------
    @property
    def lock_path(self) -> Path:
        return self.path.with_name(self.path.name + ".lock")

    @contextlib.contextmanager
    def _process_lock(self, exclusive: bool, deadline: float) -> Iterator[None]:
        """An OS lock on a file beside the database, taken before DuckDB opens it.

        DuckDB's own lock does not cover creating the file: two writers that open a new
        database at once can both initialise it, and one's first batch is lost. Writers
        take this lock exclusively and readers shared, so creation, migration and appends
        are serialised. Where no lock file can be made (a read-only folder), DuckDB's own
        lock is all there is."""
        try:
            fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:
            yield
            return
        try:
            delay = 0.01
            while True:
                try:
                    fcntl.flock(fd, (fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH) | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise StoreError(f"{self.path}: busy — waited {self.busy_timeout_s:g} s for another "
                                         "runner process to release it") from None
                    time.sleep(delay)
                    delay = min(delay * 2, 0.25)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _connect(self, read_only: bool, deadline: float, config: dict | None = None) -> duckdb.DuckDBPyConnection:
        """Open the file, waiting out DuckDB's lock (held by a process that is not a runner, e.g. the CLI)."""
        delay = 0.02
        while True:
            try:
                return duckdb.connect(str(self.path), read_only=read_only, config=config or {})
            except duckdb.IOException as exc:
                if not _is_lock_error(exc):
                    raise StoreError(f"{self.path}: cannot open ({exc})") from None
                if time.monotonic() >= deadline:
                    raise StoreError(
                        f"{self.path}: busy — waited {self.busy_timeout_s:g} s for another process to release it "
                        f"({str(exc).splitlines()[0]})"
                    ) from None
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
            except duckdb.Error as exc:
                raise StoreError(f"{self.path}: not a usable DuckDB database ({exc})") from None

    @contextlib.contextmanager
    def writer(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short read-write connection; migrations run on the first one."""
        deadline = time.monotonic() + self.busy_timeout_s
        with self._process_lock(exclusive=True, deadline=deadline):
            con = self._connect(read_only=False, deadline=deadline)
            try:
                if not self._prepared:
                    self._migrate(con)
                    self._recover_stale_runs(con)
                    self._prepared = True
                yield con
            finally:
                con.close()

    @contextlib.contextmanager
    def reader(self, *, files: bool = True) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection for one query. With `files` False it can touch no file but the
        database (no COPY TO, EXPORT, ATTACH or read_csv): ad-hoc SQL a user types."""
        if not self.path.exists():
            raise StoreError(f"{self.path}: no results database here yet (run a spec first, or pass --db)")
        if not self._prepared and os.access(self.path, os.W_OK):
            # migrations and views as this runner defines them: after an upgrade, a query or a
            # report must not read the views an older runner left (a file we may not write is read as it is)
            with self.writer():
                pass
        deadline = time.monotonic() + self.busy_timeout_s
        with self._process_lock(exclusive=False, deadline=deadline):
            con = self._connect(read_only=True, deadline=deadline,
                                config=None if files else {"enable_external_access": False})
            try:
                self._check_version(con)
                yield con
            finally:
                con.close()

    # -- schema --------------------------------------------------------------------
    def _applied(self, con: duckdb.DuckDBPyConnection) -> list[str]:
        con.execute("CREATE TABLE IF NOT EXISTS schema_migrations (name VARCHAR PRIMARY KEY, applied_at TIMESTAMPTZ)")
        return [r[0] for r in con.execute("SELECT name FROM schema_migrations ORDER BY name").fetchall()]

    def _check_version(self, con: duckdb.DuckDBPyConnection) -> None:
        known = {m.name for m in _all_migrations()}
        try:
            applied = [r[0] for r in con.execute("SELECT name FROM schema_migrations").fetchall()]
        except duckdb.CatalogException:
            raise StoreError(f"{self.path}: not a runner results database (no schema_migrations table)") from None
        unknown = sorted(set(applied) - known)
        if unknown:
            raise StoreError(
                f"{self.path}: written by a newer runner (unknown migrations: {', '.join(unknown)}); upgrade runner"
            )

    def _migrate(self, con: duckdb.DuckDBPyConnection) -> None:
        applied = set(self._applied(con))
        self._check_version(con)
        for migration in sorted(_all_migrations(), key=lambda m: m.name):
            if migration.name in applied:
                continue
            con.execute("BEGIN")
            try:
                con.execute(migration.sql)
                con.execute("INSERT INTO schema_migrations VALUES (?, ?)", [migration.name, utcnow()])
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
        for view in _all_views():
            con.execute(view)

    def schema_version(self) -> list[str]:
        with self.reader() as con:
            return [r[0] for r in con.execute("SELECT name FROM schema_migrations ORDER BY name").fetchall()]

    # -- runs ----------------------------------------------------------------------
    def _recover_stale_runs(self, con: duckdb.DuckDBPyConnection) -> None:
        """Runs left 'running' by a process of this host that no longer exists end as interrupted."""
        host = socket.gethostname()
        rows = con.execute("SELECT run_id, pid FROM runs WHERE status = 'running' AND host = ?", [host]).fetchall()
        for run_id, pid in rows:
            if not _process_alive(pid):
                con.execute(
                    "UPDATE runs SET status = 'interrupted', ended_at = ?, error = ? WHERE run_id = ?",
                    [utcnow(), f"process {pid} on {host} ended without finishing the run (killed?)", run_id],
                )

    def begin_run(self, row: dict) -> None:
        self.append_rows("runs", [dict(row, status="running", started_at=utcnow(), pid=os.getpid())])

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
            con.execute("UPDATE runs SET status = 'running', pid = ?, ended_at = NULL, error = NULL WHERE run_id = ?",
                        [os.getpid(), run_id])

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

    def append_arrow(self, table: str, data) -> int:
        """Append an Arrow table (or anything DuckDB can scan) by column name."""
        with self.writer() as con:
            con.register("incoming_rows", data)
            try:
                con.execute(f'INSERT INTO "{table}" BY NAME SELECT * FROM incoming_rows')
            finally:
                con.unregister("incoming_rows")
        return len(data)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
