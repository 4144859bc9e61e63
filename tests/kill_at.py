"""Run the runner CLI in this process and kill it (SIGKILL, as `kill -9` does) just before a
chosen file event, or log every such event.

    python kill_at.py --log EVENTS_FILE -- run SPEC ...   # append "class" per event, run to the end
    python kill_at.py --kill CLASS N -- run SPEC ...      # SIGKILL before the N-th event of CLASS

Classes: `checkpoint` (a checkpoint file renamed into place), `state` (the trainer state
renamed into place), `database` (the runner opening the database's lock file: every append
and every read). A Python audit hook sees them, so the kill lands at an exact point of the
real program, not after a guessed sleep.
"""

from __future__ import annotations

import os
import signal
import sys


def event_class(event: str, args: tuple) -> str | None:
    if event == "os.rename":
        source = os.path.basename(str(args[0]))
        if source == "trainer_state.tmp":
            return "state"
        if source.endswith(".pt.tmp"):
            return "checkpoint"
    elif event == "open" and str(args[0]).endswith(".duckdb.lock"):
        return "database"
    return None


def main() -> None:
    split = sys.argv.index("--")
    options, cli_args = sys.argv[1:split], sys.argv[split + 1:]
    seen: dict[str, int] = {}
    if options[0] == "--log":
        log = open(options[1], "a", buffering=1)

        def hook(event: str, args: tuple) -> None:
            name = event_class(event, args)
            if name:
                log.write(name + "\n")
    else:
        target, nth = options[1], int(options[2])

        def hook(event: str, args: tuple) -> None:
            name = event_class(event, args)
            if name:
                seen[name] = seen.get(name, 0) + 1
                if name == target and seen[name] == nth:
                    os.kill(os.getpid(), signal.SIGKILL)

    sys.addaudithook(hook)
    from runner.cli import main as runner_main

    sys.argv = ["runner", *cli_args]
    runner_main()


if __name__ == "__main__":
    main()
