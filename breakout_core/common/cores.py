"""The CPU cores this process may use."""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Logical CPUs this process may run on: its affinity mask where the OS keeps one (a
    container's or `taskset`'s limit shows there), else the machine's count."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
