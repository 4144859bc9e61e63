"""The spec: one YAML file per question, validated before anything runs."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Union

from pydantic import Field, ValidationError, model_validator

from runner.kinds import KINDS
from runner.spec_base import ContractSpec, Name, PolicySpec, StrictModel, VerdictSpec
from runner.yaml_source import SpecSourceError, YamlSource, load_yaml

Measurement = Annotated[Union[tuple(kind.model for kind in KINDS.values())], Field(discriminator="kind")]


class Spec(StrictModel):
    name: Name
    description: str = ""
    contract: ContractSpec = ContractSpec()
    policies: dict[Name, PolicySpec] = Field(default_factory=dict)
    measurements: list[Measurement] = Field(min_length=1)
    verdicts: list[VerdictSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references(self) -> "Spec":
        names = [m.name for m in self.measurements]
        if len(set(names)) != len(names):
            raise ValueError("measurement names must be distinct")
        for m in self.measurements:
            unknown = [p for p in getattr(m, "policies", []) if p not in self.policies]
            if unknown:
                raise ValueError(
                    f"measurement {m.name!r} names unknown policies {unknown}; defined: {sorted(self.policies)}"
                )
        by_name = {m.name: m for m in self.measurements}
        for v in self.verdicts:
            m = by_name.get(v.measurement)
            if m is None:
                raise ValueError(f"verdict {v.name!r}: unknown measurement {v.measurement!r}; defined: {sorted(by_name)}")
            kind = KINDS[m.kind]
            for who in (v.candidate, v.baseline):
                if who not in kind.participants(m):
                    raise ValueError(f"verdict {v.name!r}: {who!r} is not in measurement {m.name!r} ({kind.participants(m)})")
            for metric in v.deployment_worthy_when:
                if metric not in kind.metric_names:
                    raise ValueError(
                        f"verdict {v.name!r}: unknown metric {metric!r} for kind {m.kind}; known: {', '.join(kind.metric_names)}"
                    )
        return self


class SpecError(ValueError):
    """One or more problems in a spec file, each a line 'file:line: field: message'."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class LoadedSpec:
    spec: Spec
    path: Path
    text: str

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]


def _data_path(loc: tuple, data) -> tuple:
    """Drop the union tags pydantic inserts into error locations, keeping the file's own keys."""
    kept: list = []
    node = data
    for part in loc:
        if isinstance(node, dict) and part in node:
            node = node[part]
            kept.append(part)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
            kept.append(part)
        elif isinstance(node, (dict, list)):
            continue  # a union tag or a model name, not a key of the file
        else:
            kept.append(part)
    return tuple(kept)


def _format_path(path: tuple) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


def _message(error: dict) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    message = error["msg"]
    return message.removeprefix("Value error, ")


def format_validation_error(exc: ValidationError, source: YamlSource) -> list[str]:
    problems = []
    for error in exc.errors():
        path = _data_path(tuple(error["loc"]), source.data)
        line = source.line_of(path)
        where = f"{source.path}:{line}" if line else str(source.path)
        problems.append(f"{where}: {_format_path(path)}: {_message(error)}")
    return problems


def load_spec(path: str | Path) -> LoadedSpec:
    """Read, check and validate a spec file; raise SpecError listing every problem."""
    try:
        source = load_yaml(path)
    except SpecSourceError as exc:
        raise SpecError([str(exc)]) from None
    if not isinstance(source.data, dict):
        raise SpecError([f"{source.path}:1: a spec is a mapping of keys (name, measurements, ...), not {type(source.data).__name__}"])
    try:
        spec = Spec.model_validate(source.data, context={"base_dir": source.path.parent})
    except ValidationError as exc:
        raise SpecError(format_validation_error(exc, source)) from None
    return LoadedSpec(spec=spec, path=source.path, text=source.text)


def spec_json_schema() -> dict:
    return Spec.model_json_schema()
