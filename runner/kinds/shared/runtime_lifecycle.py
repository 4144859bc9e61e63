"""A spec's runtime from configuration to closed: open it (or record why it cannot run
here), feed it states, let it play; the deployment kinds share these steps."""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from runner.kinds.shared import runtime_status
from runner.kinds.shared.lineage import check_lineage
from runner.kinds.shared.model_inputs import adapted_source_sha256, runtime_file
from runner.spec.runtimes import runtime_precision


@contextlib.contextmanager
def open_runtime(ctx, measurement: str, name: str) -> Iterator[Any]:
    """Yield the loaded runtime `name` of the spec, or None when it cannot run here.

    Either way one runtime_status row records it: unavailable with the reason, or
    available with describe() and the load time (never part of any measurement); a --resume
    that opens it again as it was adds none."""
    from breakout_core.runtimes.base import RuntimeUnavailable

    config = ctx.spec.runtimes[name]
    artifact = ctx.spec.artifacts[config.artifact]
    check_lineage(ctx, [config.artifact])
    row = {"run_id": ctx.run_id, "measurement": measurement, "runtime": name, "backend": config.runtime,
           "artifact": artifact.path, "artifact_sha256": None, "precision": runtime_precision(ctx.spec, name),
           "requested": json.dumps(config.model_dump(exclude={"runtime", "artifact"})), "load_s": None}
    runtime = config.make_runtime()
    ok, reason = runtime.available(**runtime.requested)
    if ok:
        started = time.perf_counter()
        loaded = runtime_file(ctx, config.artifact)
        try:
            runtime.load(loaded)
        except RuntimeUnavailable as exc:
            ok, reason = False, exc.reason
        else:
            row["load_s"] = time.perf_counter() - started
            row["artifact_sha256"] = runtime.artifact_sha256
            # an adapted copy is held to the sha256 of the source it was made from
            source = runtime.artifact_sha256 if loaded == Path(artifact.path) else adapted_source_sha256(loaded)
            try:  # the file this runtime loaded is the one this run recorded, or no row is stored
                check_loaded(ctx, config.artifact, source, f"runtime {name}")
            except BaseException:
                runtime.close()
                raise
    # on --resume, the row the run stored when it first opened this runtime as now stands
    if not ctx.already_stored("runtime_status", measurement, runtime=name, available=ok):
        runtime_status.record(ctx, row, ok, reason, *((runtime.describe(), runtime.actual()) if ok else ()))
    if not ok:
        yield None
        return
    try:
        yield runtime
    finally:
        runtime.close()


def load_states(ctx, artifact_name: str):
    """The fixed states of an artifact, refused if captured under another contract."""
    from breakout_core.common.files import same_file
    from breakout_core.evaluation.fixed_states import file_sha256, load_fixed_states

    check_lineage(ctx, [artifact_name])
    path = ctx.spec.artifacts[artifact_name].path
    with same_file(path):  # the states loaded are the file hashed
        sha256 = file_sha256(path)
        check_loaded(ctx, artifact_name, sha256, "the fixed states")
        states = load_fixed_states(path, expected_contract_hash=ctx.contract.hash)
    return states, path, sha256


def check_loaded(ctx, artifact_name: str, sha256: str, what: str) -> None:
    """Refuse a file loaded for an artifact that is not the one this run recorded for it
    (runner.run.artifact_files); a context without those records checks nothing."""
    if ctx.files is not None:
        ctx.files.check(artifact_name, sha256, what)


def chunks(n: int, batch: int) -> list[slice]:
    return [slice(i, min(i + batch, n)) for i in range(0, n, batch)]


def infer_in_batches(runtime, obs: np.ndarray, batch: int) -> np.ndarray:
    """Q-values of every state, fed `batch` at a time (the last batch may be smaller)."""
    return np.concatenate([runtime.infer(obs[s]) for s in chunks(len(obs), batch)])


def greedy(q: np.ndarray) -> np.ndarray:
    """Greedy actions, lowest index on ties; -1 for a row with a non-finite value (as parity.compare_q)."""
    from breakout_core.diagnosis.parity import greedy_actions

    finite = np.isfinite(q).all(axis=1)
    return np.where(finite, greedy_actions(np.where(np.isfinite(q), q, -np.inf)), -1).astype(np.int64)


class RuntimePolicy:
    """A greedy (epsilon 0) policy whose Q-values come from a runtime: one timed_infer() per
    act(), each call's batch size and time (by the runtime's CALL_TIMER) kept in order."""

    def __init__(self, runtime, name: str):
        self.runtime = runtime
        self.name = name
        self.epsilon = 0.0
        self.call_states: list[int] = []
        self.call_seconds: list[float] = []

    @property
    def calls(self) -> int:
        return len(self.call_states)

    @property
    def states(self) -> int:
        return sum(self.call_states)

    def act(self, obs: np.ndarray, rngs) -> np.ndarray:
        """The greedy actions; NonFiniteQ where the model gives NaN or inf, which no action is played for."""
        from breakout_core.game.greedy import finite_q

        q, seconds = self.runtime.timed_infer(obs)
        self.call_states.append(len(obs))
        self.call_seconds.append(seconds)
        return greedy(finite_q(q))
