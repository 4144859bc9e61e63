"""Exit codes as a CI job reads them, through the real `runner` process: 0 success, 1 a verdict
or a comparison said no, 2 bad input, 3 the environment failed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gate_specs import REFERENCE_ONNX, parity_gate, perturbed_onnx
from test_cli_inputs import cli
from test_end_to_end import runner

from runner.cli.exit_codes import ExitCode


def _one_line(result, code: int, *mentions: str) -> None:
    assert result.returncode == code, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for mention in mentions:
        assert mention in lines[0], (mention, lines[0])


def test_a_ci_job_fails_on_a_rejected_model_and_passes_on_a_good_one(tmp_path):
    """The gate a deployment pipeline runs: the same spec on a perturbed model (rejected, exit 1
    with --fail-on rejected) and on the shipped one (deployment-worthy, exit 0); without
    --fail-on a finished run exits 0 whatever its verdicts."""
    db = str(tmp_path / "ci.duckdb")
    bad = parity_gate(tmp_path, perturbed_onnx(tmp_path / "perturbed.onnx"), name="perturbed_gate")
    good = parity_gate(tmp_path, REFERENCE_ONNX, name="reference_gate")

    rejected = runner("run", str(bad), "--fail-on", "rejected", "--db", db, "--no-report", "--json", cwd=tmp_path)
    assert rejected.returncode == ExitCode.SAID_NO == 1, rejected.stderr
    document = json.loads(rejected.stdout)
    assert [v["outcome"] for v in document["verdicts"]] == ["rejected"] and document["failed_on"] == ["same_decisions"]
    assert "--fail-on: verdict same_decisions is rejected" in rejected.stderr

    passed = runner("run", str(good), "--fail-on", "rejected,inconclusive,unavailable", "--db", db, "--no-report",
                    cwd=tmp_path)
    assert passed.returncode == 0, passed.stderr
    assert "verdict same_decisions: deployment-worthy" in passed.stdout

    # the exit statuses a real process gives are seen above; what --fail-on decides is the same in this process
    unguarded = cli("run", str(bad), "--db", db, "--no-report", cwd=tmp_path)
    assert unguarded.exit_code == 0 and "verdict same_decisions: rejected" in unguarded.stdout, unguarded.output

    # an outcome --fail-on does not name does not fail the job
    assert cli("run", str(bad), "--fail-on", "unavailable", "--db", db, "--no-report", cwd=tmp_path).exit_code == 0


def test_a_database_that_is_not_there_is_the_environment_not_a_regression(tmp_path):
    result = runner("compare", "--spec", "day24_ort_latency", "--fail-on-regression", "1.1", "--db", "typo.duckdb",
                    cwd=tmp_path)
    _one_line(result, ExitCode.ENVIRONMENT, "typo.duckdb", "no results database")
    assert not (tmp_path / "typo.duckdb").exists()


@pytest.mark.parametrize("args, mentions", [
    (["run", "specs_elsewhere/nothing.yaml"], ["no such file"]),
    (["run", "x.yaml", "--fail-on", "rejected"], ["no such file"]),
    (["report", "nope"], ["no run 'nope'"]),
    (["compare", "--spec", "nope"], ["no run of spec 'nope'"]),
    (["mark-interrupted", "nope"], ["no run 'nope'"]),
    (["export", "nope"], ["no run 'nope'"]),
    (["sql", "SELECT * FROM no_such_table"], ["SQL"]),
], ids=["missing-spec", "missing-spec-gated", "report", "compare", "mark-interrupted", "export", "sql"])
def test_bad_input_is_2(tmp_path, args, mentions):
    from runner.store.database import Store

    db = tmp_path / "r.duckdb"
    Store(db).begin_run({"run_id": "r1", "spec_name": "s", "spec_hash": "h", "spec_text": "name: s", "host": "h"})
    _one_line(runner(*args, "--db", str(db), cwd=tmp_path), ExitCode.BAD_INPUT, *mentions)


@pytest.mark.parametrize("args", [["runs"], ["sql", "SELECT 1"], ["report"], ["report", "--verdicts"],
                                  ["export", "r1"], ["mark-interrupted", "r1"], ["compare", "a", "b"]],
                         ids=["runs", "sql", "report", "verdicts", "export", "mark-interrupted", "compare"])
def test_a_missing_database_is_3_for_every_reading_command(tmp_path, args):
    from click.testing import CliRunner

    from runner.cli.commands import main

    result = CliRunner().invoke(main, [*args, "--db", str(tmp_path / "missing.duckdb")])
    assert result.exit_code == ExitCode.ENVIRONMENT, (args, result.output)
    assert result.output.startswith("error: ") and "no results database here yet" in result.output


def test_a_damaged_database_is_3(tmp_path):
    from click.testing import CliRunner

    from runner.cli.commands import main

    damaged = tmp_path / "damaged.duckdb"
    damaged.write_bytes(b"not a database at all" * 100)
    result = CliRunner().invoke(main, ["runs", "--db", str(damaged)])
    assert result.exit_code == ExitCode.ENVIRONMENT and result.output.startswith("error: "), result.output


def test_the_readme_table_is_the_codes_declared(tmp_path):
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    table = readme.split("## Exit codes", 1)[1].split("\n## ", 1)[0]
    rows = {int(line.split("|")[1].strip().strip("`")) for line in table.splitlines()
            if line.startswith("| ") and line.split("|")[1].strip().strip("`").isdigit()}
    assert rows == {int(code) for code in ExitCode}
