"""Turn measurements into decisions with the rules a spec declares.

A rule compares one metric with a number. A rule on an interval bound (`*_ci_low`,
`*_ci_high`) that fails while the other bound would pass means the interval straddles
the threshold: the data cannot decide, and the verdict is inconclusive rather than
rejected. Any failed rule whose whole interval is on the wrong side rejects. A kind whose
data cannot give a metric an interval at all (one training seed per arm, one timing per
setting) says why in `inconclusive_reason`: a rule on such a metric is inconclusive with
that reason, never decided on a raw difference. A kind whose interval comes from a test
that stopped undecided (games in stages at their cap) names that interval's metrics in
`undecided_metrics` and says why in `undecided_reason`: a failed rule on one of them is then
inconclusive with the reason beside the figures, never rejected (at a zero margin an interval
of [0, 0] fails both bounds of a `> 0` rule).
"""

from __future__ import annotations

import json
import math
import operator

from runner.spec.fields import VerdictSpec, parse_rule

OPERATORS = {">=": operator.ge, "<=": operator.le, ">": operator.gt, "<": operator.lt, "==": operator.eq,
             "!=": operator.ne}


def _other_bound(metric: str) -> str | None:
    if metric.endswith("_ci_low"):
        return metric.removesuffix("_ci_low") + "_ci_high"
    if metric.endswith("_ci_high"):
        return metric.removesuffix("_ci_high") + "_ci_low"
    return None


def decide(verdict: VerdictSpec, found: dict, unavailable_reason: str | None = None) -> tuple[str, str, dict]:
    """(outcome, one-line reason, evidence) for one verdict given its metrics; a kind's `note`
    on how to read them (a software adapter's times) ends the reason, whatever the outcome."""
    outcome, reason, evidence = _decide(verdict, found, unavailable_reason)
    return outcome, f"{reason}; {found['note']}" if found.get("note") else reason, evidence


def _decide(verdict: VerdictSpec, found: dict, unavailable_reason: str | None) -> tuple[str, str, dict]:
    evidence: dict = {"metrics": found, "rules": []}
    if unavailable_reason:
        return "unavailable", unavailable_reason, evidence
    failed, undecided = [], []
    for metric, rule in verdict.deployment_worthy_when.items():
        op, threshold = parse_rule(rule)
        value = found.get(metric)
        if value is None or (isinstance(value, float) and math.isnan(value)):
            evidence["rules"].append({"metric": metric, "rule": rule, "value": None, "passed": None})
            if found.get("inconclusive_reason"):
                return "inconclusive", f"{found['inconclusive_reason']}: no {metric}", evidence
            return "unavailable", f"{metric} could not be computed from the stored rows", evidence
        passed = bool(OPERATORS[op](value, threshold))
        evidence["rules"].append({"metric": metric, "rule": rule, "value": value, "passed": passed})
        if passed:
            continue
        other = _other_bound(metric)
        text = f"{metric} = {value:.4g} (needs {op} {threshold:g})"
        if metric in found.get("undecided_metrics", ()):
            undecided.append(text)  # the test behind the interval stopped undecided: its bounds decide nothing
        elif other is not None and other in found and OPERATORS[op](found[other], threshold):
            undecided.append(f"{text}, but {other} = {found[other]:.4g}: the interval straddles the threshold")
        else:
            failed.append(text)
    if failed:
        return "rejected", "; ".join(failed), evidence
    if undecided:
        if any(r["metric"] in found.get("undecided_metrics", ()) for r in evidence["rules"] if r["passed"] is False):
            undecided.append(found["undecided_reason"])
        return "inconclusive", "; ".join(undecided), evidence
    passed_text = ", ".join(f"{r['metric']} = {r['value']:.4g} {r['rule']}" for r in evidence["rules"])
    return "deployment-worthy", passed_text, evidence


def evaluate_verdicts(store, run_id: str, spec, measured: set[str] | None = None) -> list[dict]:
    """Compute the verdicts of a finished run's spec and append those not stored yet (a resumed
    run killed after storing them, before it was marked done, stores none twice): every one, or
    those on the measurements in `measured` (a run that --fail-fast stopped)."""
    rows = decide_verdicts(store, run_id, spec, measured)
    with store.reader() as con:
        stored = {v for (v,) in con.execute("SELECT verdict FROM verdicts WHERE run_id = ?", [run_id]).fetchall()}
    store.append_rows("verdicts", [row for row in rows if row["verdict"] not in stored])
    return rows


def decide_verdicts(store, run_id: str, spec, measured: set[str] | None = None) -> list[dict]:
    """The verdict rows of the spec's verdicts on the measurements in `measured` (all where
    None), from the stored rows; nothing is stored."""
    from runner.kinds.registry import KINDS
    from runner.store.database import utcnow

    by_name = {m.name: m for m in spec.measurements}
    rows = []
    with store.reader() as con:
        for verdict in spec.verdicts:
            if measured is not None and verdict.measurement not in measured:
                continue
            m = by_name[verdict.measurement]
            found = KINDS[m.kind].metrics(con, run_id, m, verdict.candidate, verdict.baseline)
            # unavailable_reason: set by a kind whose runtime could not run
            outcome, reason, evidence = decide(verdict, found, found.get("unavailable_reason"))
            evidence["label"] = verdict.labels.get(outcome)
            evidence["in_words"] = KINDS[m.kind].in_words(found, set(verdict.deployment_worthy_when))
            rows.append({
                "run_id": run_id, "verdict": verdict.name, "measurement": m.name,
                "candidate": verdict.candidate, "baseline": verdict.baseline or "",
                "outcome": outcome, "reason": reason, "evidence": json.dumps(evidence), "decided_at": utcnow(),
            })
    return rows
