"""`runner runs`: the latest runs, filtered by spec and status, with how long each took and what
its verdicts said. A run whose process is gone shows as interrupted (the next writing command
stores it so)."""

from __future__ import annotations

from datetime import datetime

from rich import box
from rich.table import Table

from runner.store.database import Store

# worst first: a run's verdict cell, and the order a script reads in `verdicts`
OUTCOMES = ("rejected", "unavailable", "inconclusive", "deployment-worthy")


def list_runs(store: Store, con, *, spec_name: str | None, status: str | None, limit: int) -> list[dict]:
    """The latest `limit` runs (newest first), each a dict of the fields docs/json_output.md lists."""
    where, args = ("WHERE spec_name = ?", [spec_name]) if spec_name is not None else ("", [])
    cursor = con.execute("SELECT run_id, spec_name, status, started_at, ended_at, contract_hash, host, error FROM runs "
                         f"{where} ORDER BY started_at DESC", args)
    columns = [d[0] for d in cursor.description]
    rows = cursor.fetchall()  # before the connection runs another query
    stale = store.stale_runs(con)
    runs = []
    for row in rows:
        run = dict(zip(columns, row))
        if run["run_id"] in stale:
            run.update(status="interrupted", error=stale[run["run_id"]])
        if status is None or run["status"] == status:
            runs.append(run)
        if len(runs) == limit:
            break
    counts: dict[str, dict[str, int]] = {run["run_id"]: {} for run in runs}
    if runs:
        for run_id, outcome, n in con.execute(
                "SELECT run_id, outcome, count(*) FROM verdicts WHERE list_contains(?, run_id) GROUP BY ALL",
                [list(counts)]).fetchall():
            counts[run_id][outcome] = n
    for run in runs:
        ended = run["ended_at"]
        run["duration_s"] = (ended - run["started_at"]).total_seconds() if ended is not None else None
        run["verdicts"] = {o: counts[run["run_id"]][o] for o in sorted(counts[run["run_id"]], key=_severity)}
    return runs


def print_runs(runs: list[dict]) -> None:
    """The runs as a terminal table, then why each run that failed or was interrupted did so,
    one run a line (an error is too long for a column of a narrow terminal)."""
    from runner.cli.terminal import table_console

    console = table_console()
    console.print(runs_table(runs))
    for run in runs:
        if run["error"]:
            console.print(f"{run['run_id']}: {run['error']}", highlight=False)
    console.print(f"{len(runs)} run(s)", highlight=False)


def runs_table(runs: list[dict]) -> Table:
    """The run id and each line of the verdicts never fold (they are there to be copied and
    read); the contract hash is cut short and the spec and start time fold first; times are
    shown to the minute."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for name in ("run_id", "spec", "status", "started", "took", "verdicts", "contract"):
        table.add_column(name, no_wrap=name in ("run_id", "status", "took", "verdicts"),
                         overflow="ellipsis" if name == "contract" else "fold",
                         min_width=len("2026-12-06") if name == "started" else None)  # folds at its space
    for run in runs:
        table.add_row(run["run_id"], run["spec_name"], run["status"], _minute(run["started_at"]),
                      _duration(run["duration_s"]), "\n".join(f"{n} {o}" for o, n in run["verdicts"].items()),
                      run["contract_hash"] or "")
    return table


def _severity(outcome: str) -> int:
    return OUTCOMES.index(outcome) if outcome in OUTCOMES else len(OUTCOMES)


def _minute(moment: datetime | None) -> str:
    return "" if moment is None else f"{moment:%Y-%m-%d %H:%M}"


def _duration(seconds: float | None) -> str:
    """'4.2 s', '3 min 20 s', '2 h 05 min'; empty for a run that has not ended."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"
