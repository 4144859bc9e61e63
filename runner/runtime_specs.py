"""The spec's `artifacts:` and `runtimes:` sections, and what every deployment kind shares.

    artifacts:                      # files a spec reads or writes, by name
      checkpoint: {path: ../models/reference/dqn_breakout.pt}
      onnx_fp32: {path: ../models/reference/dqn_breakout.onnx, made_by: day22_export}
      onnx_fp16: {path: ../models/reference/dqn_breakout_fp16.onnx, made_by: day22_export, precision: fp16}
    runtimes:                       # named runtime configurations, each loading one artifact
      torch_fp32: {runtime: torch, device: cpu, precision: fp32, artifact: checkpoint}
      ort_cpu: {runtime: onnxruntime, provider: cpu, artifact: onnx_fp32}
      ort_cuda: {runtime: onnxruntime, provider: cuda, disable_cpu_ep_fallback: true, artifact: onnx_fp32}
      trt_fp32: {runtime: tensorrt, precision: fp32, artifact: onnx_fp32}

The file rule: an artifact must exist when the spec is validated, except one whose
`made_by` names the spec itself (its own output, written by an `export` measurement of
that spec). A missing file made by another spec is reported with that spec's name and
file, so `runner validate` says what to run first. (`load_spec(..., will_exist=...)`
accepts the outputs of specs that will run before, for checking a chain of specs.)

A runtime option not accepted by the backend (breakout_core.runtimes OPTIONS) is a
validation error; so is an unknown backend, listing the known ones.

At run time a configured runtime that cannot run here (available() says no, or load()
raises RuntimeUnavailable) is stored in `runtime_status` as unavailable with its reason
and contributes no rows; every verdict that needs it is `unavailable` with that reason.
A runtime that loads is stored with its describe() (what was requested and what ran).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal, Union

import numpy as np
from pydantic import Field, ValidationInfo, field_validator, model_validator

from runner.spec_base import Name, StrictModel, spec_relative

ARTIFACT_TYPES = {".pt": "checkpoint", ".pth": "checkpoint", ".onnx": "onnx", ".npz": "fixed_states",
                  ".engine": "engine", ".plan": "engine"}
RUNTIME_ARTIFACTS = {"torch": ("checkpoint",), "onnxruntime": ("onnx",), "tensorrt": ("onnx", "engine"),
                     "browser": ("onnx",)}
UNAVAILABLE = "unavailable_reason"  # the key a kind's metrics() sets when a participant could not run


def _resolve(path: str, info: ValidationInfo) -> str:
    return str(spec_relative(path, info))


class ArtifactSpec(StrictModel):
    """A file by name: a checkpoint (.pt), an ONNX model (.onnx), fixed states (.npz) or an engine."""

    path: str = Field(description="relative to the spec file")
    made_by: Name | None = Field(default=None, description="the spec that writes this file; this spec's own name "
                                 "marks an output of one of its export measurements")
    precision: Literal["fp32", "fp16"] = Field(default="fp32", description="weights of an ONNX file")

    @field_validator("path")
    @classmethod
    def _suffix(cls, path: str, info: ValidationInfo) -> str:
        suffix = Path(path).suffix.lower()
        if suffix not in ARTIFACT_TYPES:
            raise ValueError(f"unknown artifact type {suffix or '(no suffix)'!r}; known: {', '.join(ARTIFACT_TYPES)}")
        return _resolve(path, info)

    @property
    def type(self) -> str:
        return ARTIFACT_TYPES[Path(self.path).suffix.lower()]


class _RuntimeConfig(StrictModel):
    artifact: Name = Field(description="the artifact (from `artifacts:`) this runtime loads")

    def options(self) -> dict[str, Any]:
        """The backend's own options (breakout_core.runtimes.make_runtime keywords)."""
        return self.model_dump(exclude={"runtime", "artifact", "threads"})

    @model_validator(mode="after")
    def _backend_accepts(self) -> "_RuntimeConfig":
        from breakout_core.runtimes import runtime_class

        runtime_class(self.runtime).resolve_options(**self.options())  # ValueError: its message is the problem
        return self


class TorchRuntimeConfig(_RuntimeConfig):
    runtime: Literal["torch"]
    device: Literal["cpu", "cuda"] = "cpu"
    precision: Literal["fp32", "fp16"] = "fp32"
    device_index: int = Field(default=0, ge=0)
    allow_tf32: bool = False
    threads: int | None = Field(default=None, ge=1, description="torch.set_num_threads while this runtime is open "
                                "(process-wide, restored after; describe() records it); None: torch's default")


class OnnxRuntimeConfig(_RuntimeConfig):
    runtime: Literal["onnxruntime"]
    provider: Literal["cpu", "cuda"] = "cpu"
    device_index: int = Field(default=0, ge=0)
    graph_optimization_level: Literal["disable", "basic", "extended", "all"] = "all"
    intra_op_threads: int | None = Field(default=None, ge=1, description="None: ONNX Runtime's default")
    disable_cpu_ep_fallback: bool = False
    node_placement: bool = True


class TensorRTRuntimeConfig(_RuntimeConfig):
    runtime: Literal["tensorrt"]
    precision: Literal["fp32", "fp16"] = "fp32"
    device_index: int = Field(default=0, ge=0)
    max_batch: int = Field(default=64, ge=1)
    opt_batch: int = Field(default=1, ge=1)
    workspace_bytes: int = Field(default=1 << 30, ge=1 << 20)
    allow_tf32: bool = False
    engine_path: str | None = Field(default=None, description="default: beside the ONNX file")

    @field_validator("engine_path")
    @classmethod
    def _engine_relative(cls, path: str | None, info: ValidationInfo) -> str | None:
        return None if path is None else _resolve(path, info)


class BrowserRuntimeConfig(_RuntimeConfig):
    runtime: Literal["browser"]
    provider: Literal["wasm", "webgpu"] = Field(default="wasm", description="onnxruntime-web execution provider")
    num_threads: int | None = Field(default=None, ge=1, description="WASM threads (ort.env.wasm.numThreads); "
                                    "None: onnxruntime-web's default")
    webgpu_adapter: Literal["swiftshader", "default"] = Field(
        default="swiftshader", description="Chromium's WebGPU adapter: SwiftShader (software, on the CPU) or "
        "whatever Chromium picks")


RuntimeConfig = Annotated[Union[TorchRuntimeConfig, OnnxRuntimeConfig, TensorRTRuntimeConfig, BrowserRuntimeConfig],
                          Field(discriminator="runtime")]
RUNTIME_CONFIGS = {"torch": TorchRuntimeConfig, "onnxruntime": OnnxRuntimeConfig, "tensorrt": TensorRTRuntimeConfig,
                   "browser": BrowserRuntimeConfig}


def runtime_precision(spec, name: str) -> str:
    """'fp32' or 'fp16': the runtime's own precision, or for an ONNX runtime its file's."""
    config = spec.runtimes[name]
    if isinstance(config, (OnnxRuntimeConfig, BrowserRuntimeConfig)):
        return spec.artifacts[config.artifact].precision
    return config.precision


# -- validation across the spec ---------------------------------------------------------------

def _names(values) -> str:
    return ", ".join(sorted(values)) or "none"


def deploy_problems(spec, context: dict | None = None) -> list[tuple[tuple, str]]:
    """Artifacts, runtimes and the names deployment measurements use: (location, message) each."""
    context = context or {}
    problems: list[tuple[tuple, str]] = []
    check_files = context.get("check_files", True)
    will_exist = {str(Path(p).resolve()) for p in context.get("will_exist", ())}
    outputs = {name for m in spec.measurements for name in getattr(m, "outputs", lambda: [])()}

    for name, artifact in spec.artifacts.items():
        path = Path(artifact.path)
        own = artifact.made_by == spec.name
        if own and name not in outputs:
            problems.append((("artifacts", name, "made_by"),
                             f"made_by names this spec, but none of its export measurements writes {name!r}"))
        if not check_files or own or path.is_file() or str(path.resolve()) in will_exist:
            continue
        if artifact.made_by is None:
            problems.append((("artifacts", name, "path"), f"model file not found: {path}"))
        else:
            producer = Path(context.get("base_dir") or path.parent, f"{artifact.made_by}.yaml")
            hint = f" ({producer}): run `runner run {producer}` first" if producer.is_file() else ": run that spec first"
            problems.append((("artifacts", name, "path"),
                             f"file not found: {path}; it is made by spec {artifact.made_by!r}{hint}"))

    for name, config in spec.runtimes.items():
        artifact = spec.artifacts.get(config.artifact)
        if artifact is None:
            problems.append((("runtimes", name, "artifact"),
                             f"unknown artifact {config.artifact!r}; defined: {_names(spec.artifacts)}"))
        elif artifact.type not in RUNTIME_ARTIFACTS[config.runtime]:
            problems.append((("runtimes", name, "artifact"),
                             f"runtime {config.runtime} loads {' or '.join(RUNTIME_ARTIFACTS[config.runtime])} "
                             f"files; {config.artifact!r} is {artifact.type} ({artifact.path})"))
        elif config.runtime == "tensorrt" and artifact.type == "onnx" and config.precision == "fp32" \
                and artifact.precision != "fp32":
            problems.append((("runtimes", name, "artifact"), "an fp32 TensorRT engine needs an fp32 ONNX file"))

    by_name = {m.name: m for m in spec.measurements}
    for i, m in enumerate(spec.measurements):
        refs = getattr(m, "references", None)
        if refs is None:
            continue
        for loc, what, value in refs():
            where = ("measurements", i, *loc)
            if what == "runtime":
                if value not in spec.runtimes:
                    problems.append((where, f"unknown runtime {value!r}; defined: {_names(spec.runtimes)}"))
            elif what.startswith("artifact"):
                wanted = what.partition(":")[2]
                artifact = spec.artifacts.get(value)
                if artifact is None:
                    problems.append((where, f"unknown artifact {value!r}; defined: {_names(spec.artifacts)}"))
                elif wanted and artifact.type != wanted:
                    problems.append((where, f"{value!r} is {artifact.type} ({artifact.path}); {wanted} is needed here"))
                elif what.startswith("artifact_out") and artifact.made_by != spec.name:
                    problems.append((where, f"{value!r} is written here, so artifacts.{value} needs made_by: {spec.name}"))
                elif not what.startswith("artifact_out") and artifact.made_by == spec.name and not any(
                        value in getattr(earlier, "outputs", lambda: [])() for earlier in spec.measurements[:i]):
                    problems.append((where, f"{value!r} is written by this spec, but by no measurement before this one"))
            elif what.startswith("measurement:"):
                wanted = what.partition(":")[2]
                other = by_name.get(value)
                if other is None or other.kind != wanted:
                    choices = [n for n, o in by_name.items() if o.kind == wanted]
                    problems.append((where, f"{value!r} is not a {wanted} measurement of this spec; "
                                            f"choose from {_names(choices)}"))
    for i, v in enumerate(spec.verdicts):
        m = by_name.get(v.measurement)
        check = getattr(m, "metric_problem", None)
        if check is None:
            continue
        for metric in v.deployment_worthy_when:
            message = check(metric)
            if message:
                problems.append((("verdicts", i, "deployment_worthy_when", metric), message))
    return problems


# -- running ----------------------------------------------------------------------------------

MIGRATIONS = [
    (
        "0400_runtime_status",
        """
        CREATE TABLE runtime_status (
            run_id VARCHAR NOT NULL,
            measurement VARCHAR NOT NULL,
            runtime VARCHAR NOT NULL,
            backend VARCHAR NOT NULL,
            artifact VARCHAR NOT NULL,
            artifact_sha256 VARCHAR,
            precision VARCHAR NOT NULL,
            requested JSON NOT NULL,
            available BOOLEAN NOT NULL,
            reason VARCHAR,
            runtime_describe JSON,
            load_s DOUBLE,
            recorded_at TIMESTAMPTZ NOT NULL
        )
        """,
    )
]

VIEWS = [
    """
    CREATE OR REPLACE VIEW runtime_summary AS
    SELECT run_id, measurement, runtime, backend, precision, available, reason,
           runtime_describe->>'$.actual.device' AS device,
           runtime_describe->>'$.actual.provider' AS provider,
           runtime_describe->>'$.actual.precision' AS actual_precision,
           runtime_describe->>'$.actual.nodes_by_provider' AS nodes_by_provider,
           runtime_describe->>'$.actual.nodes_not_on_requested_provider' AS nodes_off_provider,
           load_s, artifact, artifact_sha256
    FROM runtime_status
    """,
]


@contextlib.contextmanager
def open_runtime(ctx, measurement: str, name: str) -> Iterator[Any]:
    """Yield the loaded runtime `name` of the spec, or None when it cannot run here.

    Either way one runtime_status row records it: unavailable with the reason, or
    available with describe() and the load time (never part of any measurement)."""
    from breakout_core.runtimes import RuntimeUnavailable, make_runtime, runtime_class
    from runner.store import utcnow

    config = ctx.spec.runtimes[name]
    artifact = ctx.spec.artifacts[config.artifact]
    check_lineage(ctx, [config.artifact])
    row = {"run_id": ctx.run_id, "measurement": measurement, "runtime": name, "backend": config.runtime,
           "artifact": artifact.path, "artifact_sha256": None, "precision": runtime_precision(ctx.spec, name),
           "requested": json.dumps(config.model_dump(exclude={"runtime", "artifact"})), "runtime_describe": None, "load_s": None}
    runtime, previous_threads = None, None
    ok, reason = runtime_class(config.runtime).available(**config.options())
    if ok and getattr(config, "threads", None) is not None:
        import torch

        previous_threads = torch.get_num_threads()
        torch.set_num_threads(config.threads)
    if ok:
        runtime = make_runtime(config.runtime, **config.options())
        started = time.perf_counter()
        try:
            runtime.load(artifact.path)
        except RuntimeUnavailable as exc:
            ok, reason, runtime = False, exc.reason, None
            if previous_threads is not None:
                import torch

                torch.set_num_threads(previous_threads)
        else:
            row["load_s"] = time.perf_counter() - started
            row["artifact_sha256"] = runtime.artifact_sha256
            row["runtime_describe"] = json.dumps(runtime.describe(), default=str)
    ctx.store.append_rows("runtime_status", [{**row, "available": ok, "reason": reason or None,
                                              "recorded_at": utcnow()}])
    if runtime is None:
        yield None
        return
    try:
        yield runtime
    finally:
        runtime.close()
        if previous_threads is not None:
            import torch

            torch.set_num_threads(previous_threads)


def unavailable_reason(con, run_id: str, measurements, runtimes) -> str | None:
    """Why any of `runtimes` could not run in any of `measurements` of a run (None: all ran)."""
    measurements = [m for m in measurements if m]
    runtimes = [r for r in runtimes if r]
    if not measurements or not runtimes:
        return None
    rows = con.execute(
        f"SELECT DISTINCT runtime, backend, reason FROM runtime_status WHERE run_id = ? AND NOT available "
        f"AND measurement IN ({', '.join('?' * len(measurements))}) AND runtime IN ({', '.join('?' * len(runtimes))}) "
        f"ORDER BY runtime", [run_id, *measurements, *runtimes]).fetchall()
    if not rows:
        return None
    return "; ".join(f"runtime {name} ({backend}) unavailable here: {reason}" for name, backend, reason in rows)


_LINEAGE_CHECKED: set[tuple[str, str]] = set()


def check_lineage(ctx, names) -> None:
    """Refuse ONNX files or fixed states made from another checkpoint than the spec's own.

    An export records the sha256 of the checkpoint it came from (ONNX metadata, fixed-states
    header). When the spec also names that checkpoint and its file changed since (a newer
    checkpoint copied in place), comparing torch on the new weights with ONNX Runtime on the
    old ones would measure the wrong thing: the run stops and says which spec to run again."""
    from breakout_core.fixed_states import file_sha256

    artifacts = ctx.spec.artifacts
    checkpoints = {file_sha256(a.path): n for n, a in artifacts.items() if a.type == "checkpoint" and Path(a.path).is_file()}
    if not checkpoints:
        return
    for name in names:
        if (ctx.run_id, name) in _LINEAGE_CHECKED or name not in artifacts:
            continue
        artifact = artifacts[name]
        recorded = None
        if artifact.type == "onnx":
            from breakout_core.export import META_PREFIX, inspect_onnx

            recorded = inspect_onnx(artifact.path).metadata.get(META_PREFIX + "checkpoint_sha256") or None
        elif artifact.type == "fixed_states":
            with np.load(artifact.path, allow_pickle=False) as data:
                recorded = json.loads(str(data["header"])).get("checkpoint_sha256")
        if recorded and recorded not in checkpoints:
            maker = f"run `runner run` on spec {artifact.made_by!r} again" if artifact.made_by else "export it again"
            raise ValueError(f"artifacts.{name} ({artifact.path}) was made from a checkpoint with sha256 {recorded[:12]}, "
                             f"but this spec's checkpoint(s) are {', '.join(f'{n} {s[:12]}' for s, n in checkpoints.items())}: "
                             f"{maker} so that every runtime runs the same weights")
        _LINEAGE_CHECKED.add((ctx.run_id, name))


def load_states(ctx, artifact_name: str):
    """The fixed states of an artifact, refused if captured under another contract."""
    from breakout_core.fixed_states import file_sha256, load_fixed_states

    check_lineage(ctx, [artifact_name])
    path = ctx.spec.artifacts[artifact_name].path
    states = load_fixed_states(path, expected_contract_hash=ctx.contract.hash)
    return states, path, file_sha256(path)


def chunks(n: int, batch: int) -> list[slice]:
    return [slice(i, min(i + batch, n)) for i in range(0, n, batch)]


def infer_in_batches(runtime, obs: np.ndarray, batch: int) -> np.ndarray:
    """Q-values of every state, fed `batch` at a time (the last batch may be smaller)."""
    return np.concatenate([runtime.infer(obs[s]) for s in chunks(len(obs), batch)])


def greedy(q: np.ndarray) -> np.ndarray:
    """Greedy actions, lowest index on ties; -1 for a row with a non-finite value (as parity.compare_q)."""
    from breakout_core.parity import greedy_actions

    finite = np.isfinite(q).all(axis=1)
    return np.where(finite, greedy_actions(np.where(np.isfinite(q), q, -np.inf)), -1).astype(np.int64)


class RuntimePolicy:
    """A greedy (epsilon 0) policy whose Q-values come from a runtime: one infer() per act()."""

    def __init__(self, runtime, name: str):
        self.runtime = runtime
        self.name = name
        self.epsilon = 0.0
        self.calls = 0
        self.states = 0

    def act(self, obs: np.ndarray, rngs) -> np.ndarray:
        q = self.runtime.infer(obs)
        self.calls += 1
        self.states += len(obs)
        return greedy(q)


def with_unavailable(found: dict, con, run_id: str, measurements, runtimes) -> dict:
    """`found` metrics, marked with why a runtime they need could not run (verdict: unavailable)."""
    reason = unavailable_reason(con, run_id, measurements, runtimes)
    if reason:
        found["unavailable_reason"] = reason
    return found


def runtime_sections(con, run_id: str, measurement: str) -> list:
    """The report's runtime table (none when no runtime was recorded), to start a kind's sections."""
    section = runtime_section(con, run_id, measurement)
    return [section] if section is not None else []


def runtime_section(con, run_id: str, measurement: str):
    """Report section: each runtime's availability, reason, and what actually ran."""
    from runner.kinds.base import Section
    from runner.report_html import table_html

    frame = con.execute(
        "SELECT runtime, backend, precision, available, reason, device, provider, actual_precision, "
        "nodes_by_provider, nodes_off_provider, load_s FROM runtime_summary WHERE run_id = ? AND measurement = ? "
        "ORDER BY runtime", [run_id, measurement]).df()
    if frame.empty:
        return None
    return Section(f"{measurement}: runtimes (requested, available here, what actually ran)",
                   html=table_html(blank_nulls(frame)))


class RuntimeMeasurement(StrictModel):
    """Fields shared by the measurements that compare runtimes (parity, latency, closed_loop, episodes)."""

    runtimes: list[Name] = Field(min_length=1, description="names from the spec's runtimes")
    baseline: Name | None = Field(default=None, description="the reference runtime; default: the first listed")

    @model_validator(mode="after")
    def _runtimes_consistent(self) -> "RuntimeMeasurement":
        if len(set(self.runtimes)) != len(self.runtimes):
            raise ValueError("runtimes must be distinct")
        if self.baseline is not None and self.baseline not in self.runtimes:
            raise ValueError(f"baseline {self.baseline!r} is not one of this measurement's runtimes")
        return self

    @property
    def baseline_runtime(self) -> str:
        return self.baseline or self.runtimes[0]

    def ordered_runtimes(self) -> list[str]:
        """The baseline first, then the others as listed."""
        return [self.baseline_runtime] + [r for r in self.runtimes if r != self.baseline_runtime]

    def references(self) -> list[tuple[tuple, str, str]]:
        return [(("runtimes", j), "runtime", r) for j, r in enumerate(self.runtimes)]


def blank_nulls(frame):
    """A DataFrame with NULLs shown as empty cells, whatever the column types."""
    return frame.astype(object).where(frame.notna(), "")


def resumed_unavailable(ctx, measurement: str, name: str) -> bool:
    """On --resume: this runtime was already found unavailable in this measurement (its row stands)."""
    if not ctx.resume:
        return False
    with ctx.store.reader() as con:
        return con.execute("SELECT count(*) FROM runtime_status WHERE run_id = ? AND measurement = ? AND runtime = ? "
                           "AND NOT available", [ctx.run_id, measurement, name]).fetchone()[0] > 0
