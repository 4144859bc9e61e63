"""Malformed input through the real CLI: one line naming what is wrong, exit 2, no traceback,
and nothing written anywhere."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.store import Store
from test_end_to_end import runner


def assert_one_line_usage_error(result, *mentions: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for mention in mentions:
        assert mention in lines[0], (mention, lines[0])


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "r.duckdb"
    Store(path).begin_run({"run_id": "r1", "spec_name": "s", "spec_hash": "h", "spec_text": "name: s", "host": "h"})
    return path


@pytest.mark.parametrize("query", ["", "  ;  ", "/* only a comment */"])
def test_sql_without_a_statement(tmp_path, db, query):
    assert_one_line_usage_error(runner("sql", query, "--db", str(db), cwd=tmp_path), "SQL")


@pytest.mark.parametrize("query", [
    "COPY (SELECT * FROM runs) TO 'out.csv'",
    "EXPORT DATABASE 'out'",
    "ATTACH 'out.duckdb' AS other",
    "SELECT * FROM read_csv('/etc/hostname')",
])
def test_sql_touches_no_file_but_the_database(tmp_path, db, query):
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_one_line_usage_error(runner("sql", query, "--db", str(db), cwd=tmp_path), "SQL")
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert runner("sql", "SELECT count(*) FROM runs", "--db", str(db), cwd=tmp_path).returncode == 0
