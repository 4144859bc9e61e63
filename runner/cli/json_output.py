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
                 failed: list[dict]) -> dict:
    """`runner run --json`'s document (docs/json_output.md): the run, its contract, report,
    verdicts, those --fail-on named, and the sha256 of the file each runtime ran."""
    from runner.cli.verdict_listing import run_verdict_record
    from runner.kinds.shared.runtime_status import runtimes_ran

    with store.reader() as con:
        ran = runtimes_ran(con, run_id)
    return {"run_id": run_id, "spec_name": spec_name, "status": "done", "database": str(store.path),
            "contract": run_contract_record(store, run_id), "report": report,
            "verdicts": [run_verdict_record(v) for v in verdicts], "failed_on": [v["verdict"] for v in failed],
            "runtimes": ran}


def run_contract_record(store, run_id: str) -> dict:
    """The contract a stored run played under: its name, hash and rules in words."""
    from breakout_core.game.contract import Contract

    with store.reader() as con:
        text, stored_hash = con.execute("SELECT contract, contract_hash FROM runs WHERE run_id = ?",
                                        [run_id]).fetchone()
    contract = Contract(**json.loads(text))
    return {"name": contract.name, "hash": stored_hash, "rules": contract.rules()}
