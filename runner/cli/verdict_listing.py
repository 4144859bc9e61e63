"""Verdicts on the terminal and as JSON records: those a run just decided, and the latest of every
spec (`runner report --verdicts`)."""

from __future__ import annotations

import json

import click

COLOURS = {"deployment-worthy": "green", "rejected": "red", "inconclusive": "yellow", "unavailable": "bright_black"}


def run_verdict_record(row: dict) -> dict:
    """A verdict row a run stored, as `runner run --json` lists it; a verdict on paired games
    carries their robust figures (`games`), any other null there."""
    from runner.kinds.shared.episode_scores import ROBUST_FIGURES

    evidence = json.loads(row["evidence"])
    metrics = evidence.get("metrics", {})
    games = {k: metrics.get(k) for k in ROBUST_FIGURES} if "paired_diff_median" in metrics else None
    return {"verdict": row["verdict"], "measurement": row["measurement"], "candidate": row["candidate"],
            "baseline": row["baseline"] or None, "outcome": row["outcome"], "label": evidence.get("label"),
            "reason": row["reason"], "in_words": evidence.get("in_words"), "rules": evidence.get("rules", []),
            "games": games}


def echo_run_verdicts(rows: list[dict], *, err: bool = False) -> None:
    """Each verdict on one line (on stderr with `err`): its outcome and label, what its figures
    show in words, and the rule's figures it was decided by."""
    for v in rows:
        evidence = json.loads(v["evidence"])
        label, words = evidence.get("label"), evidence.get("in_words")
        click.echo(f"  verdict {v['verdict']}: {v['outcome']}{f' ({label})' if label else ''} — "
                   f"{f'{words}; by the rule: ' if words else ''}{v['reason']}", err=err)


def latest_verdict_records(frame) -> list[dict]:
    """The rows of the latest-verdicts frame, as `runner report --verdicts --json` lists them."""
    fields = ["host", "contract_hash", "spec_name", "overrides", "verdict", "candidate", "baseline", "outcome", "label",
              "reason", "run_id", "decided_at"]
    records = []
    for r in frame.itertuples(index=False):
        record = {f: getattr(r, f) for f in fields}
        record["baseline"] = record["baseline"] or None
        record["overrides"] = json.loads(r.overrides) if isinstance(r.overrides, str) else []  # NULL: NaN
        record["label"] = record["label"] if isinstance(record["label"], str) and record["label"] else None  # NaN
        records.append(record)
    return records


def print_latest_verdicts(frame) -> None:
    """One table per host and contract. An outcome and a run id never fold (an outcome's label goes
    with the reason); the other columns fold first."""
    from rich.table import Table

    from runner.cli.terminal import coloured, table_console
    from runner.report.run_report import compared, spec_shown, verdict_groups

    console = table_console()
    console.print("latest verdicts, grouped by host and contract hash", highlight=False)
    for title, group in verdict_groups(frame):
        table = Table(title=title)
        for column in ("spec", "verdict", "compared", "outcome", "reason", "run"):
            table.add_column(column, overflow="fold", no_wrap=column in ("outcome", "run"))
        for r in group.itertuples(index=False):
            label = r.label if isinstance(r.label, str) and r.label else None  # NULL may arrive as NaN
            table.add_row(spec_shown(r), r.verdict, compared(r), coloured(r.outcome, COLOURS[r.outcome]),
                          f"{label}: {r.reason}" if label else r.reason, r.run_id)
        console.print(table)


GATING_OUTCOMES = ("rejected", "inconclusive", "unavailable")  # what `runner run --fail-on` may name


def fail_on_outcomes(ctx: click.Context, param: click.Parameter, value: str | None) -> frozenset[str]:
    """`--fail-on rejected,inconclusive`: the outcomes that make `runner run` exit 1."""
    if value is None:
        return frozenset()
    named = {part.strip() for part in value.split(",") if part.strip()}
    if not named or not named <= set(GATING_OUTCOMES):
        raise click.BadParameter(f"{value!r}: name outcomes among {', '.join(GATING_OUTCOMES)}, separated by commas",
                                 ctx, param)
    return frozenset(named)
