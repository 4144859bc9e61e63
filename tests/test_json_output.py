"""Every `--json` document parses and has exactly the fields docs/json_output.md lists, of the
types it gives; `--csv` ends its lines with LF. Read from real runs in a real DuckDB file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from gate_specs import gate_runs

from runner.cli.commands import main

DOC = Path(__file__).resolve().parent.parent / "docs" / "json_output.md"
TYPES = {"string": str, "number": (int, float), "integer": int, "boolean": bool, "array": list, "object": dict}


def documented_fields(command: str) -> dict[str, str]:
    """{field path: type} of the section of docs/json_output.md whose heading begins `runner COMMAND`."""
    section = DOC.read_text(encoding="utf-8").split(f"## `runner {command}", 1)[1].split("\n## ", 1)[0]
    fields = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.split("|")]
        if line.startswith("| `") and len(cells) >= 4:
            fields[cells[1].strip("`")] = cells[2]
    assert fields, f"no fields documented for runner {command}"
    return fields


def assert_documented(document: dict, command: str) -> None:
    """Every field of `document` is documented for `command`, every documented field of each object
    met is there, and each value is of its documented type."""
    fields = documented_fields(command)

    def of_type(value, path: str) -> None:
        if path not in fields and isinstance(value, dict) and any(f.startswith(f"{path}.") for f in fields):
            object_fields(value, path)  # an item of an array of objects: its fields are documented
            return
        assert path in fields, f"{command}: field {path!r} is not in docs/json_output.md"
        kind = fields[path]
        if kind == "any":  # a value of the user's own query
            return
        if value is None:
            assert kind.endswith(" or null"), f"{command}: {path} is null, documented as {kind}"
            return
        expected = TYPES.get(kind.removesuffix(" or null"))
        a_bool_for_a_number = isinstance(value, bool) and expected is not bool  # bool is an int in Python
        assert isinstance(value, expected) and not a_bool_for_a_number, \
            f"{command}: {path} = {value!r}, documented as {kind}"
        if isinstance(value, list):
            for item in value:
                of_type(item, f"{path}[]")
        elif isinstance(value, dict):
            object_fields(value, path)

    def object_fields(value: dict, path: str) -> None:
        prefix = f"{path}." if path else ""
        if f"{prefix}*" in fields:
            for child in value.values():
                of_type(child, f"{prefix}*")
            return
        expected = {f[len(prefix):] for f in fields if f.startswith(prefix) and not any(
            c in f[len(prefix):] for c in ".[")}
        assert set(value) == expected, \
            f"{command}: {path or 'the document'} has {sorted(value)}, documented {sorted(expected)}"
        for key, child in value.items():
            of_type(child, f"{prefix}{key}")

    object_fields(document, "")


@pytest.fixture(scope="module")
def gate(tmp_path_factory) -> tuple[Path, str, str]:
    return gate_runs(tmp_path_factory.mktemp("gate"))


def _json(*args: str) -> dict:
    result = CliRunner().invoke(main, list(args))
    assert result.exit_code in (0, 2), result.output
    return json.loads(result.stdout)


def test_run_json(tmp_path):
    from gate_specs import parity_gate, perturbed_onnx

    spec = parity_gate(tmp_path, perturbed_onnx(tmp_path / "p.onnx"))
    result = CliRunner().invoke(main, ["run", str(spec), "--db", str(tmp_path / "r.duckdb"), "--reports",
                                       str(tmp_path / "reports"), "--json", "--fail-on", "rejected"])
    assert result.exit_code == 1, result.output
    document = json.loads(result.stdout)
    assert_documented(document, "run")
    assert document["spec_name"] == "my_model_parity" and Path(document["report"]).is_file()
    assert Path(document["report"]).is_absolute()
    assert f"verdict {document['verdicts'][0]['verdict']}: rejected" in result.stderr  # the lines stay, on stderr
    assert document["verdicts"][0]["rules"][0]["metric"] == "action_agreement"
    from breakout_core.game.contract import CONTRACTS

    v3 = CONTRACTS["breakout-v3"]  # the spec names no contract: the default
    assert document["contract"] == {"name": "breakout-v3", "hash": v3.hash, "rules": v3.rules()}


def test_runs_json(gate):
    db, rejected, worthy = gate
    document = _json("runs", "--db", str(db), "--json")
    assert_documented(document, "runs")
    by_id = {run["run_id"]: run for run in document["runs"]}
    assert by_id[rejected]["verdicts"] == {"rejected": 1} and by_id[worthy]["verdicts"] == {"deployment-worthy": 1}
    assert all(run["duration_s"] > 0 and run["status"] == "done" for run in document["runs"])


def test_sql_json_holds_every_kind_of_value(gate):
    db, rejected, _ = gate
    document = _json("sql", "--db", str(db), "--json",
                     "SELECT run_id, started_at, 1.5 AS x, NULL AS nothing, [1, 2] AS list, {'a': 1} AS struct, "
                     "'nan'::DOUBLE AS nan, 'ab'::BLOB AS blob, 12::DECIMAL(4,1) AS money, "
                     f"INTERVAL 90 SECOND AS span FROM runs WHERE run_id = '{rejected}'")
    assert_documented(document, "sql")
    assert document["columns"][:3] == ["run_id", "started_at", "x"]
    row = document["rows"][0]
    assert row[0] == rejected and row[1].startswith("20") and "T" in row[1]
    assert row[2:] == [1.5, None, [1, 2], {"a": 1}, None, "YWI=", 12.0, 90.0]


def test_report_verdicts_json(gate, tmp_path):
    db, rejected, worthy = gate
    document = _json("report", "--verdicts", "--db", str(db), "--reports", str(tmp_path), "--json")
    assert_documented(document, "report --verdicts")
    assert {(v["run_id"], v["outcome"]) for v in document["verdicts"]} == {(rejected, "rejected"),
                                                                             (worthy, "deployment-worthy")}
    assert Path(document["report"]).is_file()


def test_validate_json(tmp_path, write_spec):
    specs = Path(__file__).resolve().parent.parent / "specs"
    bad = write_spec("name: x\nmeasurements: []\n", name="bad.yaml")
    document = _json("validate", "--json", str(specs / "day23_ort_parity.yaml"), str(specs / "_reference_deploy.yaml"),
                     str(bad))
    assert_documented(document, "validate")
    assert [(s["ok"], s["base"], s["name"]) for s in document["specs"]] == [
        (True, False, "day23_ort_parity"), (True, True, None), (False, False, None)]
    assert document["specs"][2]["problems"] and all("bad.yaml" in p for p in document["specs"][2]["problems"])


def test_json_and_another_output_are_refused(gate):
    db = str(gate[0])
    for args in (["sql", "SELECT 1", "--csv", "--json"], ["validate", "--resolved", "--json", "x.yaml"],
                 ["report", "--json"]):
        result = CliRunner().invoke(main, [*args, "--db", db] if args[0] != "validate" else args)
        assert result.exit_code == 2 and result.stdout == "" and result.output.startswith("error: "), result.output


def test_csv_ends_lines_with_lf(gate, tmp_path):
    db, _, _ = gate
    done = subprocess.run([sys.executable, "-m", "runner", "sql", "--csv", "SELECT outcome FROM latest_verdicts "
                           "ORDER BY outcome", "--db", str(db)], cwd=tmp_path, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert b"\r" not in done.stdout
    assert done.stdout.decode().splitlines() == ["outcome", "deployment-worthy", "rejected"]
    assert done.stdout.endswith(b"rejected\n")
