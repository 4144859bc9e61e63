"""Quoting a library's or another process's message inside a one-line error.

Library messages often run over several lines (DuckDB's SQL errors, YAML's marks, protobuf's
dumps), and some are empty; a one-line error quotes the line that says what went wrong.
"""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

FIRST_FEW = 3  # the items of a long list that a one-line error names


def first_line(message: object, empty: str = "no message") -> str:
    """The first non-blank line of `message` (an exception or a text), or `empty`; with the line
    after it where it ends in a colon, as torch's 'Error(s) in loading state_dict for QNetwork:'
    does before saying which keys."""
    lines = [line.strip() for line in str(message).splitlines() if line.strip()]
    if not lines:
        return empty
    return f"{lines[0]} {lines[1]}" if lines[0].endswith(":") and len(lines) > 1 else lines[0]


def described(exc: BaseException, empty: str = "no message") -> str:
    """An exception as its type and the first line of its message: 'ValueError: bad value'."""
    return f"{exc.__class__.__name__}: {first_line(exc, empty)}"


def last_line(text: str, empty: str = "no message") -> str:
    """The last non-blank line of `text`: where a Python traceback, or a Python process's
    stderr, says what ended it."""
    return next((line.strip() for line in reversed(text.splitlines()) if line.strip()), empty)


def process_failure(what: str, finished: subprocess.CompletedProcess) -> str:
    """Why a process failed, in one line: its exit status and the last line of its stderr."""
    return f"{what} failed (exit {finished.returncode}): {last_line(finished.stderr or '')}"


def some_of(items: Sequence[str], joiner: str, first: int = FIRST_FEW) -> str:
    """The first `first` of `items` joined by `joiner`, then '... and N more' where there are
    more: a one-line error names a few of a long list (a 10,000-trial sweep's), not all."""
    shown = joiner.join(items[:first])
    return shown if len(items) <= first else f"{shown} ... and {len(items) - first:,} more"
