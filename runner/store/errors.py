"""What goes wrong with the results database that a user can act on, and which DuckDB errors
come from the file itself (damaged, unreadable, out of space) rather than from a query.

A full disk is told from the first error it caused: a COMMIT that fails for want of space
ends its transaction, so the ROLLBACK after it fails too ("cannot rollback - no transaction
is active"), and a run's later writes fail in their own words; `transaction` keeps the first
error, and `no_space_left` finds ENOSPC anywhere in an exception's chain."""

from __future__ import annotations

import contextlib
import errno
import re
from collections.abc import Iterator
from pathlib import Path

import duckdb

from breakout_core.common.files import NoSpaceLeft
from breakout_core.common.messages import first_line

_NO_SPACE = "no space left on device"
_UNNAMED = "a file whose writer did not name it"
_QUOTED_FILE = re.compile(r'file "([^"]+)"')  # DuckDB: 'Could not write file "/x/r.duckdb.wal": No space ...'


class StoreError(RuntimeError):
    """A database problem a user can act on (busy, missing, newer schema)."""


class StoreBusy(StoreError):
    """Another process holds the file, past the time this store may wait for it."""


class NoSuchRun(StoreError):
    """A run asked for by id or spec that the database does not hold."""


class RunNotRunning(StoreError):
    """A run that cannot be marked interrupted: unknown, or not running."""


class StoredRowChanged(StoreError):
    """A stored row that fails a check its own stored fields make (a key that is not the sha256
    of what it says it keys, a game unlike the one recorded when it was played): edited after it
    was stored, so nothing is read from it."""


class StoreDamaged(StoreError):
    """The file cannot be read back (truncated, a block whose checksum fails, an IO error) or
    written (no space left on the device)."""


def damage(path: Path, exc: duckdb.Error) -> StoreDamaged | None:
    """The user-facing error for a DuckDB error that comes from the file rather than from a
    query: None for an error of the SQL itself (a typo, a missing table)."""
    text = first_line(exc)
    if _NO_SPACE in text.lower():
        return StoreDamaged(str(_no_space_in_text(text, path)))
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


@contextlib.contextmanager
def transaction(con: duckdb.DuckDBPyConnection) -> Iterator[None]:
    """BEGIN, the block, COMMIT; on any error a ROLLBACK, and the error raised is the block's or
    the COMMIT's: a ROLLBACK that fails after it (the transaction already ended) is not told."""
    con.execute("BEGIN")
    try:
        yield
        con.execute("COMMIT")
    except BaseException:
        with contextlib.suppress(duckdb.Error):
            con.execute("ROLLBACK")
        raise


def no_space_left(exc: BaseException, database: Path | None = None) -> NoSpaceLeft | None:
    """NoSpaceLeft naming the file that could not be written where ENOSPC caused `exc` or any
    exception before it in its chain (its cause or context); None where none did. The first
    one raised that names its file is told (a library's OSError often names none, the
    NoSpaceLeft made of it does). `database`: the file a DuckDB error that names none is about."""
    chain, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    found = [told for earlier in reversed(chain) if (told := _no_space(earlier, database)) is not None]
    return next((told for told in found if told.filename != _UNNAMED), found[0] if found else None)


def _no_space(exc: BaseException, database: Path | None) -> NoSpaceLeft | None:
    if isinstance(exc, NoSpaceLeft):
        return exc
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return NoSpaceLeft(exc.filename or _UNNAMED)
    if isinstance(exc, (duckdb.Error, StoreDamaged)) and _NO_SPACE in str(exc).lower():
        return _no_space_in_text(first_line(exc), database)
    return None


def _no_space_in_text(text: str, path: Path | None) -> NoSpaceLeft:
    """The file a DuckDB error (or a StoreDamaged made of one) says it could not write, else `path`."""
    quoted = _QUOTED_FILE.search(text)
    told = text.lower().partition(f"{_NO_SPACE}: ")[2]
    named = quoted.group(1) if quoted else (text[len(text) - len(told):] if told else None)
    return NoSpaceLeft(named or path or _UNNAMED)
