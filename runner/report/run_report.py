"""Reports are pure functions of the database: a run's page and the verdicts page."""

from __future__ import annotations

import html
import json
from pathlib import Path

from breakout_core.common.files import write_whole
from breakout_core.common.messages import described
from runner.report.html import render_page, table_html
from runner.report.section import Section
from runner.store.database import Store
from runner.store.errors import NoSuchRun


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
            "SELECT verdict, measurement, candidate, baseline, outcome, evidence->>'$.label' AS label, reason, "
            "evidence FROM verdicts "
            "WHERE run_id = ? ORDER BY verdict", [run_id]).df()
    return con.execute(
        "SELECT v.host, v.contract_hash, r.contract->>'$.name' AS contract_name, v.spec_name, v.overrides, v.verdict, "
        "v.candidate, v.baseline, v.outcome, v.evidence->>'$.label' AS label, v.reason, v.run_id, v.decided_at "
        "FROM latest_verdicts v JOIN runs r USING (run_id) "
        "ORDER BY v.host, v.contract_hash, v.spec_name, v.overrides NULLS FIRST, v.verdict").df()


def verdict_groups(frame):
    """(title, rows) per host and contract hash: one table never mixes machines or contracts."""
    return [(f"host {host} · contract {_named(group)}{contract}", group)
            for (host, contract), group in frame.groupby(["host", "contract_hash"], sort=True, dropna=False)]


def _named(group) -> str:
    names = sorted({n for n in group["contract_name"] if isinstance(n, str) and n})
    return f"{' / '.join(names)} " if names else ""


def spec_shown(row) -> str:
    """The spec's name, and the `--set` arguments its run was given: another question than the file's."""
    overrides = json.loads(row.overrides) if isinstance(row.overrides, str) else []  # NULL may arrive as NaN
    return " ".join([row.spec_name, *(f"--set {text}" for text in overrides)])


def compared(row) -> str:
    return f"{row.candidate} vs {row.baseline}" if row.baseline else row.candidate


def outcome_text(row) -> str:
    # NULL may arrive as NaN
    return f"{row.outcome} ({row.label})" if isinstance(row.label, str) and row.label else row.outcome


def _verdict_section(frame) -> Section:
    from runner.kinds.shared.episode_scores import robust_figures_text

    if frame.empty:
        return Section("Verdicts", html="<p>This spec declares no verdicts.</p>")
    rows = []
    for r in frame.itertuples(index=False):
        evidence = json.loads(r.evidence)
        rules = evidence.get("rules", [])
        rule_text = "<br>".join(
            html.escape(f"{x['metric']} = {x['value']:.4g} {x['rule']} → {'pass' if x['passed'] else 'fail'}")
            if x["value"] is not None else html.escape(f"{x['metric']}: not computed") for x in rules)
        if figures := robust_figures_text(evidence.get("metrics", {})):
            rule_text += "<br>" + html.escape(figures)
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
        verdicts = _verdict_section(verdict_rows(con, run_id))
        sections = [Section("How this run was made", html=_provenance(run))]
        if spec is not None:
            for m in spec.measurements:
                sections += KINDS[m.kind].report(con, run_id, m)
        else:
            sections.append(Section("Measurements", html="<p>The stored spec no longer validates "
                                                         f"({html.escape(spec_problem)}).</p>"))
    intro = (_question(spec.description if spec is not None else None)
             + f"<p><b>run</b> {html.escape(run_id)} · <b>status</b> {html.escape(run['status'])}"
             + (f" ({html.escape(run['error'] or '')})" if run["error"] else "")
             + f" · <b>ended</b> {run['ended_at']}</p>"
             + f"<h2>{html.escape(verdicts.title)}</h2>{verdicts.html}")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / run_report_name(run["spec_name"], run_id)
    write_whole(path, render_page(f"{run['spec_name']} — {run_id}", intro, sections).encode("utf-8"))
    return path


def run_report_name(spec_name: str, run_id: str) -> str:
    """The file name of a run's report in its reports folder."""
    return f"{spec_name}-{run_id}.html"


def _question(description: str | None) -> str:
    """The spec's `description`, the question the run answers, as the page's first words."""
    if not description or not description.strip():
        return "<p class='question'>This spec states no question (its <code>description</code> is empty).</p>"
    return f"<p class='question'><b>The question:</b> {html.escape(description.strip())}</p>"


def _provenance(run: dict) -> str:
    packages = json.loads(run["packages"] or "{}")
    return (
        f"<p><b>started</b> {run['started_at']} · <b>ended</b> {run['ended_at']}</p>"
        f"<p><b>contract</b> {html.escape(_contract_words(run.get('contract'), run['contract_hash']))}"
        f" · <b>commit</b> {html.escape(str(run['git_commit']))}"
        f" · <b>host</b> {html.escape(run['host'])} · <b>cpu</b> {html.escape(str(run['cpu']))}"
        f" · <b>gpu</b> {html.escape(str(run['gpu']))}</p>"
        f"<p><b>packages</b> {html.escape(', '.join(f'{k} {v}' for k, v in packages.items()))}</p>"
        f"<details><summary>spec {html.escape(run['spec_path'] or '')} ({html.escape(run['spec_hash'])})</summary>"
        f"<pre>{html.escape(run['spec_text'])}</pre></details>"
        + "".join(f"<p><b>the spec changed with</b> {html.escape(' '.join(f'--set {t}' for t in json.loads(given)))}"
                  "</p>" for given in [run.get("overrides")] if given)
    )


def _contract_words(contract_json: str | None, contract_hash: str | None) -> str:
    """The run's contract as a person reads it: name, hash and rules (name and hash alone where the
    stored contract does not rebuild to its hash)."""
    from breakout_core.game.contract import Contract

    try:
        contract = Contract(**json.loads(contract_json or "{}"))
    except (ValueError, TypeError):
        contract = None
    if contract is not None and contract.hash == contract_hash:
        return contract.described()
    return f"{_contract_name(contract_json)} {contract_hash or ''}".strip()


def _contract_name(contract_json: str | None) -> str:
    try:
        name = json.loads(contract_json or "{}").get("name")
    except (ValueError, AttributeError):
        name = None
    return name if isinstance(name, str) else ""


def _minute(when) -> str:
    """A decision time to the second, in UTC."""
    return when.tz_convert("UTC").strftime("%Y-%m-%d %H:%M:%S") if hasattr(when, "tz_convert") else str(when)


def _run_link(out_dir: Path, spec_name: str, run_id: str) -> str:
    name = run_report_name(spec_name, run_id)
    if (out_dir / name).is_file():
        return f"<td><a href='{html.escape(name)}'>{html.escape(run_id)}</a></td>"
    return f"<td>{html.escape(run_id)} <small>(no report here)</small></td>"


def build_verdicts_report(store: Store, out_dir: Path):
    """The latest verdict of every spec on each host and contract; returns (path, the rows as a DataFrame)."""
    with store.reader() as con:
        frame = verdict_rows(con)
    sections = []
    for title, group in verdict_groups(frame):
        rows = group.assign(spec_name=[spec_shown(r) for r in group.itertuples()],
                            compared=[compared(r) for r in group.itertuples()],
                            outcome=[outcome_text(r) for r in group.itertuples()],
                            decided=[_minute(t) for t in group["decided_at"]])
        body = table_html(rows[["spec_name", "verdict", "compared", "outcome", "reason", "run_id", "decided"]]).replace(
            "<table>", "<table class='verdicts'>", 1)
        for r in group.itertuples():
            text = html.escape(outcome_text(r))
            body = body.replace(f"<td>{text}</td>", f"<td class='{r.outcome}'><b>{text}</b></td>")
            body = body.replace(f"<td>{html.escape(r.run_id)}</td>", _run_link(out_dir, r.spec_name, r.run_id))
        sections.append(Section(title, html=body))
    intro = ("<p>Grouped by host and contract hash: a verdict reached on one machine or under one contract is "
             "never shown as another's. Each run links to its report in this folder where one was written "
             "(<code>runner report RUN_ID</code> writes it); decided: when the verdict was decided (UTC).</p>")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "verdicts.html"
    write_whole(path, render_page("Verdicts (latest per spec, host and contract)", intro,
                                  sections or [Section("Verdicts", html="<p>No verdicts yet.</p>")]).encode("utf-8"))
    return path, frame
