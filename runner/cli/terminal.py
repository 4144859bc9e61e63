"""The consoles and tables the CLI prints with. They print text as written: a spec's labels, its
trial names and stored values may hold brackets, which rich would otherwise read as markup and
drop, or fail on. A table written to a pipe or a file is as wide as its rows; in a terminal a
long cell folds onto the next line rather than being cut, so a run id can always be copied."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

UNBOUNDED_WIDTH = 100_000  # a pipe or file has no width: nothing in a table is wrapped or cut
LOG_WIDTH = 240  # a run's log in a file: one line per message, not wrapped at 80 columns


def table_console() -> Console:
    """A console for tables and their captions on standard output."""
    width = None if Console().is_terminal else UNBOUNDED_WIDTH
    return Console(markup=False, width=width)


def log_console() -> Console:
    """A console for a run's progress and log lines on standard error."""
    if Console(stderr=True).is_terminal:
        return Console(stderr=True, markup=False)
    return Console(stderr=True, markup=False, width=LOG_WIDTH, log_path=False)


def folding_table(*columns: str, title: str | None = None) -> Table:
    """A table whose long cells fold rather than end in an ellipsis."""
    table = Table(title=title)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table


def coloured(text: str, colour: str | None) -> Text:
    """`text` as written, in `colour` where one is given."""
    return Text(text, style=colour or "")
