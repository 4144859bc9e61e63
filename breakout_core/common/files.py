"""Writing a file whole or not at all, publishing a finished file in one rename, and saying
plainly when the disk is full.

Every file the project writes for a reader to find later (ONNX exports, INT8 and FP16 files,
checkpoints, trainer state, fixed states, spooled rows, reports) is written to a temporary
file beside its target, flushed to disk, checked where its writer checks it, then renamed
over the target: a reader never sees half a file, and a write or a check that fails removes
the temporary file and leaves the old target as it was. A library that writes a path itself
(onnx, ONNX Runtime's quantizer) is handed the temporary path (`written_whole`), never the
target. A full disk is told as `NoSpaceLeft` naming the target rather than as whatever the
writing library made of ENOSPC (torch says 'unexpected pos').
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class NoSpaceLeft(OSError):
    """ENOSPC while writing `filename`; its text is 'no space left on device: PATH'."""

    def __init__(self, path: str | Path):
        super().__init__(errno.ENOSPC, "no space left on device", str(path))

    def __str__(self) -> str:
        return f"no space left on device: {self.filename}"


class FileReplaced(OSError):
    """The file at a path was replaced by another while it was read: what was read is unknown."""

    def __init__(self, path: str | Path):
        super().__init__(errno.ESTALE, "replaced by another file while it was read", str(path))

    def __str__(self) -> str:
        return f"{self.filename}: replaced by another file while it was read; read it again"


def is_no_space(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC


def partial_path(path: Path) -> Path:
    """A temporary name beside `path`, unique to this writer: NAME.PID.TOKEN.tmp."""
    return path.with_name(f"{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


@contextlib.contextmanager
def written_whole(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside `path` for the caller to write (and check) the file at;
    when the block ends without an exception, the file is fsync'd and renamed over `path`.
    Any exception in the block, or in the flush or rename, removes the temporary file and
    leaves `path` as it was; ENOSPC is raised as `NoSpaceLeft(path)`."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if is_no_space(exc):
            raise NoSpaceLeft(path) from None
        raise
    partial = partial_path(path)
    try:
        yield partial
        if not partial.is_file():
            raise FileNotFoundError(errno.ENOENT, "nothing was written", str(path))
        fd = os.open(partial, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(partial, path)
        _fsync_folder(path.parent)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        if is_no_space(exc):
            raise NoSpaceLeft(path) from None
        raise


def write_whole(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file beside it, fsync'd, then renamed."""
    path = Path(path)
    with written_whole(path) as partial, open(partial, "wb") as out:
        out.write(data)
    return path


def publish(source: str | Path, target: str | Path) -> Path:
    """Put the finished file `source` at `target` in one rename, `source` kept as it is.

    The file is hard-linked (copied, where the two are on different file systems) to a
    temporary name beside `target`, then renamed over it: a reader of `target` sees the old
    file or the whole new one. Files here are never changed in place, so the two names may
    share the one file."""
    source, target = Path(source), Path(target)
    with written_whole(target) as partial:
        try:
            os.link(source, partial)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                raise
            shutil.copyfile(source, partial)
    return target


def file_identity(path: str | Path) -> tuple[int, int, int, int]:
    """What tells one file at `path` from the next one renamed over it: device, inode, size and
    modification time."""
    info = os.stat(path)
    return info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns


@contextlib.contextmanager
def same_file(path: str | Path) -> Iterator[None]:
    """Raise `FileReplaced` when the file at `path`, or one of the external data files of the
    ONNX model there, after the block is not the one before it: what the block read (a hash, then
    a load) came from those files."""
    from breakout_core.common.external_data import data_files

    files = [Path(path)]
    before = [file_identity(path)]  # before the model is read for its data files: a later one is told
    files += data_files(path)
    before += [file_identity(file) for file in files[1:]]
    yield
    for file, identity in zip(files, before):
        try:
            after = file_identity(file)
        except FileNotFoundError:
            after = None
        if after != identity:
            raise FileReplaced(file)


def torch_bytes(payload: Any) -> bytes:
    """A torch.save payload as bytes, so that `write_whole` does the writing (and its errors)."""
    import torch

    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def _fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable (where the platform lets a folder be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
