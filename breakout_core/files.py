"""Writing a file whole or not at all, and saying plainly when the disk is full.

Every file the project writes for a reader to find later (checkpoints, trainer state, fixed
states, spooled rows, reports) is written to a temporary file beside its target, flushed to
disk, then renamed over the target: a reader never sees half a file. On any failure the
temporary file is removed, and a full disk is told as `NoSpaceLeft` naming the target rather
than as whatever the writing library made of ENOSPC (torch says 'unexpected pos').
"""

from __future__ import annotations

import errno
import io
import os
from contextlib import suppress
from pathlib import Path
from typing import Any


class NoSpaceLeft(OSError):
    """ENOSPC while writing `filename`; its text is 'no space left on device: PATH'."""

    def __init__(self, path: str | Path):
        super().__init__(errno.ENOSPC, "no space left on device", str(path))

    def __str__(self) -> str:
        return f"no space left on device: {self.filename}"


def is_no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC


def write_whole(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file beside it, fsync'd, then renamed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        with open(partial, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        partial.replace(path)
    except OSError as exc:
        with suppress(OSError):
            partial.unlink(missing_ok=True)
        if is_no_space(exc):
            raise NoSpaceLeft(path) from None
        raise
    return path


def torch_bytes(payload: Any) -> bytes:
    """A torch.save payload as bytes, so that `write_whole` does the writing (and its errors)."""
    import torch

    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()
