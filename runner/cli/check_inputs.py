"""What `runner check` does with the user's files before the run starts, so that a file it cannot
measure is one line and exit 2 with nothing stored:

- the input convention of each file (`--input`, `--baseline-input`, else its `breakout.input`
  metadata, else uint8); an undeclared float input is refused, never guessed;
- the adapter in front of it, checked on the spec's fixed states (the run writes its own copy
  under its folder, breakout_core.conversion.input_convention);
- ONNX Runtime opens it and runs it at every batch size the spec feeds (breakout_core.conversion.model_prechecks);
- with `--baseline`, the fixed states come from the baseline's own games under the spec's
  contract, captured once per baseline file (by sha256) and contract, kept under
  runs/baseline_states/; without it, a candidate that decides otherwise than the reference on
  most fixed states is told it looks like another agent.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import click
import numpy as np

from runner.cli.exit_codes import ExitCode, fail
from runner.cli.spec_loading import load_or_exit

STATES_FOLDER = Path("runs") / "baseline_states"
CAPTURE_BATCH = 6  # games a baseline's fixed states are captured from, played side by side
ANOTHER_AGENT = 0.5  # agreement with the reference below which a candidate looks like another agent


def prepare_models(files: list[tuple[str, Path | None, str, str | None]], overrides: tuple[str, ...],
                   check_spec: Path, contract, plays: str = "baseline", announce=None,
                   full_action_option: str | None = None) -> list[str]:
    """The `--set` arguments that make the spec's artifacts these files, after every check before
    the run; each `(label, path, artifact, declared input)` with a path, played under `contract`.
    The spec, with these files and `overrides`, is validated (but for the files it reads) before
    any game is played: a bad `--set` is said as the run says it. The fixed states come from
    the games of the file given for artifact `plays` (unless it is the spec's own file). A file
    that fails ends the command with one line and exit 2; `announce()`, where given, is called
    once every file passed, before any game is played; notes are printed as they come.
    `full_action_option`: how the command turns ALE's 18 actions on, said to a file that gives 18."""
    from breakout_core.conversion.input_convention import InputConvention, convention_of
    from breakout_core.conversion.onnx_checks import ModelCheckError, load_graph

    given = [(label, path, artifact, declared) for label, path, artifact, declared in files if path is not None]
    conventions: dict[str, InputConvention] = {}
    models = {}  # each file's graph, read once for its convention and its adapter
    sets = []
    for label, path, artifact, declared in given:
        problem = onnx_file_problem(path, contract, full_action_option)
        if problem:
            fail(f"{label} {problem}", ExitCode.BAD_INPUT)
        option = "--baseline-input" if artifact == "baseline" else "--input"
        try:
            convention = InputConvention.parse(declared) if declared is not None else None
        except ValueError as exc:
            fail(f"{option} {exc}", ExitCode.BAD_INPUT)
        try:
            model = models[artifact] = load_graph(path)
        except ModelCheckError as exc:
            fail(f"{label} {exc}", ExitCode.BAD_INPUT)
        if convention is None and artifact == "baseline" and "candidate" in conventions:
            convention = _same_as_candidate(model, conventions["candidate"])
        try:
            conventions[artifact] = convention_of(model, convention, option)
        except ValueError as exc:
            fail(f"{label} {path}: {exc}", ExitCode.BAD_INPUT)
        sets.append(artifact_override(artifact, path, conventions[artifact]))
    spec = load_or_exit(check_spec, (*sets, *overrides), check_files=False).spec
    _check_set_files(spec, overrides, contract)
    from breakout_core.conversion.model_prechecks import spec_batch_sizes
    from breakout_core.evaluation.fixed_states import load_fixed_states
    from breakout_core.game.envs import NUM_ACTIONS
    from runner.spec.document import load_spec

    plain = load_spec(check_spec).spec  # the spec's own baseline, and the fixed states captured from its agent
    reference, reference_states = Path(plain.artifacts[plays].path), load_fixed_states(
        plain.artifacts["fixed_states"].path).obs
    baseline = next((path for _, path, artifact, _ in given if artifact == plays), None)
    own_states = baseline is not None and not _same_file(baseline, reference) and not any(
        o.split("=", 1)[0].startswith("artifacts.fixed_states") for o in overrides)
    if baseline is None and contract.full_action_space:
        fail(f"MODEL {files[0][1]}: under the contract option full_action_space the reference agent, which plays "
             f"{NUM_ACTIONS} actions, cannot be its baseline; give your own FP32 file of the same agent with "
             f"--baseline YOUR_FP32.onnx", ExitCode.BAD_INPUT)
    sizes = spec_batch_sizes(spec.measurements) | ({CAPTURE_BATCH} if own_states else set())
    with tempfile.TemporaryDirectory(prefix="check-inputs-") as folder:
        runnable, said = {}, []
        for label, path, artifact, _ in given:
            runnable[artifact], lines = _runnable(label, path, models[artifact], conventions[artifact], Path(folder),
                                                  reference_states, sizes, contract)
            said += lines
        if announce is not None:
            announce()
        for line in said:
            click.echo(line)
        if own_states:
            label = next(label for label, _, artifact, _ in given if artifact == plays)
            states = baseline_states(runnable[plays], baseline, conventions[plays], contract, label)
            sets.append(f"artifacts.fixed_states={json.dumps({'path': str(states.resolve())})}")
        elif baseline is None and "candidate" in runnable:
            _note_another_agent(runnable["candidate"], reference, reference_states, files[0][1])
    return sets


def _check_set_files(spec, overrides: tuple[str, ...], contract) -> None:
    """The input files the user's `--set` arguments put in the spec, checked as MODEL is, before
    any game: missing, not what their type says, or a played model that does not fit `contract`.
    (The spec's own files are checked by the run; its fixed states may yet be replaced by the
    baseline's own.)"""
    played = {config.artifact for config in spec.runtimes.values()}
    for text in overrides:
        keys = text.split("=", 1)[0].split(".")
        artifact = spec.artifacts.get(keys[1]) if len(keys) > 1 and keys[0] == "artifacts" else None
        if artifact is None or artifact.made_by == spec.name:  # not an artifact, or one this spec writes
            continue
        path = Path(artifact.path)
        problem = onnx_file_problem(path, contract) if keys[1] in played else input_file_problem(path, artifact.type)
        if problem:
            fail(f"--set {text}: {problem}", ExitCode.BAD_INPUT)


def _same_file(a: Path, b: Path) -> bool:
    from breakout_core.common.hashing import model_sha256

    return b.is_file() and model_sha256(a) == model_sha256(b)


def _same_as_candidate(model, candidate):
    """The candidate's convention for a baseline that declares none of its own and whose input has the
    candidate's dtype and layout (a user's FP32 export beside its conversion), else None."""
    from breakout_core.conversion.input_convention import convention_problem, declared_in

    if candidate.native or declared_in(model) is not None or convention_problem(model, candidate):
        return None
    return candidate


def onnx_file_problem(path: Path, contract=None, full_action_option: str | None = None) -> str | None:
    """Why `path` cannot be checked: missing, not a file, not an ONNX model, or one that does not
    map the agent's observations to one Q-value per action of `contract` (default: the default
    contract's)."""
    return input_file_problem(path, "onnx") or interface_problem(path, contract, full_action_option)


def input_file_problem(path: Path, kind: str) -> str | None:
    """Why `path` cannot be read as a `kind` file (onnx, fixed_states, checkpoint): missing, not a
    file, or not what its kind says."""
    from runner.spec.file_checks import file_problem

    if not path.exists():
        return f"{path}: no such file"
    if not path.is_file():
        return f"{path}: not a file"
    return file_problem(path, kind)


def interface_problem(path: Path, contract=None, full_action_option: str | None = None) -> str | None:
    """Why the model in `path` cannot play `contract` (default: the default contract): it must take one
    input (B, 4, 84, 84), or channels last (B, 84, 84, 4), and give one output (B, the contract's
    actions); a named dimension fits any size. `full_action_option`: how the command asking turns
    full_action_space on, where not with --set."""
    from breakout_core.common.batch_calls import fixed_batch, fixed_batch_problem
    from breakout_core.conversion.export import inspect_onnx
    from breakout_core.conversion.model_prechecks import output_problem
    from breakout_core.conversion.onnx_checks import ModelCheckError
    from breakout_core.game.contract import DEFAULT_CONTRACT, contract_by_name
    from breakout_core.runtimes.base import OBS_SHAPE

    contract = contract or contract_by_name(DEFAULT_CONTRACT)

    def fits(shape: tuple, wanted: tuple) -> bool:
        sizes = zip(shape[1:], wanted)
        return len(shape) == len(wanted) + 1 and all(isinstance(d, str) or d in (0, w) for d, w in sizes)

    try:
        info = inspect_onnx(path)
    except ModelCheckError as exc:
        return str(exc)
    wanted = (f"one input (B, {', '.join(map(str, OBS_SHAPE))}) or channels last (B, 84, 84, 4) and one output "
              f"(B, {contract.num_actions})")
    shown = "; ".join([*(f"{t.name}: {t.dtype} {tuple(t.shape)}" for t in (*info.inputs, *info.outputs)),
                       f"{len(info.inputs)} input(s) and {len(info.outputs)} output(s) in all"])
    if len(info.inputs) != 1 or len(info.outputs) != 1 or len(info.outputs[0].shape) != 2 \
            or not (fits(info.inputs[0].shape, OBS_SHAPE) or fits(info.inputs[0].shape, (84, 84, 4))):
        return f"{path}: the agent's model takes {wanted}; this one has {shown}"
    actions = info.outputs[0].shape[1]
    problem = output_problem(actions, contract, full_action_option) if isinstance(actions, int) and actions > 0 \
        else None
    problem = problem or fixed_batch_problem(fixed_batch(info.inputs[0].shape))
    return f"{path}: {problem}" if problem else None


def artifact_override(artifact: str, path: Path, convention=None) -> str:
    """The `--set` that makes `artifact` of a shipped spec this file: its absolute path (a
    relative one would be read from the spec's folder), the precision of its weights and the
    input convention it was declared with (none for the agent's own uint8 observations)."""
    from breakout_core.conversion.export import onnx_precision

    value = {"path": str(path.resolve()), "precision": onnx_precision(path)}
    if convention is not None and not convention.native:
        value["input"] = str(convention)
    return f"artifacts.{artifact}={json.dumps(value)}"


def _runnable(label: str, path: Path, model, convention, folder: Path, states: np.ndarray, sizes: set[int],
              contract) -> tuple[Path, list[str]]:
    """`path` (whose graph is `model`), or its adapted copy in `folder`, once ONNX Runtime ran it at
    every batch size, and the lines that say what was done to run it (printed once every file passed)."""
    from breakout_core.conversion.input_convention import needs_adapter, write_adapted
    from breakout_core.conversion.model_prechecks import ModelRefused, precheck
    from breakout_core.conversion.onnx_checks import ModelCheckError

    runnable, said = path, []
    try:
        if needs_adapter(model, convention):
            adapted = write_adapted(path, convention, folder / f"{label.strip('-')}.onnx", states)
            said.append(f"{label} {path}: input {convention}, fed through the adapter {adapted.adapter} "
                        f"(max |dQ| {adapted.max_abs_diff:.2g} against the file fed {convention} on "
                        f"{adapted.states} fixed states)")
            runnable = adapted.path
        note = precheck(runnable, sizes, contract, states).note()
    except (ModelRefused, ModelCheckError) as exc:
        fail(f"{label} {path}: {exc}", ExitCode.BAD_INPUT)
    if note:
        said.append(f"{label} {path}: {note}")
    return runnable, said


def baseline_states(runnable: Path, baseline: Path, convention, contract, label: str = "--baseline") -> Path:
    """The fixed states of the baseline's own games under `contract`: captured once, kept under
    runs/baseline_states/ by the baseline file's sha256 and the contract, reused while both are
    the same."""
    from breakout_core.common.hashing import model_sha256
    from breakout_core.evaluation.fixed_states import capture_from_onnx, load_fixed_states, save_fixed_states

    sha = model_sha256(baseline)
    path = STATES_FOLDER / f"{baseline.stem}-{sha[:12]}-{contract.hash[:12]}.npz"
    if path.is_file():
        kept = load_fixed_states(path)
        if kept.meta.get("onnx_sha256") == sha and kept.contract_hash == contract.hash:
            click.echo(f"{label} {baseline}: fixed states from its own games, captured before: {path}")
            return path
    click.echo(f"{label} {baseline}: capturing 60 fixed states from its own games under {contract.name} "
               f"(once per file) ...")
    states = capture_from_onnx(runnable, contract, batch_size=CAPTURE_BATCH, source=baseline)
    states.meta["input"] = str(convention)
    save_fixed_states(path, states)
    click.echo(f"{label} {baseline}: fixed states in {path} "
               f"({states.meta['capture_wall_s']:.0f} s)")
    return path


def _note_another_agent(candidate: Path, reference: Path, states: np.ndarray, given: Path) -> None:
    """One line when the candidate takes other actions than the reference on most fixed states."""
    from breakout_core.common.batch_calls import session_q
    from breakout_core.conversion.model_prechecks import session

    def actions(path: Path) -> np.ndarray:
        return session_q(session(path), states).argmax(1)

    same = float(np.mean(actions(candidate) == actions(reference)))
    if same < ANOTHER_AGENT:
        click.echo(f"MODEL {given}: the same action as the reference agent on only {same:.0%} of its {len(states)} "
                   f"fixed states: it looks like another agent; check it against its own FP32 file with "
                   f"--baseline YOUR_FP32.onnx")
