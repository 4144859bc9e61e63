"""The CPU's instruction-set flags and model name, read once from /proc/cpuinfo.

What runs fast here depends on them: INT8 dot products (VNNI, AMX) for ONNX Runtime, bf16
matrix units (AMX) for the learner. Every reader of the flags asks this module.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path


@lru_cache(maxsize=1)
def _cpuinfo() -> tuple[frozenset[str], str | None]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        text = ""
    flags: frozenset[str] = frozenset()
    model = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = frozenset(value.split())
        elif key == "model name" and model is None:
            model = value.strip()
    return flags, model


def cpu_flags() -> frozenset[str]:
    """The first CPU's flags (`avx2`, `amx_bf16`, ...); empty where they cannot be read (no
    /proc/cpuinfo, or a CPU that lists no x86 flags)."""
    return _cpuinfo()[0]


def cpu_model() -> str | None:
    """The first CPU's model name, or None where /proc/cpuinfo does not say."""
    return _cpuinfo()[1]
