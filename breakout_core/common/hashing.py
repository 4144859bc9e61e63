"""The sha256 of a file, read in 1 MiB chunks: how every artifact (checkpoint, ONNX file,
fixed states) is identified in rows and metadata. An ONNX model whose weights are external data
is identified by its content (`model_sha256`): the model file with every data file it reads."""

from __future__ import annotations

import hashlib
from pathlib import Path


def file_sha256(path: str | Path) -> str:
    """The sha256 of one file's bytes."""
    digest = hashlib.sha256()
    _update(digest, path)
    return digest.hexdigest()


def model_sha256(path: str | Path) -> str:
    """The sha256 of every byte a model at `path` is read from: `file_sha256(path)` for a file with
    no external data (any file that is not such an ONNX model); else the sha256 over the model
    file's size and bytes, then, in the order of their names, each data file's name (relative to
    the model's folder), size and bytes. ExternalDataRefused for data outside the model's folder."""
    from breakout_core.common.external_data import data_files

    path = Path(path)
    data = data_files(path)
    if not data:
        return file_sha256(path)
    digest = hashlib.sha256()
    for file, name in [(path, ""), *((file, file.relative_to(path.parent).as_posix()) for file in data)]:
        digest.update(f"{name}\0{file.stat().st_size}\0".encode())
        _update(digest, file)
    return digest.hexdigest()


def _update(digest, path: str | Path) -> None:
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
