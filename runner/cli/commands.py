"""`runner`: validate and run specs, query the results database, write reports.

Heavy modules (torch, duckdb, altair) are imported inside the commands, so `runner
--help` stays fast.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import click

from breakout_core.contract import CONTRACTS
from breakout_core.files import is_no_space
from breakout_core.messages import first_line
from runner.cli.check import check
from runner.cli.options import db_option, reports_option, set_option
from runner.cli.specs_list import specs

EXIT_USAGE = 2  # a spec or an argument is wrong
EXIT_FAILED = 1  # the run itself failed, or the database refused
EXIT_INTERRUPTED = 130


class FiniteFloatRange(click.FloatRange):
    """A FloatRange that also refuses nan and inf, which its bounds let through (nan compares
    false with every bound, and a factor of inf would never find a regression)."""

    def convert(self, value, param, ctx) -> float:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _fail(message: str, code: int = EXIT_FAILED) -> None:
    click.echo(f"error: {message}", err=True)
    sys.exit(code)


def _unwritable(reports_dir: Path, exc: OSError) -> str:
    if is_no_space(exc):
        return f"no space left on device: {exc.filename or reports_dir}"
    return f"--reports {reports_dir}: cannot write the report there ({exc.strerror or exc})"


def _load(spec_path: Path, overrides: tuple[str, ...] = ()):
    from runner.spec.document import SpecError, load_spec

    try:
        return load_spec(spec_path, overrides=overrides)
    except SpecError as exc:
        for problem in exc.problems:
            click.echo(f"error: {problem}", err=True)
        sys.exit(EXIT_USAGE)


def _store(db: Path | None):
    from runner.store.database import Store

    return Store(db)


class RunnerCommands(click.Group):
    """Every command's last word on a full disk or a damaged database: one line, never a traceback."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except OSError as exc:
            if not is_no_space(exc):
                raise
            _fail(f"no space left on device: {exc.filename or 'a file this command writes'}")
        except Exception as exc:
            from runner.store.database import StoreError

            if not isinstance(exc, StoreError):
                raise
            _fail(str(exc))


@click.group(cls=RunnerCommands, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Declarative experiments on a Breakout DQN: specs in, DuckDB rows and verdicts out."""


@main.command()
@click.argument("specs", nargs=-1, required=True, type=click.Path(path_type=Path))
@click.option("--resolved", is_flag=True,
              help="print each spec as it is validated, stored and hashed (its `extends` merged in)")
@set_option
def validate(specs: tuple[Path, ...], resolved: bool, overrides: tuple[str, ...]) -> None:
    """Check spec files; print one line per problem (file:line: field: message)."""
    from runner.spec.document import SpecError, check_base, load_spec
    from runner.spec.extends import is_base_only

    bad = False
    for spec_path in specs:
        try:
            if is_base_only(spec_path) and not resolved and not overrides:
                check_base(spec_path)
                click.echo(f"ok: {spec_path} (a base that specs extend)")
                continue
            loaded = load_spec(spec_path, overrides=overrides)
            click.echo(loaded.text, nl=False) if resolved else click.echo(f"ok: {spec_path}")
        except SpecError as exc:
            bad = True
            for problem in exc.problems:
                click.echo(f"error: {problem}", err=True)
    sys.exit(EXIT_USAGE if bad else 0)


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
@click.option("--runs-dir", type=click.Path(file_okay=False, path_type=Path), default=Path("runs"), show_default=True,
              help="where checkpoints and other run files go")
@click.option("--executor", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="where training (trial, seed) pairs run: in this process, or as Ray tasks")
@click.option("--ray-address", metavar="ADDRESS",
              help="join this Ray cluster (e.g. 10.0.0.5:6379 or 'auto'); default: start Ray on this machine")
@click.option("--ray-retries", type=click.IntRange(min=0, max=10), default=1, show_default=True,
              help="times a Ray task whose worker died is run again before its pair is marked failed")
def run(spec_path: Path, overrides: tuple[str, ...], db: Path | None, reports_dir: Path, report: bool, resume: bool,
        runs_dir: Path, executor: str, ray_address: str | None, ray_retries: int) -> list[dict]:
    """Validate SPEC, execute its measurements, store every row, decide its verdicts (returned to
    a command that invokes this one)."""
    from runner.cli.terminal import log_console
    from runner.kinds.train.executors import Executor
    from runner.run.errors import ResumeRefused
    from runner.run.execute import run_spec
    from runner.store.database import Store, StoreError

    if ray_address and executor != "ray":
        _fail("--ray-address joins a Ray cluster: it needs --executor ray", EXIT_USAGE)
    loaded = _load(spec_path, overrides)
    if report or any(getattr(m, "gif", None) for m in loaded.spec.measurements):  # found out before the run
        try:
            reports_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            _fail(_unwritable(reports_dir, exc), EXIT_USAGE)
    console = log_console()
    store = Store(db, busy_timeout_s=None, on_wait=console.log)  # a slow reader delays a run, never fails it
    try:
        store.verify_readable()
        run_id, verdicts = run_spec(loaded, store, reports_dir, console, resume=resume, runs_dir=runs_dir,
                                    executor=Executor(executor, ray_address, ray_retries))
    except ResumeRefused as exc:
        _fail(str(exc), EXIT_USAGE)
    except KeyboardInterrupt:
        _fail("run interrupted; it is stored with status 'interrupted' and nothing stored before is lost", EXIT_INTERRUPTED)
    except StoreError as exc:
        _fail(str(exc))
    except Exception as exc:  # noqa: BLE001 - the run row already records it as failed
        _fail(str(exc) if is_no_space(exc) else f"run failed: {exc.__class__.__name__}: {exc}")
    click.echo(f"run {run_id} ({loaded.spec.name}) done; database {store.path}")
    for v in verdicts:
        label = json.loads(v["evidence"]).get("label")
        click.echo(f"  verdict {v['verdict']}: {v['outcome']}{f' ({label})' if label else ''} — {v['reason']}")
    if report:
        from runner.report.run_report import build_run_report

        try:
            click.echo(f"  report {build_run_report(store, reports_dir, run_id=run_id)}")
        except OSError as exc:
            _fail(f"{_unwritable(reports_dir, exc)}; the run is stored: `runner report {run_id} --reports DIR`",
                  EXIT_USAGE)
    return verdicts


@main.command()
@db_option
@click.option("--limit", default=20, show_default=True, type=click.IntRange(min=1))
def runs(db: Path | None, limit: int) -> None:
    """List the latest runs (a run whose process is gone shows as interrupted; the next writing
    command stores it so)."""
    columns = ["run_id", "spec_name", "status", "started_at", "ended_at", "contract_hash", "error"]

    def ended_shown(con, rows: list[tuple]) -> list[tuple]:
        stale = _store(db).stale_runs(con)
        status, error = columns.index("status"), columns.index("error")
        return [row[:status] + ("interrupted",) + row[status + 1:error] + (stale[row[0]],) if row[0] in stale else row
                for row in rows]

    _print_query(db, f"SELECT {', '.join(columns)} FROM runs ORDER BY started_at DESC LIMIT {int(limit)}",
                 shown=ended_shown)


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
    """Mark RUN_ID, left 'running' by a process that is gone, as interrupted (then --resume goes on with it)."""
    from runner.store.database import RunNotRunning, StoreError

    try:
        already = _store(db).mark_interrupted(run_id, "marked interrupted by hand (runner mark-interrupted)")
    except RunNotRunning as exc:
        _fail(str(exc), EXIT_USAGE)
    except StoreError as exc:
        _fail(str(exc))
    click.echo(f"run {run_id} was interrupted already: {already}" if already else f"run {run_id} marked interrupted")


@main.command(context_settings={"ignore_unknown_options": True})
@click.argument("query")
@db_option
@click.option("--csv", "as_csv", is_flag=True, help="print CSV instead of a table")
def sql(query: str, db: Path | None, as_csv: bool) -> None:
    """Run a read-only SQL QUERY over the results (tables: runs, episodes, verdicts, ...); it reads
    and writes no other file."""
    _print_query(db, query, as_csv=as_csv)


def _print_query(db: Path | None, query: str, as_csv: bool = False, shown=None) -> None:
    """Print the rows of `query`; `shown(con, rows)` may change them before they are printed."""
    import duckdb

    from runner.store.database import StoreError

    try:
        with _store(db).reader(files=False) as con:
            if not con.extract_statements(query):
                _fail("SQL: no statement in the query", EXIT_USAGE)
            cursor = con.execute(query)
            if cursor.description is None:
                return
            columns = [d[0] for d in cursor.description]
            rows = cursor.fetchall()
            if shown is not None:
                rows = shown(con, rows)
    except StoreError as exc:
        _fail(str(exc))
    except duckdb.Error as exc:
        _fail(f"SQL: {first_line(exc)}", EXIT_USAGE)
    if as_csv:
        import csv

        writer = csv.writer(sys.stdout)
        writer.writerow(columns)
        writer.writerows(rows)
        return
    from runner.cli.terminal import folding_table, table_console

    table = folding_table(*columns)
    for row in rows:
        table.add_row(*("" if v is None else f"{v:.10g}" if isinstance(v, float) else str(v) for v in row))
    table_console().print(table)
    click.echo(f"{len(rows)} row(s)")


@main.command()
@click.argument("run_id", required=False)
@click.option("--spec", "spec_name", default=None, help="report the latest run of this spec")
@click.option("--verdicts", "verdicts_only", is_flag=True, help="the latest verdict of every spec: terminal table + verdicts.html")
@db_option
@reports_option
def report(run_id: str | None, spec_name: str | None, verdicts_only: bool, db: Path | None, reports_dir: Path) -> None:
    """Write the HTML report of RUN_ID (default: the latest run), or the verdicts page."""
    from runner.report.run_report import build_run_report, build_verdicts_report
    from runner.store.database import NoSuchRun, StoreError

    if run_id and spec_name:
        _fail("give either RUN_ID or --spec NAME, not both", EXIT_USAGE)
    if verdicts_only and (run_id or spec_name):
        _fail("--verdicts reports the latest verdict of every spec: it takes no RUN_ID or --spec", EXIT_USAGE)
    store = _store(db)
    try:
        if verdicts_only:
            path, frame = build_verdicts_report(store, reports_dir)
            _print_verdicts(frame)
        else:
            path = build_run_report(store, reports_dir, run_id=run_id, spec_name=spec_name)
    except NoSuchRun as exc:
        _fail(str(exc), EXIT_USAGE)
    except StoreError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(_unwritable(reports_dir, exc), EXIT_USAGE)
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
@db_option
@reports_option
def compare(run_a: str | None, run_b: str | None, spec_name: str | None, factor: float, fail_factor: float | None,
            report: bool, db: Path | None, reports_dir: Path) -> None:
    """Every measurement and metric of RUN_A and RUN_B (one spec), with significance and a mark."""
    from runner.compare.page import build_compare_report, print_comparison
    from runner.compare.runs import CompareError, compare_runs
    from runner.store.database import StoreError

    store = _store(db)
    try:
        comparison = compare_runs(store, run_a, run_b, spec_name=spec_name, factor=factor)
        print_comparison(comparison)
        if report:
            click.echo(f"wrote {build_compare_report(store, comparison, reports_dir)}")
    except CompareError as exc:
        _fail(str(exc), EXIT_USAGE)
    except StoreError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(_unwritable(reports_dir, exc), EXIT_USAGE)
    if fail_factor is not None:
        worse = comparison.regressions(fail_factor)
        for row in worse:
            click.echo(f"regression: {row.measurement} {row.subject} {row.metric}: {row.value_a:.4g} → "
                       f"{row.value_b:.4g} ({row.test})", err=True)
        if worse:
            sys.exit(EXIT_FAILED)
        if not comparison.judged():
            _fail("--fail-on-regression: no metric of the two runs could be judged (each is not comparable, not "
                  "testable or timed on another machine), and a gate does not pass on no evidence")


@main.command()
@click.option("--model", type=click.Path(dir_okay=False, exists=True, path_type=Path),
              default=Path("models/reference/dqn_breakout.onnx"), show_default=True, help="the agent's ONNX file")
@click.option("--provider", type=click.Choice(["wasm", "webgpu"]), default="wasm", show_default=True,
              help="onnxruntime-web provider the page runs the agent on")
@click.option("--seed", default=0, show_default=True, type=click.IntRange(min=0), help="the seed the page starts with")
@click.option("--port", default=8765, show_default=True, type=click.IntRange(min=0, max=65535),
              help="port on 127.0.0.1 (0: any free port)")
@click.option("--pace-ms", default=1000 / 15, show_default=True, type=FiniteFloatRange(min=0),
              help="ms between agent steps (66.7: 15 steps a second, the game's real speed)")
@click.option("--contract", "contract_name", default="breakout-v3", show_default=True,
              type=click.Choice(sorted(CONTRACTS)), help="the game both sides play")
@db_option
def play(model: Path, provider: str, seed: int, port: int, pace_ms: float, contract_name: str,
         db: Path | None) -> None:
    """Serve a page where a person plays Breakout beside the agent (same seed); games go to DuckDB."""
    import time

    from breakout_core.browser.server import web_files_missing
    from breakout_core.export import onnx_contract
    from runner.play.server import PlayServer
    from runner.spec.file_checks import file_problem

    missing = web_files_missing() or file_problem(model, "onnx")
    if missing:
        _fail(missing, EXIT_USAGE)
    contract = CONTRACTS[contract_name]
    try:
        server = PlayServer(_store(db), model, contract, provider=provider, seed=seed, port=port,
                            pace_ms=pace_ms).start()
    except OSError as exc:
        _fail(str(exc))
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
    """Write the checkpoint's model card from the training and evaluation runs' rows."""
    from runner.report.model_card import write_model_card
    from runner.store.database import StoreError

    try:
        path = write_model_card(_store(db), checkpoint, train_run, list(eval_runs),
                                out or checkpoint.with_name("MODEL_CARD.md"), measurement)
    except (StoreError, KeyError, ValueError) as exc:
        _fail(str(exc))
    click.echo(f"model card: {path}")


@main.command(name="export")
@click.argument("run_id")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="folder for the Parquet files (default: exports/RUN_ID)")
@db_option
def export_command(run_id: str, out_dir: Path | None, db: Path | None) -> None:
    """Write every stored row of RUN_ID as Parquet, one file per table."""
    from runner.store.database import StoreError
    from runner.store.transfer import TransferRefused, export_run

    out_dir = out_dir or Path("exports") / run_id
    try:
        counts = export_run(_store(db), run_id, out_dir)
    except TransferRefused as exc:
        _fail(str(exc), EXIT_USAGE)
    except StoreError as exc:
        _fail(str(exc))
    except OSError as exc:
        _fail(f"{out_dir}: cannot write the export ({exc.strerror or exc})")
    click.echo(f"wrote {out_dir}: " + ", ".join(f"{t} {n}" for t, n in counts.items()))


@main.command(name="import")
@click.argument("in_dir", type=click.Path(file_okay=False, exists=True, path_type=Path))
@db_option
def import_command(in_dir: Path, db: Path | None) -> None:
    """Append a run written by `runner export` (refused if that run is already stored)."""
    import duckdb

    from runner.store.database import StoreError
    from runner.store.transfer import TransferRefused, import_run

    store = _store(db)
    made_here = not store.path.exists()
    try:
        run_id, counts = import_run(store, in_dir)
    except (TransferRefused, StoreError, duckdb.Error) as exc:
        if made_here:  # a failed import leaves no database where there was none
            store.remove_files()
        if isinstance(exc, TransferRefused):
            _fail(str(exc), EXIT_USAGE)
        _fail(str(exc) if isinstance(exc, StoreError) else f"{in_dir}: cannot import ({first_line(exc)})")
    click.echo(f"imported run {run_id}: " + ", ".join(f"{t} {n}" for t, n in counts.items()))


main.add_command(check)
main.add_command(specs)


def _print_verdicts(frame) -> None:
    from runner.cli.terminal import coloured, folding_table, table_console
    from runner.report.run_report import compared, outcome_text, spec_shown, verdict_groups

    colours = {"deployment-worthy": "green", "rejected": "red", "inconclusive": "yellow", "unavailable": "bright_black"}
    console = table_console()
    console.print("latest verdicts, grouped by host and contract hash", highlight=False)
    for title, group in verdict_groups(frame):
        table = folding_table("spec", "verdict", "compared", "outcome", "reason", "run", title=title)
        for r in group.itertuples(index=False):
            table.add_row(spec_shown(r), r.verdict, compared(r), coloured(outcome_text(r), colours[r.outcome]),
                          r.reason, r.run_id)
        console.print(table)
