"""A spec file read for a command: its problems said as `runner run` says them, one `error:` line
each on standard error, and exit 2."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from runner.cli.exit_codes import ExitCode, fail


def load_or_exit(spec_path: Path, overrides: tuple[str, ...] = (), *, check_files: bool = True):
    """The spec at `spec_path` with `overrides` laid on it, or its problems said and exit 2.

    `check_files=False` validates everything but the files it names: what `runner check` and
    `runner convert` ask of the user's --set arguments before they read or play any file."""
    from runner.spec.document import SpecError, load_spec

    try:
        return load_spec(spec_path, overrides=overrides, check_files=check_files)
    except SpecError as exc:
        if not spec_path.exists():
            from runner.cli.run_ids import missing_spec_file

            fail(f"{exc.problems[0]}{missing_spec_file(spec_path)}", ExitCode.BAD_INPUT)
        for problem in exc.problems:
            click.echo(f"error: {problem}", err=True)
        sys.exit(ExitCode.BAD_INPUT)
