"""The interface every runtime backend implements, in the spirit of Polygraphy's runners.

    ok, reason = SomeRuntime.available(**options)   # cheap, imports nothing heavy eagerly
    with SomeRuntime(**options) as rt:                # constructing never touches a device
        rt.load(artifact)                             # RuntimeUnavailable(reason) if it cannot run here
        q = rt.infer(obs)                             # uint8 (B, 4, 84, 84) -> float32 (B, A), a fresh copy
        rt.actual()                                   # what actually ran (actual.ActualRun)
        rt.describe()                                 # what was requested and what actually ran, as JSON

A runtime that cannot run as requested says so, with the precise reason, through
available() and RuntimeUnavailable; it never falls back to another device or precision.
"""

from __future__ import annotations

import contextlib
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from breakout_core.common.files import FileReplaced, same_file
from breakout_core.common.hashing import model_sha256
from breakout_core.runtimes.actual import ActualRun

OBS_SHAPE = (4, 84, 84)
# A, the Q-values per state, is the model's own: one per action of the contract it plays (4, or 18 under
# full_action_space); what runs a model against a contract checks the two agree (conversion.model_prechecks)


class RuntimeUnavailable(RuntimeError):
    """This runtime cannot run here as requested; `reason` says why (never an ImportError)."""

    def __init__(self, runtime: str, reason: str):
        super().__init__(f"runtime {runtime!r} is unavailable: {reason}")
        self.runtime = runtime
        self.reason = reason


@dataclass(frozen=True)
class Option:
    """One option of a backend, declared once: the spec's runtime model is derived from it
    (runner.runtime_specs), and resolve_options() checks values against it."""

    default: Any = None  # a default of None also admits None ("the library's own default")
    choices: tuple | None = None  # the allowed values; None: any value of `value_type`
    value_type: type | None = None  # int or str, where there are no choices
    minimum: int | None = None
    description: str = ""
    spec_path: bool = False  # a file path, written in a spec relative to the spec file

    def problem(self, value: Any) -> str | None:
        """Why `value` is not allowed (None: it is)."""
        if self.choices is not None:
            return None if value in self.choices else f"is not one of {list(self.choices)}"
        if value is None:
            return None if self.default is None else "may not be None"
        if self.value_type is int and (isinstance(value, bool) or not isinstance(value, int)):
            return "is not an integer"
        if self.value_type is str and not isinstance(value, str):
            return "is not a string"
        if self.minimum is not None and value < self.minimum:
            return f"is below {self.minimum}"
        return None


class Runtime(ABC):
    """One backend. Subclasses set `name`, `artifact_types`, `OPTIONS` and implement the hooks.

    `OPTIONS` maps each option name to its `Option`. A new backend is one module here plus
    one line in the registry (breakout_core/runtimes/registry.py); the spec language learns
    its options, artifacts and precision from the class.
    """

    name: ClassVar[str]
    # files it loads: "checkpoint" (qnetwork.save_checkpoint), "onnx", "engine"
    artifact_types: ClassVar[tuple[str, ...]]
    OPTIONS: ClassVar[dict[str, Option]] = {}
    CALL_TIMER: ClassVar[str] = "time.perf_counter() around infer() in Python"  # the clock of timed_infer()
    # the pyproject extra that installs its library (`pip install -e '.[EXTRA]'`); None: the
    # package's own dependencies carry it
    EXTRA: ClassVar[str | None] = None

    def __init__(self, **options: Any):
        self.requested = self.resolve_options(**options)
        self.artifact: Path | None = None
        self.artifact_sha256: str | None = None
        self._loaded = False

    # -- availability -------------------------------------------------------------------
    @classmethod
    def resolve_options(cls, **options: Any) -> dict[str, Any]:
        """Options with defaults filled in; unknown names or values raise ValueError."""
        unknown = sorted(set(options) - set(cls.OPTIONS))
        if unknown:
            raise ValueError(f"runtime {cls.name!r}: unknown option(s) {unknown}; valid: {sorted(cls.OPTIONS)}")
        resolved = {}
        for key, option in cls.OPTIONS.items():
            value = options.get(key, option.default)
            problem = option.problem(value)
            if problem:
                raise ValueError(f"runtime {cls.name!r}: {key}={value!r} {problem}")
            resolved[key] = value
        return resolved

    @classmethod
    def precision(cls, options: dict[str, Any], artifact_precision: str) -> str:
        """'fp32', 'fp16', 'bf16' or 'int8': what it computes in with these options on a file of
        `artifact_precision` (by default the file's own; a backend with a precision option says its own)."""
        return options.get("precision", artifact_precision)

    @classmethod
    def artifact_problem(cls, options: dict[str, Any], artifact_type: str, artifact_precision: str) -> str | None:
        """Why this runtime, so configured, cannot load such a file (None: it can)."""
        if artifact_type not in cls.artifact_types:
            return f"runtime {cls.name} loads {' or '.join(cls.artifact_types)} files"
        return None

    @classmethod
    def needs(cls, options: dict[str, Any]) -> frozenset[str]:
        """What this runtime, so configured, needs of a machine besides its CPU: "gpu" (a CUDA
        device), "browser" (Chromium); none by default."""
        return frozenset()

    @classmethod
    def available(cls, **options: Any) -> tuple[bool, str]:
        """(True, "") when this runtime can run here with these options, else (False, reason)."""
        return cls._available(cls.resolve_options(**options))

    @classmethod
    @abstractmethod
    def _available(cls, options: dict[str, Any]) -> tuple[bool, str]: ...

    # -- lifecycle ----------------------------------------------------------------------
    def load(self, artifact: str | Path) -> "Runtime":
        """Load the artifact; RuntimeUnavailable when this runtime cannot run here as requested."""
        if self._loaded:
            raise RuntimeError(f"runtime {self.name!r} is already loaded; close() it first")
        ok, reason = type(self)._available(self.requested)
        if not ok:
            raise RuntimeUnavailable(self.name, reason)
        path = Path(artifact)
        if not path.is_file():
            raise FileNotFoundError(f"{self.name}: artifact {path} does not exist")
        self.artifact = path
        try:
            with same_file(path):  # the file hashed is the file loaded, or FileReplaced
                self.artifact_sha256 = model_sha256(path)
                self._load(path)
        except FileReplaced:
            with contextlib.suppress(Exception):  # it loaded, but what it loaded is unknown
                self._close()
            self.artifact = self.artifact_sha256 = None
            raise
        except BaseException:
            self.artifact = self.artifact_sha256 = None
            raise
        self._loaded = True
        return self

    def infer(self, obs: np.ndarray) -> np.ndarray:
        """obs uint8 (B, 4, 84, 84) -> float32 (B, 4), always a new array the caller owns."""
        return self._infer(self.checked_obs(obs))

    def checked_obs(self, obs: np.ndarray) -> np.ndarray:
        """`obs` as a contiguous batch of states, refused when the runtime is not loaded or the
        array is not uint8 (B, 4, 84, 84) with B >= 1."""
        if not self._loaded:
            raise RuntimeError(f"runtime {self.name!r} is not loaded")
        if not isinstance(obs, np.ndarray) or obs.dtype != np.uint8 or obs.ndim != 4 or obs.shape[1:] != OBS_SHAPE:
            got = f"{obs.dtype} {obs.shape}" if isinstance(obs, np.ndarray) else type(obs).__name__
            raise ValueError(f"obs must be a uint8 array (B, 4, 84, 84), got {got}")
        if obs.shape[0] == 0:
            raise ValueError("obs must hold at least one state")
        return np.ascontiguousarray(obs)

    def timed_infer(self, obs: np.ndarray) -> tuple[np.ndarray, float]:
        """infer(obs) and how many seconds it took by `CALL_TIMER`'s clock: one decision
        timed inside a game loop, where the runtime runs (a page times itself in the page)."""
        started = time.perf_counter()
        q = self.infer(obs)
        return q, time.perf_counter() - started

    def timed_runs(self, obs: np.ndarray, warmup: int, iterations: int):
        """Latency of infer(obs): `warmup` untimed calls, then `iterations` timed ones
        (breakout_core.diagnosis.latency.LatencyResult). Here perf_counter around each call from Python;
        a runtime that runs elsewhere (a browser page) times itself there instead."""
        from breakout_core.diagnosis.latency import measure_latency

        return measure_latency(self.infer, obs, warmup=warmup, iterations=iterations)

    def actual(self) -> ActualRun | None:
        """What actually ran (None until loaded)."""
        return self._actual() if self._loaded else None

    def describe(self) -> dict[str, Any]:
        """What was requested and what actually ran (ActualRun.as_json()), with versions: the
        JSON that runtime_status stores."""
        actual = self.actual()
        ok, reason = type(self)._available(self.requested)
        info: dict[str, Any] = {
            "runtime": self.name,
            "requested": dict(self.requested),
            "available": ok,
            "unavailable_reason": reason or None,
            "loaded": self._loaded,
            "artifact": str(self.artifact) if self.artifact else None,
            "artifact_sha256": self.artifact_sha256,
            "actual": None if actual is None else actual.as_json(),
            "versions": self._versions(),
        }
        return info

    def close(self) -> None:
        """Release the session/engine/device memory; safe to call twice."""
        if self._loaded:
            try:
                self._close()
            finally:
                self._loaded = False

    def __enter__(self) -> "Runtime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.requested.items())
        return f"{type(self).__name__}({options})"

    # -- hooks ----------------------------------------------------------------------------
    @abstractmethod
    def _load(self, path: Path) -> None: ...

    @abstractmethod
    def _infer(self, obs: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def _actual(self) -> ActualRun: ...

    def _versions(self) -> dict[str, str]:
        return {"numpy": np.__version__}

    def _close(self) -> None:
        pass


def import_error_reason(module: str, exc: BaseException) -> str:
    """A one-line reason for an import that failed: which module and the error's own text."""
    return f"{module} cannot be imported ({type(exc).__name__}: {exc})"


def installed_version(distribution: str) -> str | None:
    """Version of an installed distribution without importing it (None when absent)."""
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None
