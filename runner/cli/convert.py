"""`runner convert fp16|int8 MODEL.onnx`: the user's FP32 file converted by the project's own
converters, through a shipped spec run by `runner run` (specs/convert_fp16.yaml,
specs/convert_int8.yaml) with the file set as its FP32 source, so the search, its rows and its
report are a run like any other. Before the run, MODEL goes through what `runner check` asks of
a file (runner.cli.check_inputs: its input convention, `--input` for a float input, and ONNX
Runtime's pre-checks), and the fixed states the search checks come from MODEL's own games under
the contract (captured once per file and contract); INT8's calibration states come from
MODEL's own games too, inside the run. The converted file takes MODEL's input as it is. The
repair search (breakout_core.diagnosis.repair) keeps the fewest layers in float for the same
greedy action as FP32 on the fixed states; the file it chose is written, and the printed
`runner check OUT --baseline MODEL ...` then judges it in games."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from breakout_core.game.contract import CONTRACTS
from runner.cli.check_inputs import onnx_file_problem, prepare_models
from runner.cli.exit_codes import ExitCode, fail
from runner.cli.options import db_option, refuse_both, reports_option, set_option

SPECS = Path(__file__).resolve().parents[2] / "specs"
SOURCE = "onnx_fp32"  # the check and convert specs' FP32 artifact, set to the user's file
MEASUREMENT = "search"  # the repair measurement of each convert spec; its output artifact is the precision


@click.command()
@click.argument("precision", type=click.Choice(["fp16", "int8"]))
@click.argument("model", metavar="MODEL.onnx", type=click.Path(path_type=Path))
@click.option("--out", "out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="the file to write (default: MODEL_fp16.onnx or MODEL_int8.onnx beside MODEL)")
@click.option("--input", "model_input", metavar="DTYPE:RANGE:LAYOUT", default=None,
              help="what MODEL's input takes, as for runner check (e.g. float32:0-255:nchw); a float input must be "
                   "declared; the converted file takes the same input")
@click.option("--contract", "contract_name", type=click.Choice(sorted(CONTRACTS)), default=None,
              help="the game the model plays, whose states the search checks (default breakout-v3; docs/contracts.md)")
@set_option
@db_option
@reports_option
@click.pass_context
def convert(ctx: click.Context, precision: str, model: Path, out: Path | None, model_input: str | None,
            contract_name: str | None, overrides: tuple[str, ...], db: Path | None, reports_dir: Path) -> None:
    """Convert the FP32 MODEL.onnx to FP16 or static INT8, keeping in float the fewest layers that
    give FP32's greedy action on 60 fixed states from MODEL's own games (INT8: calibrated on states
    from other games of MODEL's, with min/max and with the 99.999th percentile, the better file
    kept). The file written takes MODEL's input as it is. Prints the file written and the verdicts
    that chose it; exit 0 when it met that target, 1 when only the closest step could be written,
    2 for a model that cannot be converted."""
    from breakout_core.conversion.export import onnx_precision
    from breakout_core.conversion.input_convention import InputConvention, convention_of
    from breakout_core.conversion.input_convention import model_input as input_of
    from breakout_core.conversion.onnx_checks import ModelCheckError, check_preprocessing, load_graph
    from runner.cli.check_contract import contract_sets, played_contract

    if out is not None:
        refuse_both("--out", overrides, (f"artifacts.{precision}.path", f"artifacts.{precision}"))
    if contract_name:
        refuse_both("--contract", overrides, ("contract.name", "contract"))
    out = out or model.with_name(f"{model.stem}_{precision}.onnx")
    spec = SPECS / f"convert_{precision}.yaml"
    sets = [f"artifacts.{precision}.path={out.resolve()}", *([f"contract.name={contract_name}"] if contract_name
                                                            else [])]
    contract = played_contract(spec, (*sets, *overrides))
    problem = onnx_file_problem(model, contract)  # its width against the actions of the game it plays
    if problem:
        fail(f"MODEL {problem}", ExitCode.BAD_INPUT)
    if (weights := onnx_precision(model)) != "fp32":
        fail(f"MODEL {model}: its weights are {weights}; convert takes an FP32 file", ExitCode.BAD_INPUT)
    try:
        source = load_graph(model)
    except ModelCheckError as exc:
        fail(f"MODEL {exc}", ExitCode.BAD_INPUT)
    try:  # a uint8 input: what every converted file is checked for, asked of the source before anything runs
        if input_of(source)[1] == "uint8":
            check_preprocessing(source)
    except ModelCheckError as exc:
        fail(f"MODEL {model}: {exc}; the converters keep that preprocessing and need it in the FP32 file",
             ExitCode.BAD_INPUT)
    if out.resolve() == model.resolve():
        fail(f"--out {out}: that is MODEL itself; name another file", ExitCode.BAD_INPUT)
    announce = lambda: click.echo(f"convert {model} to {precision.upper()}, checked on states under contract "  # noqa: E731
                                  f"{contract.described()}")
    sets += prepare_models([("MODEL", model, SOURCE, model_input)], (*sets, *overrides), spec, contract,
                           plays=SOURCE, announce=announce)
    sets += contract_sets(contract, model, (*sets, *overrides))  # MODEL's own states, if any, stand
    convention = convention_of(source, InputConvention.parse(model_input) if model_input is not None else None)
    if not convention.native:  # the file written takes MODEL's input: its runtimes feed it so
        sets.append(f"artifacts.{precision}.input={convention}")
    run = ctx.find_root().command.get_command(ctx, "run")
    verdicts = ctx.invoke(run, spec_path=spec, overrides=(*sets, *overrides), db=db, reports_dir=reports_dir,
                          fail_on=frozenset(), as_json=False)
    chosen = _chosen(db, verdicts[0]["run_id"]) if verdicts else None
    if chosen is None:
        fail("the search stored no chosen file", ExitCode.ENVIRONMENT)
    written, met, method, kept, agreement, ratio = chosen
    out = _as_given(written, out)  # a --set of the artifact's path wins over --out
    how = f"{method} calibration, " if method else ""
    kept_words = f"{len(kept)} layer(s) kept in float ({', '.join(kept)})" if kept else "no layer kept in float"
    said = (f"{how}{kept_words}; FP32's action on {agreement:.0%} of the fixed states; batch-1 P50 {ratio:.2f}x "
            f"FP32's")
    if met:
        click.echo(f"recommended: {out} ({said})")
    else:
        click.echo(f"not recommended: {out} is the closest step, no step met the target ({said})")
    declared = "" if convention.native else f" --input {convention} --baseline-input {convention}"
    under = (f" --contract {contract_name}" if contract_name else "") + (
        " --set contract.full_action_space=true" if contract.full_action_space else "")
    click.echo(f"  judge it in games: runner check {out} --baseline {model}{declared}{under}")
    sys.exit(ExitCode.OK if met else ExitCode.SAID_NO)


def _as_given(written: str, out: Path) -> Path:
    """The file the run wrote, named as the user named --out where it is that file."""
    return out if Path(written).resolve() == out.resolve() else Path(written)


def _chosen(db: Path | None, run_id: str) -> tuple | None:
    """(file written, met target, calibration method, layers kept in float, agreement, P50 ratio) of
    the step the run's search chose."""
    import json

    from runner.store.database import Store

    with Store(db).reader() as con:
        row = con.execute(
            "SELECT r.path, r.met_target, r.calibrate_method, s.kept_float, s.agreement, s.latency_ratio "
            "FROM repair_results r JOIN repair_steps s ON s.run_id = r.run_id AND s.measurement = r.measurement "
            "AND s.chosen WHERE r.run_id = ? AND r.measurement = ?", [run_id, MEASUREMENT]).fetchone()
    return None if row is None else (row[0], bool(row[1]), row[2], json.loads(row[3]), row[4], row[5])
