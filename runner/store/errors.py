"""What goes wrong with the results database that a user can act on, and which DuckDB errors
come from the file itself (damaged, unreadable, out of space) rather than from a query."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import duckdb

from breakout_core.messages import first_line


class StoreError(RuntimeError):
    """A database problem a user can act on (busy, missing, newer schema)."""


class StoreBusy(StoreError):
    """Another process holds the file, past the time this store may wait for it."""


class NoSuchRun(StoreError):
    """A run asked for by id or spec that the database does not hold."""


class RunNotRunning(StoreError):
    """A run that cannot be marked interrupted: unknown, or not running."""


class StoreDamaged(StoreError):
    """The file cannot be read back (truncated, a block whose checksum fails, an IO error) or
    written (no space left on the device)."""


def damage(path: Path, exc: duckdb.Error) -> StoreDamaged | None:
    """The user-facing error for a DuckDB error that comes from the file rather than from a
    query: None for an error of the SQL itself (a typo, a missing table)."""
    text = first_line(exc)
    if "no space left on device" in text.lower():
        return StoreDamaged(f"no space left on device: {path} ({text})")
    if isinstance(exc, (duckdb.IOException, duckdb.InternalException, duckdb.FatalException,
                        duckdb.SerializationException)) or "corrupt" in text.lower() or "checksum" in text.lower():
        return StoreDamaged(f"{path}: damaged or unreadable ({text})")
    return None


@contextlib.contextmanager
def damage_told(path: Path) -> Iterator[None]:
    """DuckDB errors of the file itself raised inside the block become StoreDamaged."""
    try:
        yield
    except duckdb.Error as exc:
        told = damage(path, exc)
        if told is None:
            raise
        raise told from None
