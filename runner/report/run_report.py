"""Reports are pure functions of the database: a run's page and the verdicts page."""

from __future__ import annotations

import html
import json
from pathlib import Path

from breakout_core.files import write_whole
from breakout_core.messages import described
from runner.report.html import render_page, table_html
from runner.report.section import Section
from runner.store.database import NoSuchRun, Store


def _run_row(con, run_id: str | None, spec_name: str | None) -> dict:
    if run_id:
        query, args = "SELECT * FROM runs WHERE run_id = ?", [run_id]
    elif spec_name:
        query, args = "SELECT * FROM runs WHERE spec_name = ? ORDER BY started_at DESC LIMIT 1", [spec_name]
    else:
        query, args = "SELECT * FROM runs ORDER BY started_at DESC LIMIT 1", []
    cursor = con.execute(query, args)
    row = cursor.fetchone()
    if row is None:
        what = f"run {run_id!r}" if run_id else f"run of spec {spec_name!r}" if spec_name else "run"
        raise NoSuchRun(f"no {what} in the database")
    return dict(zip([d[0] for d in cursor.description], row))


def verdict_rows(con, run_id: str | None = None):
    if run_id:
        return con.execute(
            "SELECT verdict, measurement, candidate, baseline, outcome, evidence->>'$.label' AS label, reason, evidence "
            "FROM verdicts "
            "WHERE run_id = ? ORDER BY verdict", [run_id]).df()
    return con.execute(
        "SELECT host, contract_hash, spec_name, overrides, verdict, candidate, baseline, outcome, "
        "evidence->>'$.label' AS label, reason, run_id, decided_at FROM latest_verdicts "
        "ORDER BY host, contract_hash, spec_name, overrides NULLS FIRST, verdict").df()


def verdict_groups(frame):
    """(title, rows) per host and contract hash: one table never mixes machines or contracts."""
    return [(f"host {host} · contract {contract}", group)
            for (host, contract), group in frame.groupby(["host", "contract_hash"], sort=True, dropna=False)]


def spec_shown(row) -> str:
    """The spec's name, and the `--set` arguments its run was given: another question than the file's."""
    overrides = json.loads(row.overrides) if isinstance(row.overrides, str) else []  # NULL may arrive as NaN
    return " ".join([row.spec_name, *(f"--set {text}" for text in overrides)])


def compared(row) -> str:
    return f"{row.candidate} vs {row.baseline}" if row.baseline else row.candidate


def outcome_text(row) -> str:
    return f"{row.outcome} ({row.label})" if isinstance(row.label, str) and row.label else row.outcome  # NULL may arrive as NaN


def _verdict_section(frame) -> Section:
    if frame.empty:
        return Section("Verdicts", html="<p>This spec declares no verdicts.</p>")
    rows = []
    for r in frame.itertuples(index=False):
        rules = json.loads(r.evidence).get("rules", [])
        rule_text = "<br>".join(
            html.escape(f"{x['metric']} = {x['value']:.4g} {x['rule']} → {'pass' if x['passed'] else 'fail'}")
            if x["value"] is not None else html.escape(f"{x['metric']}: not computed") for x in rules)
        rows.append(
            f"<tr class='{r.outcome}'><td>{html.escape(r.verdict)}</td><td>{html.escape(compared(r))}</td>"
            f"<td><b>{html.escape(outcome_text(r))}</b></td><td>{html.escape(r.reason)}</td><td>{rule_text}</td></tr>")
    table = ("<table><thead><tr><th>verdict</th><th>candidate vs baseline</th><th>outcome</th><th>reason</th>"
             f"<th>rules and evidence</th></tr></thead><tbody>{''.join(rows)}</tbody></table>")
    return Section("Verdicts", html=table)


def build_run_report(store: Store, out_dir: Path, run_id: str | None = None, spec_name: str | None = None) -> Path:
    from runner.kinds.registry import KINDS
    from runner.spec.document import spec_model
    from runner.spec.yaml_source import read_spec_text

    with store.reader() as con:
        run = _run_row(con, run_id, spec_name)
        run_id = run["run_id"]
        try:
            spec = spec_model().model_validate(read_spec_text(run["spec_text"]), context={"check_files": False})
        except Exception as exc:  # a spec the current code no longer accepts: show rows, not charts
            spec, spec_problem = None, described(exc)
        sections = [_verdict_section(verdict_rows(con, run_id))]
        if spec is not None:
            for m in spec.measurements:
                sections += KINDS[m.kind].report(con, run_id, m)
        else:
            sections.append(Section("Measurements", html=f"<p>The stored spec no longer validates ({html.escape(spec_problem)}).</p>"))
    packages = json.loads(run["packages"] or "{}")
    intro = (
        f"<p><b>run</b> {html.escape(run_id)} · <b>status</b> {html.escape(run['status'])}"
        + (f" ({html.escape(run['error'] or '')})" if run["error"] else "")
        + f" · <b>started</b> {run['started_at']} · <b>ended</b> {run['ended_at']}</p>"
        f"<p><b>contract</b> {html.escape(run['contract_hash'] or '')} · <b>commit</b> {html.escape(str(run['git_commit']))}"
        f" · <b>host</b> {html.escape(run['host'])} · <b>cpu</b> {html.escape(str(run['cpu']))} · <b>gpu</b> {html.escape(str(run['gpu']))}</p>"
        f"<p><b>packages</b> {html.escape(', '.join(f'{k} {v}' for k, v in packages.items()))}</p>"
        f"<details><summary>spec {html.escape(run['spec_path'] or '')} ({html.escape(run['spec_hash'])})</summary>"
        f"<pre>{html.escape(run['spec_text'])}</pre></details>"
        + "".join(f"<p><b>the spec changed with</b> {html.escape(' '.join(f'--set {t}' for t in json.loads(given)))}"
                  "</p>" for given in [run.get("overrides")] if given)
    )
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{run['spec_name']}-{run_id}.html"
    write_whole(path, render_page(f"{run['spec_name']} — {run_id}", intro, sections).encode("utf-8"))
    return path


def build_verdicts_report(store: Store, out_dir: Path):
    """The latest verdict of every spec on each host and contract; returns (path, the rows as a DataFrame)."""
    with store.reader() as con:
        frame = verdict_rows(con)
    sections = []
    for title, group in verdict_groups(frame):
        rows = group.assign(spec_name=[spec_shown(r) for r in group.itertuples()],
                            compared=[compared(r) for r in group.itertuples()],
                            outcome=[outcome_text(r) for r in group.itertuples()])
        body = table_html(rows[["spec_name", "verdict", "compared", "outcome", "reason", "run_id"]])
        for r in group.itertuples():
            text = html.escape(outcome_text(r))
            body = body.replace(f"<td>{text}</td>", f"<td class='{r.outcome}'><b>{text}</b></td>")
        sections.append(Section(title, html=body))
    intro = ("<p>Grouped by host and contract hash: a verdict reached on one machine or under one contract is "
             "never shown as another's.</p>")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "verdicts.html"
    write_whole(path, render_page("Verdicts (latest per spec, host and contract)", intro,
                                  sections or [Section("Verdicts", html="<p>No verdicts yet.</p>")]).encode("utf-8"))
    return path, frame
