"""Several `runner` commands in one fresh process of their own, one after another.

For what only a process of its own shows (what it leaves in a file once it has exited, a
crash that must not take the test with it) without paying its imports once per command:
each command runs through click's CliRunner as `runner` would, and the process reports, per
command, its exit status, its error output, whether it ended by exiting (not by an exception
it let through, a traceback in a real process) and the SHA-256 of a file after it."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

_BATCH = """
import hashlib, json, sys
from pathlib import Path
from click.testing import CliRunner
from runner.cli.commands import main

watched = Path(sys.argv[1])
for command in json.loads(sys.stdin.read()):
    result = CliRunner().invoke(main, command)
    digest = hashlib.sha256(watched.read_bytes()).hexdigest() if watched.exists() else None
    print("outcome", json.dumps({"args": command, "exit_code": result.exit_code, "stdout": result.stdout,
                      "stderr": result.stderr, "exited": result.exception is None
                      or isinstance(result.exception, SystemExit), "sha256": digest}), flush=True)
"""


@dataclass(frozen=True)
class Outcome:
    args: list[str]
    exit_code: int
    stdout: str
    stderr: str
    exited: bool  # ended by exiting, not by an exception it let through
    sha256: str | None  # of the watched file after the command, None where there is none


def run_in_one_process(commands: list[list[str]], cwd: Path, watched: Path, timeout: float = 600) -> list[Outcome]:
    """Each of `commands` (the arguments after `runner`), in order, in one new Python process
    started in `cwd`; the process must exit 0 once they are done."""
    done = subprocess.run([sys.executable, "-c", _BATCH, str(watched)], input=json.dumps(commands), cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return [Outcome(**json.loads(line.removeprefix("outcome "))) for line in done.stdout.splitlines()
            if line.startswith("outcome ")]
