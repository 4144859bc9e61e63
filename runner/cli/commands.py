"""`runner`: validate and run specs, query the results database, write reports.

Heavy modules (torch, duckdb, altair) are imported inside the commands, so `runner
--help` stays fast.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import click

from breakout_core.common.files import is_no_space
from breakout_core.common.messages import first_line
from breakout_core.game.contract import CONTRACTS, DEFAULT_CONTRACT
from breakout_core.game.greedy import NonFiniteQ
from runner.cli.check import check
from runner.cli.convert import convert
from runner.cli.exit_codes import ExitCode, fail, store_error_code
from runner.cli.json_output import emit_json, json_option, run_document
from runner.cli.options import confirm_option, db_option, fail_fast_option, reports_option, set_option
from runner.cli.spec_loading import load_or_exit
from runner.cli.specs_list import specs
from runner.cli.verdict_listing import fail_on_outcomes


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also refuses nan and inf, which its bounds let through (nan compares
    false with every bound, and a factor of inf would never find a regression)."""

    def convert(self, value, param, ctx) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _unwritable(reports_dir: Path, exc: OSError, after: str = "") -> None:
    """Fail for a report that cannot be written: the disk is full (the environment), or the folder
    the user named cannot hold it (the request)."""
    if is_no_space(exc):
        fail(f"no space left on device: {exc.filename or reports_dir}{after}", ExitCode.ENVIRONMENT)
    fail(f"--reports {reports_dir}: cannot write the report there ({exc.strerror or exc}){after}", ExitCode.BAD_INPUT)


def _store(db: Path | None):
    from runner.store.database import Store

    return Store(db)


def _usage_line(exc: click.UsageError, ctx: click.Context | None = None) -> str:
    """A command-line mistake click found, on one line: the command, what is wrong, where help is.
    `ctx`: the group's context, for a mistake click raised without the subcommand's own (an option
    missing its value)."""
    if exc.ctx is not None:
        command = exc.ctx.command_path
    elif ctx is not None:
        command = " ".join(filter(None, (ctx.command_path, ctx.invoked_subcommand)))
    else:
        command = "runner"
    message = " ".join(exc.format_message().split())  # click lists a choice on lines of its own
    return f"{command}: {message} ('{command} --help' lists what it takes)"


class RunnerCommands(click.Group):
    """Every command's last word on a command-line mistake, a full disk or a database problem:
    one line, never a traceback, and the exit code of exit_codes.py (an unknown run is the
    request's fault, a missing, busy or damaged database the environment's)."""

    def make_context(self, info_name, args, parent=None, **extra) -> click.Context:
        try:
            return super().make_context(info_name, args, parent=parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise  # `runner` alone: its help
        except click.UsageError as exc:
            fail(_usage_line(exc), ExitCode.BAD_INPUT)

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except click.UsageError as exc:
            fail(_usage_line(exc, ctx), ExitCode.BAD_INPUT)
        except OSError as exc:
            if not is_no_space(exc):
                raise
            fail(f"no space left on device: {exc.filename or 'a file this command writes'}", ExitCode.ENVIRONMENT)
        except Exception as exc:
            from runner.store.errors import StoreError

            if not isinstance(exc, StoreError):
                raise
            fail(str(exc), store_error_code(exc))


@click.group(cls=RunnerCommands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="breakout-runner", prog_name="runner")
def main() -> None:
    """Declarative experiments on a Breakout DQN: specs in, DuckDB rows and verdicts out."""


@main.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--resolved", is_flag=True,
              help="print each spec as it is validated, stored and hashed (its `extends` merged in)")
@json_option
@set_option
def validate(specs: tuple[Path, ...], resolved: bool, as_json: bool, overrides: tuple[str, ...]) -> None:
    """Check spec files; print one line per problem (file:line: field: message)."""
    from runner.spec.document import SpecError, check_base, load_spec
    from runner.spec.extends import is_base_only

    if resolved and as_json:
        fail("--resolved prints spec texts and --json one document: give one of them", ExitCode.BAD_INPUT)
    results = []
    for spec_path in specs:
        result = {"path": str(spec_path), "ok": True, "base": False, "name": None, "problems": []}
        try:
            if is_base_only(spec_path) and not resolved and not overrides:
                check_base(spec_path)
                result["base"] = True
            else:
                loaded = load_spec(spec_path, overrides=overrides)
                result["name"] = loaded.spec.name
                if resolved:
                    click.echo(loaded.text, nl=False)
        except SpecError as exc:
            result.update(ok=False, problems=list(exc.problems))
        results.append(result)
        if not as_json:
            for problem in result["problems"]:
                click.echo(f"error: {problem}", err=True)
            if result["ok"] and not resolved:
                click.echo(f"ok: {spec_path}" + (" (a base that specs extend)" if result["base"] else ""))
    if as_json:
        emit_json({"specs": results})
    sys.exit(ExitCode.OK if all(r["ok"] for r in results) else ExitCode.BAD_INPUT)


@main.command()
def schema() -> None:
    """Print the JSON schema of specs (for editors' YAML checking)."""
    import json

    from runner.spec.document import spec_json_schema

    click.echo(json.dumps(spec_json_schema(), indent=2))


@main.command()
@click.argument("spec_path", metavar="SPEC", type=click.Path(path_type=Path))
@set_option
@db_option
@reports_option
@click.option("--report/--no-report", default=True, show_default=True, help="write the run's HTML report at the end")
@click.option("--resume", is_flag=True, help="go on with this spec's last interrupted or failed run")
@confirm_option
@click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
              help="where checkpoints and other run files go")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="where the (trial, seed) trainings run: in this process, or as Ray tasks")
@click.option("--ray-address", metavar="ADDRESS",
              help="join this Ray cluster (e.g. 10.0.0.5:6379 or 'auto'); default: start Ray on this machine")
@click.option("--ray-retries", type=click.IntRange(min=0, max=10), default=1, show_default=True,
              help="times a Ray task whose worker died is run again before its training is marked failed")
@click.option("--fail-on", "fail_on", metavar="OUTCOMES", callback=fail_on_outcomes,
              help="exit 1 when a verdict ends in one of these (comma-separated: rejected,inconclusive,unavailable)")
@fail_fast_option
@json_option
def run(spec_path: Path, overrides: tuple[str, ...], db: Path | None, reports_dir: Path, report: bool, resume: bool,
        runs_dir: Path, executor: str, ray_address: str | None, ray_retries: int, fail_on: frozenset[str],
        fail_fast: bool, as_json: bool, confirm: bool = False, emit_document=emit_json,
        gating: frozenset[str] | None = None) -> list[dict]:
    """Validate SPEC, execute its measurements, store every row, decide its verdicts (returned to
    a command that invokes this one, which may take the --json document with `emit_document`, and
    name the verdicts that gate its --fail-fast with `gating`; default: every verdict)."""
    from runner.cli.terminal import log_console
    from runner.cli.verdict_listing import echo_run_verdicts
    from runner.kinds.train.executors import Executor
    from runner.run.errors import ArtifactBusy, ResumeRefused
    from runner.run.execute import run_spec
    from runner.run.fail_fast import FailFast, not_reached
    from runner.store.database import Store
    from runner.store.errors import StoreError

    if ray_address and executor != "ray":
        fail("--ray-address joins a Ray cluster: it needs --executor ray", ExitCode.BAD_INPUT)
    loaded = load_or_exit(spec_path, overrides)
    if report or any(getattr(m, "gif", None) for m in loaded.spec.measurements):  # found out before the run
        try:
            reports_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _unwritable(reports_dir, exc)
    console = log_console()
    store = Store(db, busy_timeout_s=None, on_wait=console.log)  # a slow reader delays a run, never fails it
    try:
        store.verify_readable()
        stopping = FailFast(gating if gating is not None else frozenset(v.name for v in loaded.spec.verdicts))
        run_id, verdicts = run_spec(loaded, store, reports_dir, console, resume=resume, runs_dir=runs_dir,
                                    executor=Executor(executor, ray_address, ray_retries), confirm=confirm,
                                    fail_fast=stopping if fail_fast else None)
    except ResumeRefused as exc:
        fail(str(exc), ExitCode.BAD_INPUT)
    except ArtifactBusy as exc:  # refused before anything was stored
        fail(str(exc), ExitCode.ENVIRONMENT)
    except KeyboardInterrupt:
        fail("run interrupted; it is stored with status 'interrupted' and nothing stored before is lost",
             ExitCode.INTERRUPTED)
    except StoreError:
        raise  # the group says it in one line, with its exit code
    except NonFiniteQ as exc:  # the model file's, not the machine's; the run row records it as failed
        fail(f"run failed: {exc}", ExitCode.BAD_INPUT)
    except Exception as exc:  # noqa: BLE001 - the run row already records it as failed
        fail(str(exc) if is_no_space(exc) else f"run failed: {exc.__class__.__name__}: {exc}", ExitCode.ENVIRONMENT)
    skipped = not_reached(loaded.spec, verdicts)
    # --json: stdout is the document's alone, and the lines go to stderr (a command that takes the
    # document itself keeps its own stdout, in order, and says it where it says the rest)
    err = as_json and emit_document is emit_json
    click.echo(f"run {run_id} ({loaded.spec.name}) done; database {store.path}", err=err)
    echo_run_verdicts(verdicts, err=err)
    if skipped:
        click.echo(f"  not reached (--fail-fast): {', '.join(skipped)}", err=err)
    report_path = None
    if report:
        from runner.report.run_report import build_run_report

        try:
            report_path = build_run_report(store, reports_dir, run_id=run_id)
        except OSError as exc:
            _unwritable(reports_dir, exc, f"; the run is stored: `runner report {run_id} --reports DIR`")
        click.echo(f"  report {report_path}", err=err)
    failed = [v for v in verdicts if v["outcome"] in fail_on]
    if as_json:
        emit_document(run_document(store, run_id, loaded.spec.name, report_path and report_path.resolve(), verdicts,
                                   failed, skipped))
    for v in failed:
        click.echo(f"--fail-on: verdict {v['verdict']} is {v['outcome']}", err=True)
    if failed:
        sys.exit(ExitCode.SAID_NO)
    return verdicts


@main.command()
@db_option
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=1))
@click.option("--spec", "spec_name", default=None, help="only the runs of this spec")
@click.option("--status", type=click.Choice(["running", "done", "failed", "interrupted"]), default=None,
              help="only the runs with this status")
@json_option
def runs(db: Path | None, limit: int, spec_name: str | None, status: str | None, as_json: bool) -> None:
    """List the latest runs, how long each took and what its verdicts said (a run whose process is
    gone shows as interrupted; the next writing command stores it so)."""
    from runner.cli.run_ids import resolve_spec
    from runner.cli.runs_listing import list_runs, print_runs

    store = _store(db)
    with store.reader() as con:
        listed = list_runs(store, con, spec_name=spec_name and resolve_spec(con, spec_name), status=status,
                           limit=limit)
    if as_json:
        emit_json({"runs": listed})
        return
    print_runs(listed)


@main.command()
@db_option
def migrate(db: Path | None) -> None:
    """Upgrade the database to this runner's schema (reading commands never write it; a run does this too)."""
    store = _store(db)
    before = set(store.schema_version())
    with store.writer():
        pass
    added = [name for name in store.schema_version() if name not in before]
    click.echo(f"{store.path}: " + (f"applied {', '.join(added)}" if added else "up to date"))


@main.command(name="mark-interrupted")
@click.argument("run_id")
@db_option
def mark_interrupted(run_id: str, db: Path | None) -> None:
    """Mark RUN_ID (or a unique prefix), left 'running' by a process that is gone, as interrupted
    (then --resume goes on with it)."""
    from runner.cli.run_ids import resolved_runs

    store = _store(db)
    [run_id] = resolved_runs(store, run_id)
    already = store.mark_interrupted(run_id, "marked interrupted by hand (runner mark-interrupted)")
    click.echo(f"run {run_id} was interrupted already: {already}" if already else f"run {run_id} marked interrupted")


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("query")
@db_option
@click.option("--csv", "as_csv", is_flag=True, help="print CSV (LF line endings) instead of a table")
@json_option
def sql(query: str, db: Path | None, as_csv: bool, as_json: bool) -> None:
    """Run a read-only SQL QUERY over the results (tables: runs, episodes, verdicts, ...); it reads
    and writes no other file."""
    from runner.cli.query_output import print_query

    if as_csv and as_json:
        fail("give --csv or --json, not both", ExitCode.BAD_INPUT)
    print_query(_store(db), query, "csv" if as_csv else "json" if as_json else "table")


@main.command()
@click.argument("run_id", required=False)
@click.option("--spec", "spec_name", default=None, help="report the latest run of this spec")
@click.option("--verdicts", "verdicts_only", is_flag=True,
              help="the latest verdict of every spec: terminal table + verdicts.html")
@db_option
@reports_option
@json_option
def report(run_id: str | None, spec_name: str | None, verdicts_only: bool, db: Path | None, reports_dir: Path,
           as_json: bool) -> None:
    """Write the HTML report of RUN_ID (or a unique prefix; default: the latest run), or the verdicts page."""
    from runner.cli.run_ids import resolved_runs, resolved_spec
    from runner.cli.verdict_listing import latest_verdict_records, print_latest_verdicts
    from runner.report.run_report import build_run_report, build_verdicts_report

    if run_id and spec_name:
        fail("give either RUN_ID or --spec NAME, not both", ExitCode.BAD_INPUT)
    if verdicts_only and (run_id or spec_name):
        fail("--verdicts reports the latest verdict of every spec: it takes no RUN_ID or --spec", ExitCode.BAD_INPUT)
    if as_json and not verdicts_only:
        fail("--json lists verdicts: it goes with --verdicts", ExitCode.BAD_INPUT)
    store = _store(db)
    try:
        if verdicts_only:
            path, frame = build_verdicts_report(store, reports_dir)
        else:
            [run_id] = resolved_runs(store, run_id)
            path = build_run_report(store, reports_dir, run_id=run_id, spec_name=resolved_spec(store, spec_name))
    except OSError as exc:
        _unwritable(reports_dir, exc)
    if as_json:
        emit_json({"report": path, "verdicts": latest_verdict_records(frame)})
        return
    if verdicts_only:
        print_latest_verdicts(frame)
    click.echo(f"wrote {path}")


@main.command()
@click.argument("run_a", required=False)
@click.argument("run_b", required=False)
@click.option("--spec", "spec_name", default=None, help="compare the last two finished runs of this spec")
@click.option("--factor", default=1.1, show_default=True, type=FiniteFloatRange(min=1.0),
              help="a significant change is better/worse only beyond this factor")
@click.option("--fail-on-regression", "fail_factor", default=None, type=FiniteFloatRange(min=1.0), metavar="FACTOR",
              help="exit 1 when a metric got significantly worse beyond FACTOR")
@click.option("--report/--no-report", default=True, show_default=True, help="write the HTML compare page")
@click.option("--metric", "metrics", multiple=True, metavar="NAME",
              help="also judge this metric (repeatable; e.g. p99_ms, mean_ms); the statistics the spec's verdicts "
                   "use are judged without it")
@click.option("--json", "as_json", is_flag=True, help="print one JSON document (docs/json_output.md), nothing else")
@db_option
@reports_option
def compare(run_a: str | None, run_b: str | None, spec_name: str | None, factor: float, fail_factor: float | None,
            report: bool, metrics: tuple[str, ...], as_json: bool, db: Path | None, reports_dir: Path) -> None:
    """Every measurement and metric of RUN_A and RUN_B (one spec; unique prefixes do), with significance and a mark."""
    from runner.cli.run_ids import resolved_runs, resolved_spec
    from runner.compare.document import comparison_json
    from runner.compare.page import build_compare_report, print_comparison
    from runner.compare.runs import CompareError, compare_runs

    store = _store(db)
    run_a, run_b = resolved_runs(store, run_a, run_b)
    try:
        comparison = compare_runs(store, run_a, run_b, spec_name=resolved_spec(store, spec_name), factor=factor,
                                  metrics=metrics)
        if not as_json:
            print_comparison(comparison)
        page = build_compare_report(store, comparison, reports_dir) if report else None
        if page is not None:
            click.echo(f"wrote {page}", err=as_json)
    except CompareError as exc:
        fail(str(exc), ExitCode.BAD_INPUT)
    except OSError as exc:
        _unwritable(reports_dir, exc)
    if as_json:
        click.echo(comparison_json(comparison, fail_factor=fail_factor, report=page))
    if fail_factor is not None:
        failures = comparison.gate_failures(fail_factor)
        for line in failures:
            click.echo(line, err=True)
        if failures:
            sys.exit(ExitCode.SAID_NO)
        if not comparison.judged():
            fail("--fail-on-regression: no metric of the two runs could be judged (each is not comparable, not "
                 "testable or timed on another machine), and a gate does not pass on no evidence", ExitCode.SAID_NO)


@main.command()
@click.option("--model", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=Path("models/reference/dqn_breakout.onnx"), show_default=True, help="the agent's ONNX file")
@click.option("--provider", type=click.Choice(["wasm", "webgpu"]), default="wasm", show_default=True,
              help="onnxruntime-web provider the page runs the agent on")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help="the seed the page starts with")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(min=0, max=65535),
              help="port on 127.0.0.1 (0: any free port)")
@click.option("--pace-ms", default=1000 / 15, show_default="66.67", type=FiniteFloatRange(min=0),
              help="ms between agent steps (66.7: 15 steps a second, the game's real speed)")
@click.option("--contract", "contract_name", default=DEFAULT_CONTRACT, show_default=True,
              type=click.Choice(sorted(CONTRACTS)), help="the game both sides play")
@click.option("--full-action-space", is_flag=True,
              help="ALE's 18 actions (the contract option full_action_space), for a model with 18 outputs")
@db_option
def play(model: Path, provider: str, seed: int, port: int, pace_ms: float, contract_name: str,
         full_action_space: bool, db: Path | None) -> None:
    """Serve a page where a person plays Breakout beside the agent (same seed); games go to DuckDB."""
    import time

    import onnx

    from breakout_core.browser.server import web_files_missing
    from breakout_core.conversion.export import onnx_contract
    from breakout_core.conversion.input_convention import model_input
    from runner.cli.check_inputs import interface_problem
    from runner.play.server import PlayServer
    from runner.spec.file_checks import file_problem

    contract = CONTRACTS[contract_name].replace(**({"full_action_space": True} if full_action_space else {}))
    missing = web_files_missing() or file_problem(model, "onnx")
    if missing:
        fail(missing, ExitCode.BAD_INPUT)
    problem = interface_problem(model, contract, full_action_option="--full-action-space")
    if problem:
        fail(f"--model {problem}", ExitCode.BAD_INPUT)
    _, dtype, shape = model_input(onnx.load(model, load_external_data=False))
    if dtype != "uint8" or tuple(shape[1:]) == (84, 84, 4):  # the page feeds the observations as they are
        fail(f"--model {model}: takes {dtype} {shape}; the play page feeds the agent's uint8 observations "
             "(B, 4, 84, 84), so it plays a file that takes them (as the project's exports do)", ExitCode.BAD_INPUT)
    try:
        server = PlayServer(_store(db), model, contract, provider=provider, seed=seed, port=port,
                            pace_ms=pace_ms).start()
    except OSError as exc:  # the port is taken, or no socket can be opened
        fail(str(exc), ExitCode.ENVIRONMENT)
    click.echo(f"play page: {server.url()}  (keys: left/right arrows move, space serves; Ctrl-C stops)")
    trained_under = onnx_contract(model)[1]
    if trained_under not in (None, contract.hash):
        click.echo(f"the model was trained under contract {trained_under}; both sides play {contract.name} "
                   f"({contract.hash})")
    click.echo(f"finished games go to {server.store.path}, table play_games")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.stop()


@main.command(name="model-card")
@click.option("--checkpoint", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=Path("models/reference/dqn_breakout.pt"), show_default=True)
@click.option("--train-run", required=True, help="the run that trained the checkpoint")
@click.option("--eval-run", "eval_runs", required=True, multiple=True,
              help="an evaluation run whose table goes on the card (repeat for several)")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="default: MODEL_CARD.md beside the checkpoint")
@click.option("--measurement", default="reference", show_default=True,
              help="the train measurement of the training run that wrote the checkpoint")
@db_option
def model_card(checkpoint: Path, train_run: str, eval_runs: tuple[str, ...], out: Path | None, measurement: str,
               db: Path | None) -> None:
    """Write the checkpoint's model card from the training and evaluation runs' rows (run ids or unique prefixes)."""
    from runner.cli.run_ids import resolved_runs
    from runner.report.model_card import write_model_card

    store = _store(db)
    train_run, *eval_runs = resolved_runs(store, train_run, *eval_runs)
    try:
        path = write_model_card(store, checkpoint, train_run, eval_runs,
                                out or checkpoint.with_name("MODEL_CARD.md"), measurement)
    except ValueError as exc:  # the runs hold no card of this checkpoint and measurement
        fail(str(exc), ExitCode.BAD_INPUT)
    click.echo(f"model card: {path}")


@main.command(name="export")
@click.argument("run_id")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="folder for the Parquet files (default: exports/RUN_ID)")
@db_option
def export_command(run_id: str, out_dir: Path | None, db: Path | None) -> None:
    """Write every stored row of RUN_ID (or a unique prefix) as Parquet, one file per table."""
    from runner.cli.run_ids import resolved_runs
    from runner.store.transfer import TransferRefused, export_run

    store = _store(db)
    [run_id] = resolved_runs(store, run_id)
    out_dir = out_dir or Path("exports") / run_id
    try:
        counts = export_run(store, run_id, out_dir)
    except TransferRefused as exc:
        fail(str(exc), ExitCode.BAD_INPUT)
    except OSError as exc:  # a full disk is the group's; a folder that cannot be written is the request's
        if is_no_space(exc):
            raise
        fail(f"{out_dir}: cannot write the export ({exc.strerror or exc})", ExitCode.BAD_INPUT)
    click.echo(f"wrote {out_dir}: " + ", ".join(f"{t} {n}" for t, n in counts.items()))


@main.command(name="import")
@click.argument("in_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@db_option
def import_command(in_dir: Path, db: Path | None) -> None:
    """Append a run written by `runner export` (refused if that run is already stored)."""
    import duckdb

    from runner.store.errors import StoreError
    from runner.store.transfer import TransferRefused, import_run

    store = _store(db)
    made_here = not store.path.exists()
    try:
        run_id, counts = import_run(store, in_dir)
    except (TransferRefused, StoreError, duckdb.Error) as exc:
        if made_here:  # a failed import leaves no database where there was none
            store.remove_files()
        if isinstance(exc, StoreError):
            raise  # the group says it in one line, with its exit code (a refused transfer: bad input)
        fail(f"{in_dir}: cannot import ({first_line(exc)})", ExitCode.BAD_INPUT)
    click.echo(f"imported run {run_id}: " + ", ".join(f"{t} {n}" for t, n in counts.items()))


main.add_command(check)
main.add_command(convert)
main.add_command(specs)
