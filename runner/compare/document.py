"""`runner compare --json`: the comparison as one JSON document; its fields are described in
docs/json_output.md."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from runner.compare.rows import RunSide
from runner.compare.runs import Comparison


def _number(value: float | None) -> float | None:
    """A float JSON can hold: NaN and infinities, which JSON has no word for, become null."""
    return value if value is None or math.isfinite(value) else None


def _side(side: RunSide) -> dict[str, Any]:
    return {"run_id": side.run_id, "spec_name": side.spec_name, "status": side.status,
            "started_at": None if side.started_at is None else str(side.started_at), "git_commit": side.git_commit,
            "contract_hash": side.contract_hash, "host": side.host, "cpu": side.cpu, "gpu": side.gpu}


def comparison_document(comparison: Comparison, *, fail_factor: float | None = None,
                        report: Path | None = None) -> dict[str, Any]:
    """Everything the terminal table shows, as data."""
    regressions = comparison.regressions(fail_factor) if fail_factor is not None else []
    return {
        "a": _side(comparison.a),
        "b": _side(comparison.b),
        "factor": comparison.factor,
        "same_machine": comparison.same_machine,
        "caution": comparison.caution,
        "totals": {key.replace(" ", "_"): n for key, n in comparison.totals().items()},
        "summary": comparison.summary_line(),
        "environment": [{"what": what, "a": va, "b": vb, "differs": flagged}
                        for what, va, vb, flagged in comparison.environment],
        "rows": [{"measurement": r.measurement, "subject": r.subject, "metric": r.metric, "a": _number(r.value_a),
                  "b": _number(r.value_b), "ratio": _number(r.ratio), "lower_is_better": r.lower_is_better,
                  "significance": r.test, "significant": r.significant, "mark": r.mark,
                  "why": r.problem or r.note or None} for r in comparison.rows],
        "verdicts": [{"verdict": v.verdict, "measurement": v.measurement, "candidate": v.candidate,
                      "baseline": v.baseline, "a": v.outcome_a, "b": v.outcome_b, "flipped": v.flipped,
                      "regressed": v.regressed} for v in comparison.verdicts],
        "fail_on_regression": fail_factor,
        "regressions": [{"measurement": r.measurement, "subject": r.subject, "metric": r.metric}
                        for r in regressions],
        "report": None if report is None else str(report),
    }


def comparison_json(comparison: Comparison, **kwargs: Any) -> str:
    return json.dumps(comparison_document(comparison, **kwargs), indent=2, allow_nan=False)
