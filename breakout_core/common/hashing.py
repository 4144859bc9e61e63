"""The sha256 of a file, read in 1 MiB chunks: how every artifact (checkpoint, ONNX file,
fixed states) is identified in rows and metadata."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
