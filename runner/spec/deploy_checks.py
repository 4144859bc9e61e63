"""Checks across a spec's sections: its artifacts, runtimes and the names its measurements
and verdicts use, each problem as (location, message).

The file rule: an artifact must exist when the spec is validated, except one whose
`made_by` names the spec itself (its own output, written by an `export` measurement of
that spec). A missing file made by another spec is reported with that spec's name and
file, so `runner validate` says what to run first. (`load_spec(..., will_exist=...)`
accepts the outputs of specs that will run before, for checking a chain of specs.)

A kind takes part through its hooks (runner.kinds.kind.Kind): `references` (the runtimes,
artifacts and measurements a measurement names), `outputs` (the artifacts it writes),
`metric_problem` (why a verdict may not use a metric there), `episode_seeds` and
`held_out_seeds` (the games it plays, and those no measurement may play: a held-out seed
that the spec plays anywhere, or that the fixed states it reads were captured from, is a
problem; these hooks are the one way a kind takes part in that check, so every kind that
plays a seeded game declares it in `episode_seeds`) and `spec_problems` (what only the whole
spec shows: the backends of the runtimes it names, its own checks against the spec and its
files). Where a spec may write its outputs is `runner.spec.output_paths`'s to say.
"""

from __future__ import annotations

from pathlib import Path

from runner.spec.output_paths import output_path_problems


def _names(values) -> str:
    return ", ".join(sorted(values)) or "none"


def deploy_problems(spec, context: dict | None = None) -> list[tuple[tuple, str]]:
    """Artifacts, runtimes and the names measurements and verdicts use: (location, message) each."""
    from runner.kinds.registry import KINDS

    context = context or {}
    kinds = [KINDS[m.kind] for m in spec.measurements]
    outputs = [kind.outputs(m) for kind, m in zip(kinds, spec.measurements)]
    check_files = context.get("check_files", True)
    own = [(("measurements", i, *loc), message) for i, (kind, m) in enumerate(zip(kinds, spec.measurements))
           for loc, message in kind.spec_problems(m, spec, context)]
    return (_artifact_problems(spec, context, {n for written in outputs for n in written})
            + _runtime_problems(spec) + _reference_problems(spec, kinds, outputs) + _metric_problems(spec)
            + _held_out_problems(spec, kinds, check_files) + own
            # output paths read no file: judged wherever they resolve against the spec's folder
            + (output_path_problems(spec) if check_files or context.get("base_dir") is not None else []))


def _artifact_problems(spec, context: dict, outputs: set[str]) -> list[tuple[tuple, str]]:
    problems: list[tuple[tuple, str]] = []
    check_files = context.get("check_files", True)
    will_exist = {str(Path(p).resolve()) for p in context.get("will_exist", ())}
    for name, artifact in spec.artifacts.items():
        path = Path(artifact.path)
        own = artifact.made_by == spec.name
        if own and name not in outputs:
            problems.append((("artifacts", name, "made_by"),
                             f"made_by names this spec, but none of its export measurements writes {name!r}"))
        if check_files and artifact.type == "onnx" and path.is_file() and not own:  # an output is not read
            problem = _input_problem(path, artifact.input)
            if problem:
                problems.append((("artifacts", name, "input"), f"{path.name} {problem}"))
            played = {config.artifact for config in spec.runtimes.values()}
            problem = _width_problem(path, spec) if name in played else None
            if problem:
                problems.append((("artifacts", name, "path"), f"{path.name}: {problem}"))
        if not check_files or own or path.is_file() or str(path.resolve()) in will_exist:
            continue
        if artifact.made_by is None:
            problems.append((("artifacts", name, "path"), f"model file not found: {path}"))
        else:
            producer = Path(context.get("base_dir") or path.parent, f"{artifact.made_by}.yaml")
            hint = (f" ({producer}): run `runner run {producer}` first" if producer.is_file()
                    else ": run that spec first")
            problems.append((("artifacts", name, "path"),
                             f"file not found: {path}; it is made by spec {artifact.made_by!r}{hint}"))
    return problems


def _input_problem(path: Path, declared: str | None) -> str | None:
    """Why an ONNX file's input does not fit its declared convention, or, a float input, why it needs
    one (breakout_core.conversion.input_convention); an undeclared uint8 input is the runtime's to check."""
    import onnx

    from breakout_core.conversion.input_convention import InputConvention, convention_problem, declared_in, model_input

    try:
        model = onnx.load(path, load_external_data=False)
        own, dtype = declared_in(model), model_input(model)[1]
    except Exception:  # noqa: BLE001 -- the file's own check says what is wrong with it
        return None
    if declared is None and own is None and dtype == "uint8":
        return None
    return convention_problem(model, InputConvention.parse(declared) if declared else own, option="input:")


def _width_problem(path: Path, spec) -> str | None:
    """Why an ONNX model a runtime plays gives another number of Q-values than the spec's contract has
    actions (4, or 18 under full_action_space); a file whose output is not (B, N) is the runtime's to
    refuse."""
    from breakout_core.conversion.export import inspect_onnx
    from breakout_core.conversion.model_prechecks import output_problem

    try:
        outputs = inspect_onnx(path).outputs
        contract = spec.contract.build()
    except Exception:  # noqa: BLE001 -- the file's own check says what is wrong with it
        return None
    width = outputs[0].shape[-1] if len(outputs) == 1 and len(outputs[0].shape) == 2 else None
    return output_problem(width, contract) if isinstance(width, int) and width > 0 else None


def _runtime_problems(spec) -> list[tuple[tuple, str]]:
    problems: list[tuple[tuple, str]] = []
    for name, config in spec.runtimes.items():
        artifact = spec.artifacts.get(config.artifact)
        if artifact is None:
            problems.append((("runtimes", name, "artifact"),
                             f"unknown artifact {config.artifact!r}; defined: {_names(spec.artifacts)}"))
            continue
        problem = config.backend.artifact_problem(config.options(), artifact.type, artifact.precision)
        if problem:
            problems.append((("runtimes", name, "artifact"),
                             f"{problem}; {config.artifact!r} is {artifact.type} ({artifact.path})"))
    return problems


def _reference_problems(spec, kinds, outputs) -> list[tuple[tuple, str]]:
    problems: list[tuple[tuple, str]] = []
    by_name = {m.name: m for m in spec.measurements}
    for i, (kind, m) in enumerate(zip(kinds, spec.measurements)):
        for loc, what, value in kind.references(m):
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
                    problems.append((where, f"{value!r} is written here, so artifacts.{value} "
                                            f"needs made_by: {spec.name}"))
                elif not what.startswith("artifact_out") and artifact.made_by == spec.name and not any(
                        value in written for written in outputs[:i]):
                    problems.append((where, f"{value!r} is written by this spec, "
                                            "but by no measurement before this one"))
            elif what.startswith("measurement:"):
                wanted = what.partition(":")[2]
                other = by_name.get(value)
                if other is None or other.kind != wanted:
                    choices = [n for n, o in by_name.items() if o.kind == wanted]
                    problems.append((where, f"{value!r} is not a {wanted} measurement of this spec; "
                                            f"choose from {_names(choices)}"))
    return problems


def _held_out_problems(spec, kinds, check_files: bool) -> list[tuple[tuple, str]]:
    """Held-out seeds (calibration games) that the spec plays, or that fixed states it reads came
    from: one line per held-out field and game that overlap, at the list entry of the first
    seed in common (at the field where the seeds are a range)."""
    played = [(f"measurement {m.name!r} ({'.'.join(map(str, loc))}) plays",
               seeds if isinstance(seeds, range) else set(seeds))  # drawn seeds: a reserved range
              for kind, m in zip(kinds, spec.measurements) for loc, seeds in kind.episode_seeds(m)]
    if check_files:
        played += [(f"the fixed states artifacts.{name} ({artifact.path}) were captured from", seeds)
                   for name, artifact in spec.artifacts.items()
                   if artifact.type == "fixed_states" and artifact.made_by != spec.name
                   and (seeds := _captured_seeds(Path(artifact.path)))]
    problems: list[tuple[tuple, str]] = []
    for i, (kind, m) in enumerate(zip(kinds, spec.measurements)):
        for loc, seeds in kind.held_out_seeds(m):
            declared = _value_at(m, loc)
            for who, other in played:
                if common := sorted(s for s in set(seeds) if s in other):
                    more = f", ... ({len(common)} in all)" if len(common) > 5 else ""
                    shown = ", ".join(map(str, common[:5])) + more
                    entry = (declared.index(common[0]),) if isinstance(declared, list) else ()
                    problems.append((("measurements", i, *loc, *entry), "held-out seeds must be disjoint from every "
                                                                        f"game the spec plays: {who} {shown}"))
    return problems


def _value_at(model, loc: tuple):
    """The value a measurement declares at `loc` (field names and list indices)."""
    for key in loc:
        model = model[key] if isinstance(key, int) else getattr(model, key)
    return model


def _captured_seeds(path: Path) -> set[int]:
    """The episode seeds a fixed-states file was captured from (none when it cannot be read:
    file_checks says why)."""
    import numpy as np

    if not path.is_file():
        return set()
    try:
        with np.load(path, allow_pickle=False) as data:
            return {int(s) for s in data["episode_seeds"]}
    except Exception:  # noqa: BLE001 -- a damaged or foreign file is reported by file_checks
        return set()


def _metric_problems(spec) -> list[tuple[tuple, str]]:
    from runner.kinds.registry import KINDS

    problems: list[tuple[tuple, str]] = []
    by_name = {m.name: m for m in spec.measurements}
    for i, v in enumerate(spec.verdicts):
        m = by_name.get(v.measurement)
        if m is None:
            continue
        for metric in v.deployment_worthy_when:
            message = KINDS[m.kind].metric_problem(m, metric)
            if message:
                problems.append((("verdicts", i, "deployment_worthy_when", metric), message))
    return problems
