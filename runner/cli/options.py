"""Options several commands share, declared once."""

from __future__ import annotations

from pathlib import Path

import click

db_option = click.option("--db", "db", type=click.Path(dir_okay=False, path_type=Path), default=None,
                         help="results database (default: $RUNNER_DB or ./results.duckdb)")
reports_option = click.option("--reports", "reports_dir", type=click.Path(file_okay=False, path_type=Path),
                              default=Path("reports"), show_default=True, help="where HTML reports go")
set_option = click.option("--set", "overrides", multiple=True, metavar="PATH=VALUE",
                          help="change a value of the spec before it is validated, e.g. measurements.0.iterations=2000 "
                               "or measurements.NAME.seeds='{start: 0, count: 5}' (mapping keys by name, list items "
                               "by index or name, the value read as YAML; repeatable)")
confirm_option = click.option("--confirm", is_flag=True,
                              help="seeds a spec draws (`seeds: {drawn: N}`) come from the confirmation range, "
                                   "which no spec may name, instead of the check range")

fail_fast_option = click.option("--fail-fast", is_flag=True,
                                help="run the measurements gating verdicts read first and stop at the first rejected "
                                     "one; the verdicts not reached are said (exit status: the whole run's)")


def refuse_both(option: str, overrides: tuple[str, ...], paths: tuple[str, ...]) -> None:
    """Exit 2 in one line where a `--set` argument sets what `option`, also given, says: a value
    given twice would otherwise be decided by which one the command lays on last."""
    from runner.cli.exit_codes import ExitCode, fail

    for text in overrides:
        if text.split("=", 1)[0].strip() in paths:
            fail(f"{option} and --set {text} both say {paths[0]}: give one of them", ExitCode.BAD_INPUT)
