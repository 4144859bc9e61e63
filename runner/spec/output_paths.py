"""Where a spec may write: the files it reads, and the files under `models/` that the shipped
specs read, are never the path of one of its outputs, and no two of its outputs share one.

An output is an artifact whose `made_by` is the spec itself (an export or repair measurement
writes it). Paths are compared resolved (`..` and symbolic links followed), so two spellings
of one file are one file. Reading one file under two names is harmless and allowed.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

SHIPPED_SPECS = Path(__file__).resolve().parents[2] / "specs"
SHIPPED_MODELS = SHIPPED_SPECS.parent / "models"


def spec_inputs(spec) -> list[tuple[tuple, Path, str, str | None]]:
    """The files a spec reads, whether they exist or not: (location in the spec, path, type,
    made_by) for each checkpoint policy, each artifact that this spec does not write itself,
    and each checkpoint a training starts from."""
    files = [(("policies", name, "path"), Path(policy.path), "checkpoint", None)
             for name, policy in spec.policies.items() if getattr(policy, "type", None) == "checkpoint"]
    files += [(("artifacts", name, "path"), Path(artifact.path), artifact.type, artifact.made_by)
              for name, artifact in spec.artifacts.items() if artifact.made_by != spec.name]
    files += [(("measurements", i, "start_from"), Path(m.start_from), "checkpoint", None)
              for i, m in enumerate(spec.measurements) if getattr(m, "start_from", None)]
    return files


def output_folders(spec) -> dict[str, Path]:
    """Each artifact's folder, resolved as the spec is checked: the folder a run that writes
    the artifact locks it in and publishes it to, which must still resolve there then
    (breakout_core.common.files.publish)."""
    return {name: Path(artifact.path).parent.resolve() for name, artifact in spec.artifacts.items()}


def output_path_problems(spec) -> list[tuple[tuple, str]]:
    """(location, message) for each output artifact whose path is another output's, a file the
    spec reads, or a file under `models/` that a shipped spec reads and this spec does not make."""
    from runner.spec.yaml_source import format_path

    read = {}
    for loc, path, _, _ in spec_inputs(spec):
        read.setdefault(path.resolve(), loc)
    written: dict[Path, str] = {}
    problems = []
    for name, artifact in spec.artifacts.items():
        if artifact.made_by != spec.name:
            continue
        path, where = Path(artifact.path).resolve(), ("artifacts", name, "path")
        if path in written:
            problems.append((where, f"{path} is also the path of artifacts.{written[path]}, another output of this "
                                    "spec: one would overwrite the other"))
        elif path in read:
            problems.append((where, f"{path} is also {format_path(read[path])}, which this spec reads: an output "
                                    "may not overwrite an input"))
        elif readers := sorted(reader for reader, made_by in shipped_inputs().get(path, ()) if made_by != spec.name):
            more = f" (and by {len(readers) - 1} more)" if len(readers) > 1 else ""
            problems.append((where, f"{path} is read by the shipped spec {readers[0]} as an input{more}: an output "
                                    "may not replace it"))
        written.setdefault(path, name)
    return problems


@lru_cache(maxsize=1)
def shipped_inputs() -> dict[Path, frozenset[tuple[str, str | None]]]:
    """Each file under `models/` that a shipped spec reads -> {(that spec's name, the
    `made_by` it gives the file)}, read from the specs' YAML alone (a shipped spec that does
    not read is `runner validate`'s business, not this check's)."""
    from runner.spec.extends import is_base_only, resolve_extends
    from runner.spec.yaml_source import SpecSourceError, load_yaml

    readers: dict[Path, set[tuple[str, str | None]]] = {}
    for file in sorted(SHIPPED_SPECS.glob("*.yaml")) if SHIPPED_MODELS.is_dir() else ():
        if is_base_only(file):  # the specs that extend it read its files
            continue
        try:
            data = resolve_extends(load_yaml(file)).data
        except SpecSourceError:
            continue
        if not isinstance(data, dict):
            continue
        name = str(data.get("name", file.stem))
        for written, made_by in _read_paths(data):
            path = (file.parent / written).resolve()
            if path.is_relative_to(SHIPPED_MODELS) and made_by != name:
                readers.setdefault(path, set()).add((name, made_by))
    return {path: frozenset(found) for path, found in readers.items()}


def _read_paths(data: dict) -> list[tuple[str, str | None]]:
    """(path as written, made_by) of each file a spec's document names: its artifacts, its
    checkpoint policies and the checkpoints its trainings start from."""
    def entries(key: str) -> list[dict]:
        found = data.get(key) or {}
        values = found.values() if isinstance(found, dict) else found if isinstance(found, list) else []
        return [value for value in values if isinstance(value, dict)]

    paths = [(a.get("path"), a.get("made_by")) for a in entries("artifacts")]
    paths += [(p.get("path"), None) for p in entries("policies")]
    paths += [(m.get("start_from"), None) for m in entries("measurements")]
    return [(path, made_by if isinstance(made_by, str) else None) for path, made_by in paths if isinstance(path, str)]
