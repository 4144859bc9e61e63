"""A run's progress bars: each counts its task in the unit it names (episodes, series, runtimes,
transitions), and a task that counts something else while it plays games also says how many
transitions it has made."""

from __future__ import annotations

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    Task,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.text import Text


class TransitionsColumn(ProgressColumn):
    """'N transitions' where a task counts other things and has made transitions (episodes of an
    evaluation); nothing where it counts transitions already or makes none (latency series)."""

    def render(self, task: Task) -> Text:
        made = task.fields.get("transitions")
        return Text("" if not made or task.fields.get("unit") == "transitions" else f"{made} transitions")


def run_progress(console: Console) -> Progress:
    """The progress display of a run; its `add_task` takes `unit` (what `total` counts) and an
    optional running count of `transitions`."""
    progress = Progress(
        TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
        TextColumn("{task.fields[unit]}", markup=False), TransitionsColumn(), TimeElapsedColumn(),
        TimeRemainingColumn(), console=console, transient=False,
    )
    add_task = progress.add_task

    def add(description: str, *, unit: str = "", transitions: int = 0, **kwargs):
        return add_task(description, unit=unit, transitions=transitions, **kwargs)

    progress.add_task = add
    return progress
