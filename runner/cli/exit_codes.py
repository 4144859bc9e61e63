"""What `runner`'s exit status means: one meaning per code, so that a script or a CI job can
tell a verdict that said no from a typo and from a broken machine. README.md has the table."""

from __future__ import annotations

import sys
from enum import IntEnum
from typing import NoReturn

import click


class ExitCode(IntEnum):
    OK = 0
    """The command did what it was asked; a run finished (whatever its verdicts, unless `--fail-on`)."""

    SAID_NO = 1
    """A verdict or a comparison said no: `run --fail-on` met an outcome it names, or
    `compare --fail-on-regression` found a regression or nothing it could judge."""

    BAD_INPUT = 2
    """The request is wrong: a spec, an argument, an unknown or ambiguous run id, an unknown spec
    name, a folder that cannot be written where the user pointed, a model file that cannot be
    measured (Q-values NaN or inf, before the run or during it)."""

    ENVIRONMENT = 3
    """The environment failed: the database is missing, locked past the wait, damaged or of a
    newer runner; a run failed (a runtime that crashed); no space left on the device."""

    INTERRUPTED = 130
    """Ctrl-C or SIGTERM stopped a run; it is stored as interrupted."""


def fail(message: str, code: ExitCode) -> NoReturn:
    """Say `message` on one line of standard error and exit with `code`."""
    click.echo(f"error: {message}", err=True)
    sys.exit(int(code))


def store_error_code(exc: Exception) -> ExitCode:
    """A store error that names something the database does not hold, or a transfer the user's
    folder or run does not fit, is the request's fault; any other (missing file, busy, damaged,
    newer schema) is the environment's."""
    from runner.store.errors import NoSuchRun, RunNotRunning
    from runner.store.transfer import TransferRefused

    return ExitCode.BAD_INPUT if isinstance(exc, (NoSuchRun, RunNotRunning, TransferRefused)) \
        else ExitCode.ENVIRONMENT
