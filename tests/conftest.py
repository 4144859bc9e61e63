"""Shared fixtures: an untrained checkpoint, a way to write spec files, and a small disk to fill."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Callable

import pytest

# The suite runs two tests at once (`-n 2`), and CI has two cores: a torch process with more threads
# than free cores slows several times over (its threads wait on each other at every op), so this
# process and every one the tests start default to one torch thread. Set before torch is imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# the runtime, export and fixed-state tests' fixtures, built once per test module that asks for them
pytest_plugins = ["runtime_artifacts"]


@pytest.fixture
def checkpoint(tmp_path: Path) -> Path:
    """An untrained Nature-DQN checkpoint at tmp_path/model.pt (deterministic weights), made
    under breakout-v3, the contract a spec plays when it names none."""
    import torch

    from breakout_core.game.contract import CONTRACTS
    from breakout_core.learning.qnetwork import QNetwork, save_checkpoint

    torch.manual_seed(0)
    return save_checkpoint(tmp_path / "model.pt", QNetwork(), CONTRACTS["breakout-v3"], transitions=0)


@pytest.fixture
def write_spec(tmp_path: Path) -> Callable[..., Path]:
    """write_spec(text, name="spec.yaml") -> path of a spec file in tmp_path."""

    def write(text: str, name: str = "spec.yaml") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB tmpfs; a test fills it to make writes fail with ENOSPC."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], check=False,
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root): {made.stderr.strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)
