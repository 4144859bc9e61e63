"""`runner check MODEL.onnx`: a shipped deployment spec (specs/check_onnx.yaml) run on one
ONNX file, through `runner run` with that file set as the spec's candidate artifact, and
an exit code a CI job can gate on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from runner.cli.exit_codes import ExitCode, fail
from runner.cli.options import db_option, reports_option, set_option

CHECK_SPEC = Path(__file__).resolve().parents[2] / "specs" / "check_onnx.yaml"
WORTHY = "deployment-worthy"


def onnx_file_problem(path: Path) -> str | None:
    """Why `path` cannot be checked: missing, not a file, not an ONNX model, or one that does
    not map the agent's observations to its Q-values."""
    from runner.spec.file_checks import file_problem

    if not path.exists():
        return f"{path}: no such file"
    if not path.is_file():
        return f"{path}: not a file"
    return file_problem(path, "onnx") or interface_problem(path)


def interface_problem(path: Path) -> str | None:
    """Why the model in `path` cannot play: it must take one uint8 (B, 4, 84, 84) input and give
    one (B, 4) output (a named dimension fits any size)."""
    from breakout_core.export import inspect_onnx
    from breakout_core.runtimes.base import NUM_ACTIONS, OBS_SHAPE

    def fits(shape: tuple, wanted: tuple) -> bool:
        sizes = zip(shape[1:], wanted)
        return len(shape) == len(wanted) + 1 and all(isinstance(d, str) or d in (0, w) for d, w in sizes)

    info = inspect_onnx(path)
    wanted = f"one uint8 input (B, {', '.join(map(str, OBS_SHAPE))}) and one output (B, {NUM_ACTIONS})"
    shown = "; ".join(f"{t.name}: {t.dtype} {tuple(t.shape)}" for t in (*info.inputs, *info.outputs))
    if len(info.inputs) != 1 or len(info.outputs) != 1 or info.inputs[0].dtype != "uint8" \
            or not fits(info.inputs[0].shape, OBS_SHAPE) or not fits(info.outputs[0].shape, (NUM_ACTIONS,)):
        return f"{path}: the agent's model takes {wanted}; this one has {shown}"
    return None


def artifact_override(artifact: str, path: Path) -> str:
    """The `--set` that makes `artifact` of the check spec this file: its absolute path (a
    relative one would be read from the spec's folder) and the precision of its weights."""
    from breakout_core.export import inspect_onnx

    value = {"path": str(path.resolve()), "precision": inspect_onnx(path).precision}
    return f"artifacts.{artifact}={json.dumps(value)}"


def summary(verdicts: list[dict]) -> str:
    counts: dict[str, int] = {}
    for v in verdicts:
        counts[v["outcome"]] = counts.get(v["outcome"], 0) + 1
    return ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items())) or "no verdicts"


@click.command()
@click.argument("model", metavar="MODEL.onnx", type=click.Path(path_type=Path))
@click.option("--baseline", metavar="OTHER.onnx", type=click.Path(path_type=Path), default=None,
              help="check against this ONNX model (default: the reference FP32 ONNX the spec names)")
@set_option
@db_option
@reports_option
@click.pass_context
def check(ctx: click.Context, model: Path, baseline: Path | None, overrides: tuple[str, ...], db: Path | None,
          reports_dir: Path) -> None:
    """Check MODEL.onnx against the reference agent's FP32 ONNX (or --baseline) on ONNX Runtime's
    CPU: the same action on 60 fixed states, batch-1 latency at most 10% slower, the same score
    over a 256-step closed loop, and full games in stages until they show less than 10% of the
    baseline's mean score lost (specs/check_onnx.yaml). Exit 0 when every verdict is deployment-worthy; 1 when any is
    rejected, inconclusive or unavailable (a gate does not pass without evidence); 2 for a
    missing or unreadable model."""
    sets = []
    for label, path, artifact in (("MODEL", model, "candidate"), ("--baseline", baseline, "baseline")):
        if path is None:
            continue
        problem = onnx_file_problem(path)
        if problem:
            fail(f"{label} {problem}", ExitCode.BAD_INPUT)
        sets.append(artifact_override(artifact, path))
    run = ctx.find_root().command.get_command(ctx, "run")
    verdicts = ctx.invoke(run, spec_path=CHECK_SPEC, overrides=(*sets, *overrides), db=db, reports_dir=reports_dir,
                          fail_on=frozenset(), as_json=False)
    passed = bool(verdicts) and all(v["outcome"] == WORTHY for v in verdicts)
    click.echo(f"check {'passed' if passed else 'failed'}: {summary(verdicts)} ({model})")
    sys.exit(ExitCode.OK if passed else ExitCode.SAID_NO)
