"""`runner sql`: a read-only query's rows as a terminal table, CSV or JSON."""

from __future__ import annotations

import csv
import sys

from runner.cli.exit_codes import ExitCode, fail
from runner.cli.json_output import emit_json
from runner.store.database import Store


def print_query(store: Store, query: str, form: str) -> None:
    """Print the rows of `query` in `form` ('table', 'csv' or 'json'); a statement that returns
    no rows prints nothing (as JSON: no columns and no rows)."""
    import duckdb

    from breakout_core.common.messages import first_line

    try:
        with store.reader(files=False) as con:
            if not con.extract_statements(query):
                fail("SQL: no statement in the query", ExitCode.BAD_INPUT)
            cursor = con.execute(query)
            columns = [d[0] for d in cursor.description] if cursor.description else []
            rows = cursor.fetchall() if cursor.description else []
    except duckdb.Error as exc:
        fail(f"SQL: {first_line(exc)}", ExitCode.BAD_INPUT)
    if form == "json":
        emit_json({"columns": columns, "rows": rows})
    elif not columns:
        return
    elif form == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")  # LF, as every Unix tool expects
        writer.writerow(columns)
        writer.writerows(rows)
    else:
        _print_table(columns, rows)


def _print_table(columns: list[str], rows: list[tuple]) -> None:
    import click

    from runner.cli.terminal import folding_table, table_console

    table = folding_table(*columns)
    for row in rows:
        table.add_row(*("" if v is None else f"{v:.10g}" if isinstance(v, float) else str(v) for v in row))
    table_console().print(table)
    click.echo(f"{len(rows)} row(s)")
