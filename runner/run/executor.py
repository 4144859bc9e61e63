"""Where `runner run` trains its (trial, seed) trainings: in this process or as Ray tasks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class Executor:
    """How `runner run` executes trainings (`--executor`, `--ray-address`, `--ray-retries`)."""

    name: Literal["local", "ray"] = "local"
    ray_address: str | None = None  # None: start Ray on this machine
    ray_retries: int = 1
    ray_object_store_bytes: int = 512 * 2**20  # a local Ray's object store: trainings send back rows and checkpoints
