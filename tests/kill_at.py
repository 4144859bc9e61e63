"""Runs of the runner CLI, each in its own process, killed (SIGKILL, as `kill -9` does) just
before a chosen file event, or logging every such event.

    python kill_at.py    # then one JSON request per line on stdin, one JSON reply per line

A request is {"cwd": folder, "args": [runner CLI arguments], "log": EVENTS_FILE or null,
"kill": [CLASS, N] or null}. Each request forks a child that changes to `cwd`, writes its
output to `cwd`/stdout.txt and stderr.txt, and runs the runner's CLI there: with "log", it
appends the class of every event to EVENTS_FILE, one a line (`database read` where the
opening is a reader's, which writes nothing); with "kill", it SIGKILLs itself before the
N-th event of CLASS. The reply is {"returncode": the child's exit status, negative for a
signal as in subprocess, "stderr": its error output}.

Classes: `checkpoint` (a checkpoint file renamed into place), `state` (the trainer state
renamed into place), `database` (the runner opening the database's lock file: every append
and every read). A Python audit hook sees them, so the kill lands at an exact point of the
real program, not after a guessed sleep.

Why a server that forks: importing torch (and the torch._dynamo that torch.optim pulls in)
costs seconds on a small machine, and a kill loop starts dozens of runs. This process imports
them and the runner once and runs no runner code itself, so that every child starts from the
same state, as a fresh `runner run` would (only the idle thread pools that numpy's OpenBLAS and
OpenCV start at import exist when it forks); each child is a process of its own that the kill
ends, as a `runner run` on the command line would be.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import traceback

# what a train run imports, imported once
import pandas  # noqa: F401
import pyarrow  # noqa: F401
import rich.progress  # noqa: F401
import torch._dynamo  # noqa: F401  (with torch; torch.optim imports it on a first step)

import breakout_core.evaluation.evaluator
import breakout_core.learning.trainer  # noqa: F401
import runner.kinds.train.executors
import runner.run.execute
import runner.run.verdicts
import runner.spec.file_checks
import runner.store.database
import runner.store.heartbeat
import runner.store.provenance
import runner.store.row_buffer  # noqa: F401
from runner.cli.commands import main as runner_main


def event_class(event: str, args: tuple) -> str | None:
    if event == "os.rename":
        source = os.path.basename(str(args[0]))  # breakout_core.common.files writes NAME.PID.TOKEN.tmp, then renames it
        if source.startswith("trainer_state.pt.") and source.endswith(".tmp"):
            return "state"
        if source.endswith(".tmp") and ".pt." in source:
            return "checkpoint"
    elif event == "open" and str(args[0]).endswith(".duckdb.lock"):
        return "database"
    return None


def reads_only(event: str, args: tuple) -> bool:
    """A database opening by a reader: the lock file opened read-only (a writer opens it to write)."""
    return event == "open" and isinstance(args[2], int) and not args[2] & (os.O_WRONLY | os.O_RDWR)


def install_hook(log: str | None, kill: list | None) -> None:
    seen: dict[str, int] = {}
    if log:
        log_file = open(log, "a", buffering=1)

        def hook(event: str, args: tuple) -> None:
            name = event_class(event, args)
            if name:
                log_file.write(name + (" read" if reads_only(event, args) else "") + "\n")
    elif kill:
        target, nth = kill[0], int(kill[1])

        def hook(event: str, args: tuple) -> None:
            name = event_class(event, args)
            if name:
                seen[name] = seen.get(name, 0) + 1
                if name == target and seen[name] == nth:
                    os.kill(os.getpid(), signal.SIGKILL)
    else:
        return
    sys.addaudithook(hook)


def child(request: dict) -> int:
    """The runner's CLI as `python -m runner` would run it; returns its exit status."""
    os.chdir(request["cwd"])
    for fd, name, flags in ((0, os.devnull, os.O_RDONLY), (1, "stdout.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC),
                            (2, "stderr.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)):
        file = os.open(name, flags, 0o644)
        os.dup2(file, fd)
        os.close(file)
    install_hook(request.get("log"), request.get("kill"))
    sys.argv = ["runner", *request["args"]]
    try:
        runner_main()
        return 0
    except SystemExit as exc:
        if exc.code is None or isinstance(exc.code, int):
            return exc.code or 0
        print(exc.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def serve() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            os._exit(child(request))
        _, status = os.waitpid(pid, 0)
        stderr_path = os.path.join(request["cwd"], "stderr.txt")
        stderr = open(stderr_path).read() if os.path.exists(stderr_path) else ""
        print(json.dumps({"returncode": -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status),
                          "stderr": stderr}), flush=True)


if __name__ == "__main__":
    serve()
