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

No file is written through a symbolic link: a temporary file is created new (O_EXCL,
O_NOFOLLOW) and the rename replaces a link at the target rather than writing where it points.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any


class NoSpaceLeft(OSError):
    """ENOSPC while writing `filename`; its text is 'no space left on device: PATH'."""

    def __init__(self, path: str | Path):
        super().__init__(errno.ENOSPC, "no space left on device", str(path))

    def __str__(self) -> str:
        return f"no space left on device: {self.filename}"


class FolderMoved(RuntimeError):
    """An output's folder resolves elsewhere than when its path was checked: nothing is published."""

    def __init__(self, path: Path, now: Path, expected: Path):
        super().__init__(f"{path}: now resolves to {now}, not {expected} as when the output's path was checked "
                         "(swapped for a link?); nothing is published there")


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
    _make_folder_of(path)
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


def _make_folder_of(path: Path) -> None:
    """Make `path`'s folder and those above it; ENOSPC raised as `NoSpaceLeft(path)`."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        if is_no_space(exc):
            raise NoSpaceLeft(path) from None
        raise


def write_whole(path: str | Path, data: bytes) -> Path:
    """Write `data` to `path` through a temporary file beside it, fsync'd, then renamed."""
    path = Path(path)
    with written_whole(path) as partial:
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with open(fd, "wb") as out:
            out.write(data)
    return path


def publish(source: str | Path, target: str | Path, folder: Path) -> Path:
    """Put the finished file `source` at `target` in one rename, `source` kept as it is.

    `folder` is what target's folder resolved to when its path was checked: a folder that
    resolves elsewhere now (swapped for a symbolic link since) raises `FolderMoved`, and
    nothing is published. The file is hard-linked (copied, where the two are on different
    file systems) to a temporary name in that folder, then renamed over `target`, all through
    the one open folder: a reader of `target` sees the old file or the whole new one. Files
    here are never changed in place, so the two names may share the one file."""
    source, target = Path(source), Path(target)
    _make_folder_of(target)
    with _checked_folder(target.parent, Path(folder)) as folder_fd:
        partial = partial_path(target).name
        try:
            try:
                os.link(source, partial, dst_dir_fd=folder_fd)
            except OSError as exc:
                if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                    raise
                _copy_into(source, partial, folder_fd)
            os.replace(partial, target.name, src_dir_fd=folder_fd, dst_dir_fd=folder_fd)
            with contextlib.suppress(OSError):
                os.fsync(folder_fd)
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(partial, dir_fd=folder_fd)
            if is_no_space(exc):
                raise NoSpaceLeft(target) from None  # the full disk is the target's, never the source's
            raise
    return target


@contextlib.contextmanager
def _checked_folder(path: Path, expected: Path) -> Iterator[int]:
    """An open descriptor of the folder `path`, which must be the folder `expected` (resolved)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        now = Path(os.path.realpath(path))
        opened, there = os.fstat(fd), (os.stat(now) if now == expected else None)
        if there is None or (opened.st_dev, opened.st_ino) != (there.st_dev, there.st_ino):
            raise FolderMoved(path, now, expected)
        yield fd
    finally:
        os.close(fd)


def _copy_into(source: Path, name: str, folder_fd: int) -> None:
    """Copy `source` to a new file `name` in the open folder, never through a link, fsync'd."""
    with open(source, "rb") as src:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=folder_fd)
        try:
            while chunk := src.read(1 << 20):
                view = memoryview(chunk)
                while view:
                    view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)


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
