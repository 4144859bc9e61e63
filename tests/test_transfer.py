"""A run exported to Parquet imports into another database with every row, once."""

import re
import shutil

import pytest

from runner.store.database import Store
from runner.store.errors import StoreError
from runner.store.transfer import TransferRefused, export_run, import_run


def _seed_run(store: Store, run_id: str) -> None:
    store.begin_run({"run_id": run_id, "spec_name": "s", "spec_hash": "h", "spec_text": "name: s", "host": "h"})
    store.append_rows("train_episodes", [
        {"run_id": run_id, "measurement": "m", "trial": "base", "attempt": 0, "env_index": 0, "transition": t,
         "episode_return": float(t % 7), "length": 100, "ended_by": "game_over"} for t in range(100, 5100, 100)])
    store.finish_run(run_id, "done")


def test_round_trip_and_refusal_of_a_second_import(tmp_path):
    source = Store(tmp_path / "a.duckdb")
    _seed_run(source, "r1")
    _seed_run(source, "r2")  # another run's rows must not travel
    counts = export_run(source, "r1", tmp_path / "export")
    assert counts == {"runs": 1, "train_episodes": 50}
    target = Store(tmp_path / "b.duckdb")
    run_id, imported = import_run(target, tmp_path / "export")
    assert run_id == "r1" and imported == counts
    with target.reader() as con:
        expected = float(sum(t % 7 for t in range(100, 5100, 100)))
        assert con.execute("SELECT count(*), sum(episode_return) FROM train_curve").fetchone() == (50, expected)
        assert con.execute("SELECT status FROM runs").fetchall() == [("done",)]
    with pytest.raises(StoreError, match="already"):
        import_run(target, tmp_path / "export")


def test_unknown_run_and_foreign_folder_are_clear_errors(tmp_path):
    store = Store(tmp_path / "a.duckdb")
    _seed_run(store, "r1")
    with pytest.raises(StoreError, match="no run 'nope'"):
        export_run(store, "nope", tmp_path / "x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(StoreError, match="runs.parquet"):
        import_run(store, tmp_path / "empty")


@pytest.mark.parametrize("column, value, problem", [
    ("spec_name", "../outside", "spec name '../outside' is not a spec name"),
    ("run_id", "../r1", "run id '../r1' is not one a runner writes"),
    ("spec_text", "name: [unclosed", "its spec text does not read as YAML"),
    ("spec_text", "- a list", "its spec text is not a spec"),
    ("spec_text", "measurements: 5", "its spec text is not a spec: measurements is not a list of named measurements"),
    ("spec_settings", '{"policies": [1]}', "its spec_settings are not a spec: policies is not a mapping"),
    ("spec_settings", '{"policies": {"dqn": "foo"}}', "its spec_settings are not a spec: policies is not a mapping"),
    ("spec_settings", '{"measurements": [{"name": "m", "kind": "evaluate", "bootstrap": [1]}]}',
     "its spec_settings are not a spec: measurement m: bootstrap is not valid"),
    ("spec_settings", '{"measurements": [{"name": "m", "kind": "evaluate", "bootstrap": {"resamples": 0}}]}',
     "its spec_settings are not a spec: measurement m: bootstrap is not valid"),
    ("spec_settings", "[1]", "its spec_settings are not a spec: a spec is a mapping of keys, not list"),
    ("spec_settings", "{nope", "its spec_settings are not JSON"),
])
def test_import_refuses_a_run_row_no_runner_writes(tmp_path, column, value, problem):
    """An export's run row names report files and is read back as a spec: a name that would
    write outside the reports folder, or a text that is no spec, is refused whole."""
    import duckdb

    source = Store(tmp_path / "a.duckdb")
    _seed_run(source, "r1")
    export_run(source, "r1", tmp_path / "x")
    runs = tmp_path / "x" / "runs.parquet"
    con = duckdb.connect()
    con.execute(f"COPY (SELECT * REPLACE (? AS {column}) FROM read_parquet(?)) TO '{tmp_path / 'runs.parquet'}'",
                [value, str(runs)])
    shutil.move(tmp_path / "runs.parquet", runs)
    if column == "run_id":  # every file holds the run's own id, as an export writes them
        episodes = tmp_path / "x" / "train_episodes.parquet"
        con.execute(f"COPY (SELECT * REPLACE (? AS run_id) FROM read_parquet(?)) TO '{tmp_path / 'e.parquet'}'",
                    [value, str(episodes)])
        shutil.move(tmp_path / "e.parquet", episodes)
    target = Store(tmp_path / "b.duckdb")
    with pytest.raises(TransferRefused, match=re.escape(problem)):
        import_run(target, tmp_path / "x")
    assert _rows(target) == {"runs": 0, "train_episodes": 0}


def test_export_of_an_unknown_run_makes_no_folder(tmp_path):
    store = Store(tmp_path / "a.duckdb")
    _seed_run(store, "r1")
    for run_id in ("nope", "a/b", ""):
        with pytest.raises(TransferRefused, match="no run"):
            export_run(store, run_id, tmp_path / "exports" / run_id)
    assert not (tmp_path / "exports").exists()


def _rows(store: Store) -> dict[str, int]:
    with store.reader() as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("runs", "train_episodes")}


def test_export_refuses_a_folder_that_holds_anything(tmp_path):
    source = Store(tmp_path / "a.duckdb")
    _seed_run(source, "r1")
    _seed_run(source, "r2")
    export_run(source, "r1", tmp_path / "export")
    before = {p.name: p.read_bytes() for p in (tmp_path / "export").iterdir()}
    with pytest.raises(TransferRefused, match="export.*not empty"):
        export_run(source, "r2", tmp_path / "export")
    assert {p.name: p.read_bytes() for p in (tmp_path / "export").iterdir()} == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".export")] == []  # no half-written folder left


def test_import_refuses_a_folder_mixing_runs_and_never_duplicates(tmp_path):
    source = Store(tmp_path / "a.duckdb")
    _seed_run(source, "r1")
    _seed_run(source, "r2")
    export_run(source, "r1", tmp_path / "r1")
    export_run(source, "r2", tmp_path / "r2")
    shutil.copy(tmp_path / "r2" / "train_episodes.parquet", tmp_path / "r1" / "train_episodes.parquet")
    target = Store(tmp_path / "b.duckdb")
    _seed_run(target, "local")
    before = _rows(target)
    with pytest.raises(TransferRefused, match=r"train_episodes.parquet.*r2.*not.*r1"):
        import_run(target, tmp_path / "r1")
    assert _rows(target) == before
    import_run(target, tmp_path / "r2")
    once = _rows(target)
    with pytest.raises(TransferRefused, match="already"):
        import_run(target, tmp_path / "r2")
    assert _rows(target) == once == {"runs": 2, "train_episodes": 100}


@pytest.mark.slow
def test_cli_refusals_are_usage_errors(tmp_path):
    from test_cli_inputs import assert_one_line_usage_error
    from test_end_to_end import runner

    source = Store(tmp_path / "a.duckdb")
    _seed_run(source, "r1")
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    refused = runner("export", "r1", "--out", "busy", "--db", "a.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(refused, "busy", "not empty")
    assert runner("export", "r1", "--out", "fresh", "--db", "a.duckdb", cwd=tmp_path).returncode == 0
    assert runner("import", "fresh", "--db", "b.duckdb", cwd=tmp_path).returncode == 0
    assert_one_line_usage_error(runner("import", "fresh", "--db", "b.duckdb", cwd=tmp_path), "already")
