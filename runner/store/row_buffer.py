"""Rows a long computation writes as it goes, appended whenever the database is free.

A training must not stop, nor fail, because another process (a long `runner sql` query)
holds the database: it keeps its rows in memory, spools them to files beside the database
when it must not lose them (a trainer state is about to cover them) or when memory holds
too many, and appends them, oldest first, once the file is free again.
"""

from __future__ import annotations

import time
from typing import Callable

from runner.store.database import Store, insert_arrow
from runner.store.errors import StoreBusy, transaction

SPOOL_ROWS = 20_000  # rows kept in memory while the database is busy before they go to a spool file


class RowBuffer:
    def __init__(self, store: Store, run_id: str, log: Callable[[str], None]):
        self.store = store
        self.run_id = run_id
        self.log = log
        self.pending: dict[str, list[dict]] = {}
        self.busy_since: float | None = None

    def add(self, table: str, row: dict) -> None:
        self.pending.setdefault(table, []).append(row)

    def flush(self, *, durable: bool = False) -> None:
        """Append what is kept if the database is free now; otherwise keep it, spooled to disk
        when `durable` or when memory holds SPOOL_ROWS rows."""
        try:
            with self.store.writer(wait=False) as con:
                self._append(con)
            return
        except StoreBusy:
            pass
        waiting = sum(len(rows) for rows in self.pending.values())
        if self.busy_since is None:
            self.busy_since = time.monotonic()
            self.log(f"{self.store.path} is held by another process: keeping rows and appending them when it is free")
        if durable or waiting >= SPOOL_ROWS:
            for table, rows in self.pending.items():
                if rows:
                    self.store.spool(self.run_id, table, rows)
                    rows.clear()

    def close(self) -> None:
        """Append everything kept, waiting as long as the database stays busy."""
        with self.store.writer() as con:
            self._append(con)

    def _append(self, con) -> None:
        import pyarrow as pa

        kept = self.store.append_spooled(con, self.run_id)
        with transaction(con):
            for table, rows in self.pending.items():
                if rows:
                    insert_arrow(con, table, pa.Table.from_pylist(rows))
        if self.busy_since is not None:
            kept += sum(len(rows) for rows in self.pending.values())
            self.log(f"{self.store.path} is free again after {time.monotonic() - self.busy_since:.0f} s: "
                     f"appended {kept} kept rows")
            self.busy_since = None
        for rows in self.pending.values():
            rows.clear()
