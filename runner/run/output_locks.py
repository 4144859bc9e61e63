"""The OS locks that keep two runs from writing one output path at once.

A lock is a file in the runner's own per-user folder (`$RUNNER_LOCK_DIR`, else
`~/.cache/breakout-runner/locks`, made 0700), named by the sha256 of the output's resolved
path, so that runs in any runs folder that write one file exclude each other, nothing is
written beside the user's file, and a link planted where a lock would be is never followed.
The holder writes its run id, pid and host in it; a run refused names the holder. A lock
file is removed by its holder as it is released.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import socket
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from breakout_core.common.files import NoSpaceLeft, is_no_space
from runner.run.errors import ArtifactBusy

LOCK_DIR_ENV = "RUNNER_LOCK_DIR"


def lock_folder() -> Path:
    """The folder of this user's output locks."""
    if os.environ.get(LOCK_DIR_ENV):
        return Path(os.environ[LOCK_DIR_ENV])
    try:
        home = Path.home()
    except RuntimeError:  # no home to be found: a folder of this user's own in the temporary folder
        return Path(tempfile.gettempdir()) / f"breakout-runner-{os.geteuid()}" / "locks"
    return home / ".cache" / "breakout-runner" / "locks"


def lock_file(resolved: Path) -> Path:
    """The lock file of the output whose resolved path is `resolved`."""
    return lock_folder() / f"{hashlib.sha256(str(resolved).encode()).hexdigest()}.lock"


@dataclass
class HeldLock:
    fd: int
    path: Path

    def release(self) -> None:
        """Remove the lock file while it is held, then let it go."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        finally:
            os.close(self.fd)


def hold(name: str, path: Path, resolved: Path, run_id: str) -> HeldLock:
    """Lock output `path` of artifact `name` (`resolved`: the path it was checked as) for run
    `run_id`; ArtifactBusy naming the holder where another run holds it, or where no lock can
    be taken."""
    folder, lock = lock_folder(), lock_file(resolved)
    _check_folder(name, path, folder)
    for _ in range(20):  # a lock file its holder removed as this run opened it is taken anew
        fd = _open(name, path, lock)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise ArtifactBusy(f"artifacts.{name}: cannot lock {path} for writing ({lock}: "
                                   f"{exc.strerror or exc})") from None
            raise ArtifactBusy(f"artifacts.{name}: {path} is being written by run {holder}; wait for it to end, "
                               "or give this artifact another path") from None
        if _still_there(fd, lock):
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps({"run_id": run_id, "pid": os.getpid(), "host": socket.gethostname(),
                                      "path": str(path)}).encode(), 0)
            return HeldLock(fd, lock)
        os.close(fd)
    raise ArtifactBusy(f"artifacts.{name}: cannot lock {path} for writing ({lock} keeps being replaced)")


def _check_folder(name: str, path: Path, folder: Path) -> None:
    """Make the lock folder (0700) where it is missing; refuse one that is a link or another user's."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.lstat(folder)
    except OSError as exc:
        if is_no_space(exc):
            raise NoSpaceLeft(folder) from None
        raise ArtifactBusy(f"artifacts.{name}: cannot lock {path} for writing (lock folder {folder}: "
                           f"{exc.strerror or exc}; set {LOCK_DIR_ENV} to another folder)") from None
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o022:
        raise ArtifactBusy(f"artifacts.{name}: cannot lock {path} for writing (lock folder {folder} is not a folder "
                           f"of this user's that only it can write; set {LOCK_DIR_ENV} to another folder)")


def _open(name: str, path: Path, lock: Path) -> int:
    """The lock file, opened without following a link, and only where it is a plain file."""
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if is_no_space(exc):
            raise NoSpaceLeft(lock) from None
        why = "a symbolic link, not a lock file" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
        raise ArtifactBusy(f"artifacts.{name}: cannot lock {path} for writing ({lock}: {why})") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:  # a hard link's other name is another file
        os.close(fd)
        why = "not a plain file" if not stat.S_ISREG(info.st_mode) else "a hard link to another file"
        raise ArtifactBusy(f"artifacts.{name}: cannot lock {path} for writing ({lock}: {why})")
    return fd


def _still_there(fd: int, lock: Path) -> bool:
    """Whether the file locked is still the one at the lock's name (not removed by its last holder)."""
    try:
        there = os.stat(lock, follow_symlinks=False)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (there.st_dev, there.st_ino) == (opened.st_dev, opened.st_ino)


def _holder(fd: int) -> str:
    """Who holds a lock file, as it wrote itself there."""
    try:
        held = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        held = {}
    if not held.get("run_id"):
        return "(another run, still starting)"
    return f"{held['run_id']} (pid {held.get('pid')} on {held.get('host')})"
