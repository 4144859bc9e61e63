"""A full disk in the middle of a run is told as what it is, `no space left on device: PATH`,
found from the first error it caused: not as the ROLLBACK that fails after a COMMIT that
could not be written ("cannot rollback - no transaction is active"), nor as a library's own
words. On a real 2 MB tmpfs (`small_disk`), filled to a few KB."""

from __future__ import annotations

import os
from pathlib import Path

import duckdb
import pytest
from test_cli_inputs import cli
from test_storage_trust import _fill

from runner.store.database import Store
from runner.store.errors import StoreDamaged
from runner.store.row_buffer import RowBuffer


def _episode(i: int) -> dict:
    return {"run_id": "r0", "measurement": "m", "policy": os.urandom(16).hex(), "seed": i, "score": 1.0, "steps": 1,
            "frames": 1, "ended_by": "game_over", "action_noop": 0, "action_fire": 0, "action_right": 0,
            "action_left": 0, "wall_s": 0.1, "contract_hash": os.urandom(16).hex()}


def _stored_episodes(db) -> int:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT count(*) FROM episodes").fetchone()[0]


@pytest.mark.parametrize("append", ["together", "row_buffer"])
def test_a_commit_that_fills_the_disk_is_told_as_a_full_disk(small_disk, append):
    """20,000 rows in one transaction on a disk with 16 KB left: the COMMIT cannot write the
    WAL and ends the transaction, so the ROLLBACK after it fails; the error told is the first."""
    db = small_disk / "r.duckdb"
    store = Store(db)
    store.begin_run({"run_id": "r0", "spec_name": "s", "spec_hash": "h", "spec_text": "name: s\n", "host": "h"})
    _fill(small_disk, 16 * 1024)
    rows = [_episode(i) for i in range(20_000)]
    with pytest.raises(StoreDamaged) as full:
        if append == "together":
            store.append_together({"episodes": rows})
        else:
            buffer = RowBuffer(store, "r0", log=print)
            for row in rows:
                buffer.add("episodes", row)
            buffer.close()
    assert str(full.value).startswith(f"no space left on device: {db}"), full.value
    assert "rollback" not in str(full.value).lower()
    (small_disk / "filler").unlink()
    assert _stored_episodes(db) == 0  # none of the batch, and the file reads


def _error_line(result) -> str:
    """The run's last word: one error line after its progress bars, no traceback."""
    assert result.exit_code == 3, result.output
    assert "Traceback" not in result.stderr, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") and [line for line in result.stderr.splitlines() if "error" in line] == [last]
    return last.removeprefix("error: ")


SMALL = """\
name: full_disk
contract:
  max_episode_frames: 200
  other_contracts: deliberate
policies:
  dqn: {type: checkpoint, path: model.pt}
measurements:
  - kind: evaluate
    name: scores
    policies: [dqn]
    seeds: [5]
    batch_size: 1
    gif: {policy: dqn, seed: 5}
"""


def test_a_run_whose_gif_fills_the_disk_says_so_and_stores_it(small_disk, tmp_path, checkpoint, write_spec):
    spec = write_spec(SMALL)
    db = tmp_path / "r.duckdb"
    _fill(small_disk, 1024)
    result = cli("run", str(spec), "--db", str(db), "--reports", str(small_disk / "reports"), "--no-report",
                 cwd=tmp_path)
    told = _error_line(result)
    assert told.startswith(f"no space left on device: {small_disk / 'reports' / 'gifs'}/") and told.endswith(".gif")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status, error FROM runs").fetchall() == [("failed", told)]
    assert not list((small_disk / "reports").rglob("*.gif*"))  # nor a temporary file


def test_a_run_on_a_full_database_disk_says_so_and_loses_nothing(small_disk, tmp_path, checkpoint, write_spec):
    spec = write_spec(SMALL.replace("    gif: {policy: dqn, seed: 5}\n", ""))
    db = small_disk / "r.duckdb"
    Store(db).begin_run({"run_id": "r0", "spec_name": "s", "spec_hash": "h", "spec_text": "name: s\n", "host": "h"})
    _fill(small_disk, 16 * 1024)
    result = cli("run", str(spec), "--db", str(db), "--no-report", cwd=tmp_path)
    assert _error_line(result).startswith(f"no space left on device: {db}")
    (small_disk / "filler").unlink()
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT run_id FROM runs").fetchall() == [("r0",)]


EXPORT = """\
name: full_output_disk
contract: {{name: breakout-v3}}
artifacts:
  checkpoint: {{path: {models}/dqn_breakout.pt}}
  onnx_fp32: {{path: {models}/dqn_breakout.onnx}}
  int8: {{path: {out}/dyn.onnx, made_by: full_output_disk, precision: int8}}
measurements:
  - kind: export
    name: files
    checkpoint: checkpoint
    int8:
      - {{onnx: int8, source: onnx_fp32, method: dynamic}}
"""


def test_an_output_published_across_devices_onto_a_full_disk_names_that_disk_file(small_disk, tmp_path):
    """The run writes its own copy under runs/ (a healthy disk), then copies it to the output's
    disk: the full one is told, not the run's copy that was read."""
    models = Path(__file__).resolve().parents[1] / "models" / "reference"
    spec = tmp_path / "spec.yaml"
    spec.write_text(EXPORT.format(models=models, out=small_disk / "out"))
    (small_disk / "out").mkdir()
    _fill(small_disk, 64 * 1024)
    result = cli("run", str(spec), "--db", str(tmp_path / "r.duckdb"), "--runs-dir", str(tmp_path / "runs"),
                 "--no-report", cwd=tmp_path)
    told = _error_line(result)
    assert told == f"no space left on device: {small_disk / 'out' / 'dyn.onnx'}"
    with duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True) as con:
        assert con.execute("SELECT status, error FROM runs").fetchall() == [("failed", told)]
    assert list((small_disk / "out").iterdir()) == [], "no temporary file is left on the full disk"
