"""The spec's `artifacts:` and `runtimes:` sections, and the fields every runtime kind shares.

    artifacts:                      # files a spec reads or writes, by name
      checkpoint: {path: ../models/reference/dqn_breakout.pt}
      onnx_fp32: {path: ../models/reference/dqn_breakout.onnx, made_by: day22_export}
      onnx_fp16: {path: ../models/reference/dqn_breakout_fp16.onnx, made_by: day22_export, precision: fp16}
    runtimes:                       # named runtime configurations, each loading one artifact
      torch_fp32: {runtime: torch, device: cpu, precision: fp32, artifact: checkpoint}
      ort_cpu: {runtime: onnxruntime, provider: cpu, artifact: onnx_fp32}
      ort_cuda: {runtime: onnxruntime, provider: cuda, disable_cpu_ep_fallback: true, artifact: onnx_fp32}
      trt_fp32: {runtime: tensorrt, precision: fp32, artifact: onnx_fp32}

A runtime's keys are its backend's options (breakout_core.runtimes: each class's OPTIONS),
from which one model per registered backend is derived here; an unknown backend or option
is a validation error listing the known ones. What files a backend loads and in which
precision it computes are the backend's own facts too. The checks across sections are in
runner.spec.deploy_checks; running a configured runtime is runner.kinds.shared.runtime_lifecycle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import Field, ValidationInfo, create_model, field_validator, model_validator

from breakout_core.runtimes.base import Option, Runtime
from breakout_core.runtimes.registry import RUNTIMES
from runner.spec.fields import Name, StrictModel, spec_relative

ARTIFACT_TYPES = {".pt": "checkpoint", ".pth": "checkpoint", ".onnx": "onnx", ".npz": "fixed_states",
                  ".engine": "engine", ".plan": "engine"}


class ArtifactSpec(StrictModel):
    """A file by name: a checkpoint (.pt), an ONNX model (.onnx), fixed states (.npz) or an engine."""

    path: str = Field(description="relative to the spec file")
    made_by: Name | None = Field(default=None, description="the spec that writes this file; this spec's own name "
                                 "marks an output of one of its export measurements")
    precision: Literal["fp32", "fp16", "int8"] = Field(default="fp32", description="weights of an ONNX file")
    input: str | None = Field(default=None, description="what an ONNX file's input takes, DTYPE:RANGE:LAYOUT "
                              "(e.g. float32:0-255:nchw); runtimes load it with an adapter from the agent's uint8 "
                              "observations in front. None: the file's own breakout.input metadata, else uint8")

    @field_validator("input")
    @classmethod
    def _convention(cls, text: str | None) -> str | None:
        from breakout_core.conversion.input_convention import InputConvention

        return None if text is None else str(InputConvention.parse(text))

    @field_validator("path")
    @classmethod
    def _suffix(cls, path: str, info: ValidationInfo) -> str:
        suffix = Path(path).suffix.lower()
        if suffix not in ARTIFACT_TYPES:
            raise ValueError(f"unknown artifact type {suffix or '(no suffix)'!r}; known: {', '.join(ARTIFACT_TYPES)}")
        return str(spec_relative(path, info))

    @property
    def type(self) -> str:
        return ARTIFACT_TYPES[Path(self.path).suffix.lower()]


class RuntimeConfigBase(StrictModel):
    """What every runtime configuration has besides its backend's options."""

    artifact: Name = Field(description="the artifact (from `artifacts:`) this runtime loads")

    @property
    def backend(self) -> type[Runtime]:
        return RUNTIMES[self.runtime]

    def options(self) -> dict[str, Any]:
        """The backend's own options (breakout_core.runtimes.make_runtime keywords)."""
        return self.model_dump(exclude={"runtime", "artifact"})

    def make_runtime(self) -> Runtime:
        return self.backend(**self.options())

    @model_validator(mode="after")
    def _backend_accepts(self) -> "RuntimeConfigBase":
        self.backend.resolve_options(**self.options())  # ValueError: its message is the problem
        return self


def _annotation(option: Option) -> Any:
    if option.choices is not None:
        annotation = bool if set(option.choices) == {False, True} else Literal[option.choices]
    else:
        annotation = option.value_type or Any
    return Optional[annotation] if option.default is None else annotation


def _spec_relative_paths(keys: tuple[str, ...]):
    def resolve(cls, path: str | None, info: ValidationInfo) -> str | None:
        return None if path is None else str(spec_relative(path, info))

    return field_validator(*keys)(classmethod(resolve))


def config_model(backend: type[Runtime]) -> type[RuntimeConfigBase]:
    """The spec model of one backend's runtime configuration, from its OPTIONS."""
    fields: dict[str, Any] = {"runtime": (Literal[backend.name], ...)}
    for key, option in backend.OPTIONS.items():
        fields[key] = (_annotation(option), Field(default=option.default, ge=option.minimum,
                                                  description=option.description or None))
    paths = tuple(key for key, option in backend.OPTIONS.items() if option.spec_path)
    validators = {"_spec_relative_paths": _spec_relative_paths(paths)} if paths else {}
    return create_model(f"{backend.__name__}Config", __base__=RuntimeConfigBase, __validators__=validators, **fields)


RUNTIME_CONFIGS: dict[str, type[RuntimeConfigBase]] = {name: config_model(cls) for name, cls in RUNTIMES.items()}
RuntimeConfig = Annotated[Union[tuple(RUNTIME_CONFIGS.values())], Field(discriminator="runtime")]


def runtime_precision(spec, name: str) -> str:
    """'fp32', 'fp16' or 'int8': what the runtime computes in (its own option, or its file's)."""
    config = spec.runtimes[name]
    return config.backend.precision(config.options(), spec.artifacts[config.artifact].precision)


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
