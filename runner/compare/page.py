"""A comparison shown: in the terminal, and as an HTML page with both runs' provenance, every row
with its mark, and the two runs' distributions side by side (latency samples, episode scores)."""

from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from breakout_core.common.files import write_whole
from runner.compare.runs import Comparison
from runner.report.html import MAX_CHART_POINTS, altair, blank_nulls, render_page, table_html
from runner.report.section import Section
from runner.store.database import Store

MARK_CLASSES = {"better": "deployment-worthy", "worse": "rejected", "not comparable": "unavailable",
                "different machine": "inconclusive"}  # the page's existing colours


LEGEND = ("significant: latency over rounds, never calls: a 95% Welch t CI of B/A of the per-round P50, P95 "
          "(P99, mean) without 1; scores a bootstrap CI of B − A without 0; "
          "parity any change beyond tolerance. better/worse: significant and beyond the factor {factor:g} "
          "(latency: its whole interval beyond it; parity: tolerance alone)")


def rows_frame(comparison: Comparison) -> pd.DataFrame:
    """The comparison as a table: one line per metric and subject."""
    return pd.DataFrame([{
        "measurement": r.measurement, "subject": r.subject, "metric": r.metric, "A": r.value_a, "B": r.value_b,
        "B/A": r.ratio, "significance": r.test, "mark": r.mark, "why": r.problem or r.note,
    } for r in comparison.rows], columns=["measurement", "subject", "metric", "A", "B", "B/A", "significance", "mark",
                                          "why"])


def verdicts_frame(comparison: Comparison) -> pd.DataFrame:
    """Each verdict as run A and run B decided it, side by side; `changed` marks one that flipped."""
    return pd.DataFrame([{
        "verdict": v.verdict, "candidate vs baseline": f"{v.candidate} vs {v.baseline}" if v.baseline else v.candidate,
        "A": v.outcome_a or "not decided", "B": v.outcome_b or "not decided",
        "changed": ("flipped: a regression" if v.regressed else "flipped") if v.flipped else "",
    } for v in comparison.verdicts], columns=["verdict", "candidate vs baseline", "A", "B", "changed"])


def _verdicts_table(comparison: Comparison) -> str:
    frame = verdicts_frame(comparison)
    if frame.empty:
        return "<p>Neither run decided a verdict.</p>"
    body = table_html(frame)
    for outcome in ("deployment-worthy", "rejected", "inconclusive", "unavailable"):
        body = body.replace(f"<td>{outcome}</td>", f"<td class='{outcome}'>{outcome}</td>")
    for flip in ("flipped: a regression", "flipped"):
        body = body.replace(f"<td>{flip}</td>", f"<td class='rejected'><b>⚑ {flip}</b></td>")
    return body


def _run_label(comparison: Comparison, label: str) -> str:
    side = comparison.a if label == "A" else comparison.b
    return f"{label}: {side.run_id}"


def _intro(comparison: Comparison) -> str:
    a, b = comparison.a, comparison.b
    runs = pd.DataFrame([{"run": label, "run id": s.run_id, "status": s.status, "started": str(s.started_at),
                          "contract": s.contract_hash} for label, s in (("A", a), ("B", b))])
    env = pd.DataFrame([{"": "⚑ differs" if va != vb else "", "what": what, "A": va, "B": vb}
                        for what, va, vb, _ in comparison.environment if va != vb])
    same = [(what, va) for what, va, vb, _ in comparison.environment if va == vb]
    machine = ("<p><b>Same machine</b> (host, CPU, GPU).</p>" if comparison.same_machine else
               "<p class='inconclusive'><b>Different machines</b>: timings are marked “different machine”, "
               "never better or worse.</p>")
    caution = (f"<p class='inconclusive'><b>Caution</b>: {html.escape(comparison.caution)}.</p>"
               if comparison.caution else "")
    return (f"<p>Spec <b>{html.escape(a.spec_name)}</b>. {html.escape(LEGEND.format(factor=comparison.factor))}.</p>"
            + f"<p class='summary'><b>{html.escape(comparison.summary_line())}</b></p>"
            + table_html(runs) + machine + caution
            + "<h2>Verdicts of A and B</h2>" + _verdicts_table(comparison)
            + "<h2>Where each run was made</h2>"
            + (table_html(env) if not env.empty else "<p>Nothing differs between the two runs' machines, packages, "
                                                     "commits and settings.</p>")
            + (f"<details class='same'><summary>{len(same)} the same in both runs: "
               f"{html.escape(', '.join(what for what, _ in same))}</summary>"
               + table_html(pd.DataFrame(same, columns=["what", "A and B"])) + "</details>" if same else ""))


def _marked_table(frame: pd.DataFrame) -> str:
    body = table_html(frame, float_format="{:.4g}")
    for mark, css in MARK_CLASSES.items():
        body = body.replace(f"<td>{html.escape(mark)}</td>", f"<td class='{css}'><b>{html.escape(mark)}</b></td>")
    return body


def _latency_section(con, comparison: Comparison, measurement: str) -> Section | None:
    alt = altair()
    parts = []
    for label, side in (("A", comparison.a), ("B", comparison.b)):
        part = con.execute("SELECT runtime || ' b=' || batch_size AS series, ms FROM latency_samples "
                           "WHERE run_id = ? AND measurement = ? ORDER BY runtime, batch_size, sample LIMIT ?",
                           [side.run_id, measurement, MAX_CHART_POINTS // 2]).df()
        parts.append(part.assign(run=_run_label(comparison, label)))
    samples = pd.concat(parts, ignore_index=True)
    if samples.empty:
        return None
    x = alt.X("ms:Q", scale=alt.Scale(type="log"), title="ms per call (log scale)")
    chart = alt.layer(*_samples_under_box(x, "run:N"), data=samples).properties(width=620, height=70).facet(
        row=alt.Row("series:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left")))
    return Section(f"{measurement}: latency of A and B per series (ticks: every sample; box on top: quartiles, "
                   "median in black, whiskers to min and max)", charts=[chart.to_dict()])


def _samples_under_box(x, y: str) -> list:
    """Every sample as a faint mark, and above it, drawn last so the samples never hide it, a box
    of the quartiles outlined in black with its median."""
    alt = altair()
    ticks = alt.Chart().mark_tick(opacity=0.15, thickness=1, size=12).encode(x=x, y=alt.Y(y, title=None), color=y)
    box = alt.Chart().mark_boxplot(
        extent="min-max", size=26, opacity=0.55, box={"stroke": "black", "strokeWidth": 1.5},
        median={"color": "black", "strokeWidth": 2.5}, rule={"color": "black"}, ticks={"color": "black", "size": 14},
    ).encode(x=x, y=y, color=alt.Color(y, legend=None))
    return [ticks, box]


def _scores_section(con, comparison: Comparison, measurement: str) -> Section | None:
    alt = altair()
    parts = []
    for label, side in (("A", comparison.a), ("B", comparison.b)):
        part = con.execute("SELECT policy, seed, score FROM episodes WHERE run_id = ? AND measurement = ? "
                           "ORDER BY policy, seed LIMIT ?", [side.run_id, measurement, MAX_CHART_POINTS // 2]).df()
        parts.append(part.assign(run=_run_label(comparison, label)))
    scores = pd.concat(parts, ignore_index=True)
    if scores.empty:
        return None
    x = alt.X("score:Q", title="raw score (points)")
    chart = alt.layer(*_samples_under_box(x, "run:N"), data=scores).properties(width=620, height=70).facet(
        row=alt.Row("policy:N", title=None, header=alt.Header(labelAngle=0, labelAlign="left")))
    return Section(f"{measurement}: episode scores of A and B per policy", charts=[chart.to_dict()])


def build_compare_report(store: Store, comparison: Comparison, out_dir: Path) -> Path:
    """Write the comparison's page; returns its path."""
    frame = rows_frame(comparison)
    sections = [Section("Every metric of both runs", html=_marked_table(blank_nulls(frame)))]
    kinds = {m["name"]: m.get("kind") for m in comparison.a.spec.get("measurements", [])}
    with store.reader() as con:
        for measurement in dict.fromkeys(frame["measurement"]):
            kind = kinds.get(measurement)
            if kind == "latency":
                section = _latency_section(con, comparison, measurement)
            elif kind in ("evaluate", "episodes", "train"):
                section = _scores_section(con, comparison, measurement)
            else:
                section = None
            if section is not None:
                sections.append(section)
    a, b = comparison.a, comparison.b
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"compare-{a.spec_name}-{a.run_id}-{b.run_id}.html"
    write_whole(path, render_page(f"{a.spec_name}: {a.run_id} (A) vs {b.run_id} (B)", _intro(comparison),
                                  sections).encode("utf-8"))
    return path


def print_comparison(comparison: Comparison) -> None:
    """The comparison in the terminal: both runs, what differs between their machines, every row."""
    from rich.text import Text

    from runner.cli.terminal import coloured, folding_table, table_console

    colours = {"better": "green", "worse": "red", "not comparable": "bright_black", "different machine": "yellow"}
    console = table_console()
    for label, side in (("A", comparison.a), ("B", comparison.b)):
        console.print(f"{label}: {side.run_id} ({side.spec_name}, {side.status}, started {side.started_at}, "
                      f"commit {side.git_commit}, contract {side.contract_hash})", highlight=False)
    for what, va, vb, flagged in comparison.environment:
        if flagged:
            console.print(Text.assemble(("differs", "yellow"), f": {what}: {va} → {vb}"), highlight=False)
    if comparison.caution:
        console.print(Text.assemble(("caution", "yellow"), f": {comparison.caution}"), highlight=False)
    if not comparison.same_machine:
        console.print(coloured("different machines: timings are not judged", "yellow"))
    console.print(LEGEND.format(factor=comparison.factor), highlight=False)
    table = folding_table("measurement", "subject", "metric", "A", "B", "B/A", "significance", "mark", "why")
    for r in rows_frame(comparison).itertuples(index=False):
        cells = ["" if v is None or v != v else f"{v:.4g}" for v in (r.A, r.B, r[5])]  # v != v: NaN
        table.add_row(r.measurement, r.subject, r.metric, *cells, r.significance, coloured(r.mark, colours.get(r.mark)),
                      r.why)
    console.print(table)
    outcomes = {"deployment-worthy": "green", "rejected": "red", "inconclusive": "yellow",
                "unavailable": "bright_black"}
    verdicts = folding_table("verdict", "candidate vs baseline", "A", "B", "changed")
    for v in verdicts_frame(comparison).itertuples(index=False):
        verdicts.add_row(v.verdict, v[1], coloured(v.A, outcomes.get(v.A)), coloured(v.B, outcomes.get(v.B)),
                         coloured(v.changed, "red" if v.changed else None))
    if comparison.verdicts:
        console.print(verdicts)
    console.print(comparison.summary_line(), highlight=False)
