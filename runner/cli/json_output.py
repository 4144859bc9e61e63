"""`--json`: one JSON document on standard output and nothing else there. The fields of each
command's document are listed in docs/json_output.md."""

from __future__ import annotations

import datetime as dt
import json
import math
import numbers
from typing import Any

import click

json_option = click.option("--json", "as_json", is_flag=True,
                           help="print one JSON document on stdout (fields: docs/json_output.md), nothing else there")


def json_value(value: Any) -> Any:
    """`value` as JSON can hold it: times as ISO 8601 text, NaN and infinities as null, paths
    and UUIDs as text, bytes as base64, numpy scalars as Python numbers, containers item by item."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_value(v) for v in value]
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, (bytes, bytearray, memoryview)):
        import base64

        return base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(value, numbers.Integral):  # numpy's integers
        return int(value)
    if isinstance(value, numbers.Number):  # a DECIMAL column, numpy's floats
        return json_value(float(value))
    if hasattr(value, "item"):  # numpy's bool
        return json_value(value.item())
    return str(value)  # a path, a UUID


def emit_json(document: dict) -> None:
    """Print `document` as the command's whole standard output."""
    click.echo(json.dumps(json_value(document), indent=2, ensure_ascii=False, allow_nan=False))


def run_document(store, run_id: str, spec_name: str, report: str | None, verdicts: list[dict],
                 failed: list[dict], not_reached: list[str]) -> dict:
    """`runner run --json`'s document (docs/json_output.md): the run, its contract, report,
    verdicts, those --fail-on named, those --fail-fast did not reach, and the sha256 of the file
    each runtime ran."""
    from runner.cli.verdict_listing import run_verdict_record
    from runner.kinds.shared.runtime_status import runtimes_ran

    with store.reader() as con:
        ran = runtimes_ran(con, run_id)
    return {"run_id": run_id, "spec_name": spec_name, "status": "done", "database": str(store.path),
            "contract": run_contract_record(store, run_id), "report": report,
            "verdicts": [run_verdict_record(v) for v in verdicts], "failed_on": [v["verdict"] for v in failed],
            "not_reached": not_reached,
            "runtimes": ran}


def run_contract_record(store, run_id: str) -> dict:
    """The contract a stored run played under: its name, hash and rules in words."""
    from breakout_core.game.contract import Contract

    with store.reader() as con:
        text, stored_hash = con.execute("SELECT contract, contract_hash FROM runs WHERE run_id = ?",
                                        [run_id]).fetchone()
    contract = Contract(**json.loads(text))
    return {"name": contract.name, "hash": stored_hash, "rules": contract.rules()}


CHECK_EXIT_MEANING = {0: "passed: every gating verdict is deployment-worthy",
                      1: "failed: a gating verdict is rejected, inconclusive or unavailable (a gate does not pass "
                         "without evidence)"}


def check_document(document: dict, model, baseline, passed: bool, modified_gate: list[str], question: dict,
                   ledger: dict) -> dict:
    """`runner check --json`'s document (docs/json_output.md): `runner run --json`'s for the check's
    run, with the files checked (each one's input convention and the adapter it was fed through),
    the seeds its games were played on, what the exit status means, the question it asked with
    the verdicts that gated and those shown, the `--set` texts that changed the gate's rules
    or evidence (empty for the shipped gate), and the model's content and which check of it
    this is (`ledger`)."""
    from breakout_core.conversion.input_convention import InputConvention
    from runner.store.database import Store

    code = 0 if passed else 1
    with Store(document["database"]).reader() as con:
        files = con.execute(  # an adapted copy names the sha256 of the user's file it was made from
            "SELECT runtime, any_value(artifact), any_value(coalesce(runtime_describe->>"
            "'$.actual.model_metadata.\"breakout.input_source_sha256\"', artifact_sha256)), "
            "any_value(runtime_describe->>'$.actual.model_metadata.\"breakout.input_source\"'), "
            "any_value(runtime_describe->>'$.actual.model_metadata.\"breakout.input_adapter\"'), "
            "any_value(CAST(runtime_describe->>'$.actual.static_batch' AS INTEGER)) FROM runtime_status "
            "WHERE run_id = ? GROUP BY runtime ORDER BY runtime", [document["run_id"]]).fetchall()
        played = con.execute("SELECT measurement, list(DISTINCT seed ORDER BY seed) FROM episodes WHERE run_id = ? "
                             "GROUP BY measurement ORDER BY measurement", [document["run_id"]]).fetchall()
        drawn = dict(con.execute("SELECT measurement, {'pool': pool, 'key': key} FROM drawn_seeds WHERE run_id = ?",
                                 [document["run_id"]]).fetchall())
    given = {"candidate": str(model), "baseline": None if baseline is None else str(baseline)}
    return {**document,
            "exit_status": {"code": code, "meaning": CHECK_EXIT_MEANING[code]},
            "model": given["candidate"], "baseline": given["baseline"], "question": question,
            "modified_gate": modified_gate, **ledger,
            "files": [{"runtime": runtime, "artifact": artifact, "artifact_sha256": sha256,
                       "input": convention or str(InputConvention()), "input_adapter": adapter or "none",
                       "static_batch": static_batch}
                      for runtime, artifact, sha256, convention, adapter, static_batch in files],
            "seeds": [{"measurement": measurement, "seeds": seeds, "drawn": drawn.get(measurement)}
                      for measurement, seeds in played]}
