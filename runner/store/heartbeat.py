"""A run's heartbeat: a thread stamping `runs.heartbeat_at` while the run's process lives.

A run whose process died where no one can check its pid (another host, a container
restarted under a new hostname) or whose pid was reused stops beating; any runner that
opens the database for writing then ends it as interrupted (`Store._recover_stale_runs`).
"""

from __future__ import annotations

import threading

from runner.store.database import HEARTBEAT_S, Store


class Heartbeat:
    def __init__(self, store: Store, run_id: str, every_s: float = HEARTBEAT_S):
        self.store, self.run_id, self.every_s = store, run_id, every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {run_id}", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def _beat(self) -> None:
        while not self._stop.wait(self.every_s):
            self.store.beat(self.run_id)  # skipped while another process holds the file
