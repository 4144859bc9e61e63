"""The spec: one YAML file per question, validated before anything runs."""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Union

from pydantic import Field, ValidationError, ValidationInfo, model_validator

from runner.kinds import registry
from runner.kinds.registry import KINDS
from runner.kinds.shared.training_settings import process_wide_problems
from runner.spec.deploy_checks import deploy_problems
from runner.spec.extends import BASE_ONLY_PREFIX, EXTENDS_KEY, is_base_only, resolve_extends
from runner.spec.fields import ContractSpec, Name, PolicySpec, StrictModel, VerdictSpec
from runner.spec.output_paths import output_folders, spec_inputs
from runner.spec.overrides import apply_overrides
from runner.spec.runtimes import ArtifactSpec, RuntimeConfig
from runner.spec.yaml_source import SpecSourceError, YamlSource, format_path, load_yaml, placed_each, read_spec_text


def _measurement_union() -> object:
    """A measurement is one of the registered kinds' models, told apart by `kind`."""
    return Annotated[Union[tuple(kind.model for kind in KINDS.values())], Field(discriminator="kind")]


Measurement = _measurement_union()


class Spec(StrictModel):
    name: Name
    description: str = ""
    contract: ContractSpec = ContractSpec()
    policies: dict[Name, PolicySpec] = Field(default_factory=dict)
    artifacts: dict[Name, ArtifactSpec] = Field(default_factory=dict,
                                                description="files by name (runner.spec.runtimes)")
    runtimes: dict[Name, RuntimeConfig] = Field(default_factory=dict, description="named runtime configurations")
    measurements: list[Measurement] = Field(min_length=1)
    verdicts: list[VerdictSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _references(self, info: ValidationInfo) -> "Spec":
        if not (info.context or {}).get("defer_references"):  # load_spec reports them with their lines
            problems = reference_problems(self, info.context)
            if problems:
                raise ValueError("; ".join(f"{format_path(loc)}: {message}" for loc, message in problems))
        return self


_built_for = registry.version


def spec_model() -> type[Spec]:
    """`Spec`, rebuilt first where the registry of kinds changed since it was built (a kind
    registered for a while): every validation goes through here."""
    global _built_for
    if _built_for != registry.version:
        Spec.model_fields["measurements"].annotation = list[_measurement_union()]
        Spec.model_rebuild(force=True)
        _built_for = registry.version
    return Spec


def reference_problems(spec: Spec, context: dict | None = None) -> list[tuple[tuple, str]]:
    """Names that point nowhere, and missing artifact files: (location in the file, message) for each."""
    problems: list[tuple[tuple, str]] = []
    names = [m.name for m in spec.measurements]
    for i, m in enumerate(spec.measurements):
        if names.index(m.name) != i:
            problems.append((("measurements", i, "name"), f"measurement name {m.name!r} is used twice"))
        for j, policy in enumerate(getattr(m, "policies", [])):
            if policy not in spec.policies:
                problems.append((("measurements", i, "policies", j),
                                 f"unknown policy {policy!r}; defined: {', '.join(sorted(spec.policies)) or 'none'}"))
    by_name = {m.name: m for m in spec.measurements}
    for i, v in enumerate(spec.verdicts):
        m = by_name.get(v.measurement)
        if m is None:
            problems.append((("verdicts", i, "measurement"),
                             f"unknown measurement {v.measurement!r}; defined: {', '.join(sorted(by_name))}"))
            continue
        kind = KINDS[m.kind]
        if v.baseline is None and kind.needs_baseline:
            problems.append((("verdicts", i), f"a verdict on a {m.kind} measurement needs a baseline"))
        for role, who in (("candidate", v.candidate), ("baseline", v.baseline)):
            if who is not None and who not in kind.participants(m):
                problems.append((("verdicts", i, role),
                                 f"{who!r} is not in measurement {m.name!r}; "
                                 f"choose from {', '.join(kind.participants(m))}"))
        for metric in v.deployment_worthy_when:
            if metric not in kind.metric_names:
                problems.append((("verdicts", i, "deployment_worthy_when", metric),
                                 f"unknown metric for kind {m.kind}; "
                                 f"known: {', '.join(kind.metric_names) or 'none yet'}"))
            elif metric in kind.comparison_metrics and v.baseline is None:
                problems.append((("verdicts", i, "deployment_worthy_when", metric),
                                 f"{metric} compares the candidate with a baseline; this verdict names none"))
    problems += process_wide_problems(spec.measurements)
    unreadable = file_problems(spec, context)
    bad_files = {loc for loc, _ in unreadable}  # a file that cannot be read has no contract to compare
    return problems + deploy_problems(spec, context) + unreadable + contract_problems(spec, context, bad_files)


def spec_files(spec: Spec) -> list[tuple[tuple, Path, str, str | None]]:
    """The files a spec reads (`spec_inputs`) that exist now."""
    return [file for file in spec_inputs(spec) if file[1].is_file()]


def file_problems(spec: Spec, context: dict | None = None) -> list[tuple[tuple, str]]:
    """Checkpoint policies and artifacts on disk that are not what their type says."""
    from runner.spec.file_checks import file_problem

    if not (context or {}).get("check_files", True):
        return []
    problems = []
    for where, path, kind, _ in spec_files(spec):
        message = file_problem(path, kind)
        if message:
            problems.append((where, message))
    return problems


def contract_problems(spec: Spec, context: dict | None = None,
                      unreadable: set = frozenset()) -> list[tuple[tuple, str]]:
    """Fixed states on disk captured under another contract than the spec plays, and models
    (checkpoints, ONNX files) trained under another one unless the spec says that is
    deliberate (`contract.other_contracts: deliberate`, e.g. a breakout-v2 agent played under
    breakout-v3). Files at `unreadable` locations, and artifacts that no runtime or measurement
    reads (a base's files a spec replaced, as `runner check --baseline` does), are left out."""
    import importlib

    if not (context or {}).get("check_files", True):
        return []
    contract = spec.contract.build()
    models_too = spec.contract.other_contracts != "deliberate"
    # imported only for a spec that names such a file: reading a checkpoint needs torch
    readers = {"checkpoint": ("breakout_core.learning.qnetwork", "checkpoint_contract"),
               "onnx": ("breakout_core.conversion.export", "onnx_contract"),
               "fixed_states": ("breakout_core.evaluation.fixed_states", "states_contract")}
    problems = []
    used = used_artifacts(spec)
    for where, path, kind, made_by in spec_files(spec):
        if kind not in readers or where in unreadable or (kind != "fixed_states" and not models_too) \
                or (where[0] == "artifacts" and where[1] not in used):
            continue
        module, reader = readers[kind]
        try:
            name, made_under = getattr(importlib.import_module(module), reader)(path)
        except ValueError as exc:
            problems.append((where, str(exc)))
            continue
        if made_under is not None and made_under != contract.hash:
            maker = f"`runner run` spec {made_by}" if made_by else "the spec that makes them"
            hint = (f"re-capture them under this contract ({maker})" if kind == "fixed_states"
                    else "set contract.other_contracts: deliberate if that is the question")
            made = f"{name} ({made_under})" if name else made_under
            problems.append((where, f"{path} was made under contract {made}, this spec plays "
                                    f"{contract.name} ({contract.hash}); {hint}"))
    return problems


def used_artifacts(spec: Spec) -> set[str]:
    """The artifacts that a runtime or a measurement of the spec names."""
    used = {config.artifact for config in spec.runtimes.values()}
    return used | {value for m in spec.measurements for _, what, value in registry.KINDS[m.kind].references(m)
                   if what.startswith("artifact")}


MAX_PROBLEMS = 20  # a spec's problems told, the rest counted (a 10,000-trial sweep's each fail alike)


class SpecError(ValueError):
    """One or more problems in a spec file, each a line 'file:line: field: message'; past
    MAX_PROBLEMS, the rest are counted in one last line."""

    def __init__(self, problems: list[str]):
        if len(problems) > MAX_PROBLEMS:
            more = len(problems) - MAX_PROBLEMS
            problems = [*problems[:MAX_PROBLEMS], f"... and {more:,} more problems in this spec"]
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class LoadedSpec:
    spec: Spec
    path: Path
    text: str
    overrides: tuple[str, ...] = ()  # the `--set` arguments laid on the file, as given
    # each artifact's folder, resolved as the spec was checked: where its outputs are published
    folders: dict[str, Path] = dataclasses.field(default_factory=dict, compare=False)

    @property
    def hash(self) -> str:
        return hashlib.sha256(self.text.encode()).hexdigest()[:16]


def _data_path(loc: tuple, data, missing: bool = False) -> tuple:
    """Drop the union tags pydantic inserts into error locations, keeping the file's own keys
    (and, for a missing key, its name, which the file cannot contain)."""
    kept: list = []
    node = data
    for n, part in enumerate(loc):
        if missing and n == len(loc) - 1:
            kept.append(part)
            break
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


def _message(error: dict) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_not_found":
        return f"required key {error['ctx']['discriminator'].strip(chr(39))!r} is missing"
    message = error["msg"]
    return message.removeprefix("Value error, ")


def format_validation_error(exc: ValidationError, source: YamlSource) -> list[str]:
    problems = []
    for error in exc.errors():
        placed = placed_each(error.get("ctx", {}).get("error"))
        paths = [(_data_path(tuple(error["loc"]) + at, source.data, missing=error["type"] == "missing"), message)
                 for at, message in [(p.at, str(p)) for p in placed] or [((), _message(error))]]
        paths.sort(key=lambda found: source.line_of(found[0]) or 0)  # one check's problems in the file's order
        problems += [_problem(source, path, message) for path, message in paths]
    return problems


def _problem(source: YamlSource, path: tuple, message: str) -> str:
    return f"{source.where(path)}: {format_path(path)}: {message}"


def load_spec(path: str | Path, *, will_exist=(), overrides: tuple[str, ...] = (),
              check_files: bool = True) -> LoadedSpec:
    """Read, check and validate a spec file; raise SpecError listing every problem.

    `will_exist`: artifact paths that specs run before this one will write (a chain of specs).
    `overrides`: `path=value` texts laid on the resolved document first (runner.spec.overrides).
    `check_files=False`: the files the spec names are neither required nor read."""
    if is_base_only(path):
        raise SpecError([f"{path}: a base that specs extend (its name begins with {BASE_ONLY_PREFIX}), not a spec "
                         "to run; run one that extends it"])
    try:
        source = resolve_extends(load_yaml(path))
        if isinstance(source.data, dict):
            source = apply_overrides(source, tuple(overrides))
    except SpecSourceError as exc:
        raise SpecError([str(exc)]) from None
    if not isinstance(source.data, dict):
        raise SpecError([f"{source.path}:1: a spec is a mapping of keys (name, measurements, ...), "
                         f"not {type(source.data).__name__}"])
    context = {"base_dir": source.path.parent, "will_exist": will_exist, "check_files": check_files}
    try:
        spec = spec_model().model_validate(source.data, context={**context, "defer_references": True})
    except ValidationError as exc:
        problems = format_validation_error(exc, source)
        problems += [_problem(source, loc, message) for loc, message in _partial_problems(source.data, context)]
        raise SpecError(problems) from None
    problems = reference_problems(spec, context)
    if problems:
        raise SpecError([_problem(source, loc, message) for loc, message in problems])
    return LoadedSpec(spec=spec, path=source.path, text=source.text, overrides=tuple(overrides),
                      folders=output_folders(spec))


def check_base(path: str | Path) -> None:
    """A base-only spec file (see `is_base_only`) reads as YAML, with its own chain of extends;
    its values are validated in the specs that extend it. Raise SpecError otherwise."""
    try:
        source = resolve_extends(load_yaml(path))
    except SpecSourceError as exc:
        raise SpecError([str(exc)]) from None
    if not isinstance(source.data, dict):
        raise SpecError([f"{source.path}:1: a base is a mapping of keys, as a spec is"])


def settings_as_written(text: str) -> dict:
    """The spec in `text` with every default filled in and its paths as written, not resolved
    against a folder: what a run stores as the settings it ran, so that `runner compare` sets
    side by side runs made in two checkouts. Raises ValidationError for a spec this runner
    does not accept."""
    return spec_model().model_validate(read_spec_text(text) or {}, context={"check_files": False}).model_dump(
        mode="json")


def _partial_problems(data: dict, context: dict) -> list[tuple[tuple, str]]:
    """The reference problems of the parts of a spec that validate on their own, so that one
    pass reports a field's error and a name that points nowhere elsewhere in the file.

    Each policy, artifact, runtime, measurement and verdict is validated alone; the valid
    ones make a partial spec. A problem naming a part that did not validate is left out:
    that part's own error is already reported."""
    from typing import get_args

    from pydantic import TypeAdapter

    def valid(field: str, value):
        annotation = spec_model().model_fields[field].annotation
        return TypeAdapter(get_args(annotation)[-1]).validate_python(value, context=context)

    parts: dict = {}
    dropped: list[str] = []
    written_by_dropped: set[str] = set()  # names a measurement that did not validate gives: maybe its outputs
    kept_at: dict[str, list[int]] = {}
    try:
        parts["name"] = data.get("name") if isinstance(data.get("name"), str) else "spec"
        parts["contract"] = ContractSpec.model_validate(data.get("contract", {}), context=context)
    except ValidationError:
        return []  # without its contract, a spec's files cannot be judged
    for field in ("policies", "artifacts", "runtimes"):
        entries = data.get(field) or {}
        parts[field] = {}
        for key, value in entries.items() if isinstance(entries, dict) else []:
            try:
                parts[field][key] = valid(field, value)
            except ValidationError:
                dropped.append(str(key))
    for field in ("measurements", "verdicts"):
        items = data.get(field) or []
        parts[field], kept_at[field] = [], []
        for i, value in enumerate(items if isinstance(items, list) else []):
            try:
                parts[field].append(valid(field, value))
                kept_at[field].append(i)
            except ValidationError:
                if isinstance(value, dict) and isinstance(value.get("name"), str):
                    dropped.append(value["name"])
                if field == "measurements" and isinstance(value, dict):
                    written_by_dropped.update(_strings_in(value))
    partial = Spec.model_construct(**parts)
    problems = []
    for loc, message in reference_problems(partial, context):
        if any(repr(name) in message for name in dropped):
            continue
        if loc[:1] == ("artifacts",) and loc[2:] == ("made_by",) and loc[1] in written_by_dropped:
            continue  # the measurement that writes it did not validate: its own error is reported
        if loc and loc[0] in kept_at and len(loc) > 1:  # back to the file's own index
            loc = (loc[0], kept_at[loc[0]][loc[1]], *loc[2:])
        problems.append((loc, message))
    return problems


def _strings_in(value) -> set[str]:
    """Every string in `value`, nested lists and mappings included (an export's `int8:` entries
    name the files they write one level down)."""
    if isinstance(value, str):
        return {value}
    items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return {found for item in items for found in _strings_in(item)}


def spec_json_schema() -> dict:
    """The spec model's JSON schema, with `extends` beside its keys; a spec that extends another
    may leave out what its base declares, so nothing is required where `extends` is given."""
    schema = spec_model().model_json_schema()
    schema["properties"][EXTENDS_KEY] = {"type": "string",
                                         "description": "a base spec beside this file, merged under it"}
    schema["if"] = {"required": [EXTENDS_KEY]}
    schema["then"] = {"required": []}
    schema["else"] = {"required": schema.pop("required", [])}
    return schema
