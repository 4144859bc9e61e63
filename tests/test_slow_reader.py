"""A reader holding the database however long never fails a training that writes to it: the
training keeps its rows (spooled to disk at each checkpoint), goes on, waits at the end,
and appends everything once the file is free. Every row is the same as without the reader."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

SPEC = """\
name: held_training
contract: {max_episode_frames: 500}
measurements:
  - kind: train
    name: train
    total_transitions: 300
    batch_size: 8
    learning_starts: 50
    replay_capacity: 1000
    diagnostics_every: 50
    target_sync_every: 50
    epsilon_decay_transitions: 200
    torch_threads: 1
    checkpoint_every: 100
    evaluate_checkpoints: {seeds: [7], batch_size: 1}
"""
# Ready (its imports done) before the run starts: it takes the database within a poll of the
# first checkpoint (of three), and the two checkpoints after it are kept while it holds.
HOLDER = """
import sys, time
from pathlib import Path
from runner.store.database import Store
folder = Path(sys.argv[1])
print("ready", flush=True)
while not list(folder.glob("runs/*/train/base/checkpoint_000000100.pt")):
    time.sleep(0.01)
with Store(folder / "results.duckdb").reader(files=False) as con:  # as `runner sql` does, for as long as the test says
    con.execute("SELECT count(*) FROM runs").fetchall()
    (folder / "holding").touch()
    sys.stdin.readline()
"""
TABLES = {
    "train_episodes": "transition, env_index, episode_return, length, ended_by",
    "train_diagnostics": 'transition, "update", loss, q_mean, td_abs_max, epsilon, replay_frames',
    "train_checkpoints": "transition, regexp_extract(path, '[^/]+$')",
    "train_results": "transitions, updates, target_syncs, weights_moved",
    "episodes": "policy, seed, score, steps",
}


def wait_until(condition, what: str, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(0.02)


def rows(folder: Path) -> dict[str, list]:
    with duckdb.connect(str(folder / "results.duckdb"), read_only=True) as con:
        assert con.execute("SELECT status FROM runs").fetchall() == [("done",)]
        return {t: con.execute(f"SELECT {columns} FROM {t} ORDER BY ALL").fetchall() for t, columns in TABLES.items()}


def start(folder: Path) -> tuple[subprocess.Popen, Path]:
    folder.mkdir()
    (folder / "spec.yaml").write_text(SPEC)
    log = folder / "stderr.txt"
    proc = subprocess.Popen([sys.executable, "-m", "runner", "run", "spec.yaml", "--db", "results.duckdb",
                             "--no-report"], cwd=folder, stdout=subprocess.DEVNULL, stderr=log.open("w"), text=True)
    return proc, log


@pytest.mark.slow
def test_a_reader_holding_the_database_never_fails_a_training(tmp_path):
    held = tmp_path / "held"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(held)], cwd=tmp_path, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline() == "ready\n"
    free, _ = start(tmp_path / "free")  # the same training beside it, never held: the rows expected
    proc, log = start(held)
    try:
        wait_until(lambda: (held / "holding").exists() or proc.poll() is not None, "the reader holding the database")
        assert (held / "holding").exists(), log.read_text()[-3000:]
        # the training goes on: later checkpoints' rows are spooled, and at its end the run waits
        wait_until(lambda: "waiting, nothing is lost" in log.read_text(), "the run waiting for the reader")
        assert proc.poll() is None
        assert list(held.glob("results.duckdb.spool/*/*.parquet"))
        assert list(held.glob("runs/*/train/base/final.pt"))
        holder.communicate("release\n", timeout=60)
        assert proc.wait(timeout=600) == 0, log.read_text()[-3000:]
        assert free.wait(timeout=600) == 0
    finally:
        for p in (free, proc, holder):
            if p.poll() is None:
                p.kill()
    expected = rows(tmp_path / "free")
    text = log.read_text()
    assert "held by another process: keeping rows" in text and "appended" in text and "Traceback" not in text
    assert rows(held) == expected
    assert not (held / "results.duckdb.spool").exists() or not any((held / "results.duckdb.spool").iterdir())
