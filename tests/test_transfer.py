"""A run exported to Parquet imports into another database with every row, once."""

import pytest

from runner.store import Store, StoreError
from runner.transfer import export_run, import_run


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
