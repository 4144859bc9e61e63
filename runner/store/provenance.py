"""Where and with what a run was made: recorded with every run."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path

from breakout_core.common.cores import usable_cores

PROJECT = "breakout-runner"
OWN_PACKAGES = ("breakout_core", "runner")  # the project's own code, beside each other wherever it is installed
PACKAGES = ("torch", "numpy", "gymnasium", "ale-py", "onnx", "onnxruntime", "duckdb", "pydantic", "scipy", "altair")


def git_commit(where: Path) -> str | None:
    """HEAD of the repository holding `where`, with '-dirty' when tracked files changed."""
    try:
        cwd = where if where.is_dir() else where.parent
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=5)
        return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def sources_sha256(root: Path) -> str:
    """sha256 over the path and bytes of every file of the project's own packages under `root`
    (bytecode caches aside): the code itself, committed or not, from a checkout or a wheel."""
    digest = hashlib.sha256()
    for package in OWN_PACKAGES:
        for path in sorted((root / package).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(f"{path.relative_to(root).as_posix()}\0{path.stat().st_size}\0".encode())
                digest.update(path.read_bytes())
    return digest.hexdigest()


@cache
def code_identity(root: Path = Path(__file__).resolve().parents[2]) -> dict:
    """The code this process runs: the project's version, the commit of the checkout it comes from
    ('-dirty' with tracked files changed; None outside git) and the sha256 of its packages' files."""
    try:
        version = metadata.version(PROJECT)
    except metadata.PackageNotFoundError:
        version = None
    return {"version": version, "commit": git_commit(root), "sources_sha256": sources_sha256(root)}


def memory_bytes() -> int:
    """Memory this process may use: the machine's, or its container's limit when lower."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
    except OSError:
        return total
    return min(total, int(limit)) if limit.isdigit() else total


def cpu_name() -> str:
    from breakout_core.common.cpu_flags import cpu_model

    return cpu_model() or platform.processor() or platform.machine()


def gpu_name() -> str:
    """The CUDA device torch sees, or 'none'; never initialises CUDA when torch is a CPU build."""
    try:
        import torch

        if torch.version.cuda and torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # a broken driver must not stop provenance
        pass
    return "none"


def package_versions() -> str:
    versions = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return json.dumps(versions)


def provenance(spec_path: Path) -> dict:
    return {
        "git_commit": git_commit(spec_path.resolve()),
        "host": socket.gethostname(),
        "cpu": f"{cpu_name()} ({usable_cores()} logical CPUs)",
        "gpu": gpu_name(),
        "packages": package_versions(),
    }

