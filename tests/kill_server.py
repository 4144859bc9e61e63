"""The client side of tests/kill_at.py: one server for a test, asked one run at a time."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path


class KillServer:
    """`with KillServer(limit_s) as server: server.ask(folder, args, log=..., kill=...)`: each run
    of the runner CLI in `folder`, in a process of its own, its {"returncode", "stderr"} as
    kill_at.py replies. A server still busy after `limit_s` is killed: its reply then reads empty."""

    def __init__(self, limit_s: float):
        self.server = subprocess.Popen([sys.executable, str(Path(__file__).parent / "kill_at.py")], text=True,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.limit = threading.Timer(limit_s, self.server.kill)
        self.limit.start()

    def ask(self, folder: Path, args: list[str], log: Path | None = None, kill: list | None = None) -> dict:
        self.server.stdin.write(json.dumps({"cwd": str(folder), "args": args, "log": log and str(log),
                                            "kill": kill}) + "\n")
        self.server.stdin.flush()
        return json.loads(self.server.stdout.readline())

    def __enter__(self) -> "KillServer":
        return self

    def __exit__(self, *exc) -> None:
        self.limit.cancel()
        self.server.stdin.close()
        self.server.wait(timeout=60)
