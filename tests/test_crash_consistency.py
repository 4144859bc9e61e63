"""A small training killed (SIGKILL) at every file event of its training, then resumed: the
stored rows and the verdict agree with an uninterrupted run's.

The kill points are the events of a logged uninterrupted run, from its first checkpoint to
the moment its results are stored: each checkpoint file and trainer state renamed into place,
each opening of the database; of those, one per distinct state left on disk (`kill_points`).
A resumed attempt starts from the last saved trainer state or, killed before it saved one,
from its latest checkpoint file, with an empty replay and new episode seeds, so rows past
that point are its own; up to it, the rows must be the uninterrupted run's exactly, and past
it every checkpoint, evaluation and result must be there once.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

HERE = Path(__file__).resolve().parent
# short: three checkpoints, each with its evaluation and trainer state, updates and diagnostics between
# them and several games, are every kind of event and row a longer training has
SPEC = """\
name: crash_consistency
contract: {max_episode_frames: 100}
measurements:
  - kind: train
    name: health
    total_transitions: 60
    batch_size: 8
    learning_starts: 20
    replay_capacity: 1000
    diagnostics_every: 5
    target_sync_every: 20
    epsilon_decay_transitions: 40
    torch_threads: 1
    checkpoint_at: [20, 40, 60]
    evaluate_checkpoints: {seeds: [7], batch_size: 1}
verdicts:
  - name: trainer_healthy
    measurement: health
    candidate: base
    labels: {deployment-worthy: healthy, rejected: unhealthy}
    deployment_worthy_when:
      finished: "== 1"
      weights_moved: "> 0"
      replay_fill_fraction: ">= 0.99"
      epsilon_schedule_error: "<= 0.001"
      non_finite_diagnostics: "== 0"
"""
TOTAL = 60
EPISODE_COLUMNS = "transition, env_index, episode_return, length, ended_by"  # transition first, as below
DIAGNOSTICS_COLUMNS = ('transition, "update", loss, q_mean, target_mean, td_abs_mean, td_abs_max, grad_norm, '
                       "epsilon, replay_frames")


class Runs:
    """`runner run` of the spec in a folder, each in a process of its own, forked by one kill_at.py."""

    TIMEOUT_S = 600  # one run, as a subprocess's timeout would

    def __init__(self) -> None:
        # its own session: a run that hangs is killed with the server, children and all
        self.server = subprocess.Popen([sys.executable, str(HERE / "kill_at.py")], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True, start_new_session=True)

    def run_at(self, folder: Path, *args: str, log: Path | None = None,
               kill: tuple[str, int] | None = None) -> dict:
        """The run's {"returncode", "stderr"}; `log` or `kill` as kill_at.py's requests take them."""
        folder.mkdir(exist_ok=True)
        (folder / "spec.yaml").write_text(SPEC)
        request = {"cwd": str(folder), "args": ["run", "spec.yaml", "--db", "results.duckdb", "--no-report", *args],
                   "log": str(log) if log else None, "kill": kill}
        self.server.stdin.write(json.dumps(request) + "\n")
        self.server.stdin.flush()
        ready, _, _ = select.select([self.server.stdout], [], [], self.TIMEOUT_S)
        if not ready:
            self.kill()
            raise AssertionError(f"runner {' '.join(request['args'])} in {folder} ran past {self.TIMEOUT_S} s")
        reply = self.server.stdout.readline()
        assert reply, f"kill_at.py ended (exit status {self.server.wait()})"
        return json.loads(reply)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.server.pid, signal.SIGKILL)
        self.server.wait()

    def close(self) -> None:
        self.server.stdin.close()
        try:
            self.server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()


@pytest.fixture
def runs():
    server = Runs()
    yield server
    server.close()


def kill_points(log: list[str]) -> list[tuple[str, int]]:
    """(class, n) for each event from the first checkpoint to the first database opening after
    the last trainer state (the n-th event of that class), one per distinct state on disk: a
    database opening right after a reader's (`database read` in the log) is left out, since a
    reader writes nothing and no file is written between the two openings (a checkpoint or
    trainer state is written to its temporary file before its rename, so a rename after a
    read is kept). A kill there leaves what the kill before the read leaves."""
    events = [line.split()[0] for line in log]
    last_state = max(i for i, e in enumerate(events) if e == "state")
    end = events.index("database", last_state)
    first = events.index("checkpoint")
    points, seen = [], {}
    for i, event in enumerate(events[:end + 1]):
        seen[event] = seen.get(event, 0) + 1
        after_read = i > first and log[i - 1] == "database read" and event == "database"
        if i >= first and not after_read:
            points.append((event, seen[event]))
    return points


def stored(folder: Path) -> dict:
    """What a comparison needs from a finished run's database."""
    with duckdb.connect(str(folder / "results.duckdb"), read_only=True) as con:
        (run_id, status), = con.execute("SELECT run_id, status FROM runs").fetchall()
        resumed_from = con.execute("SELECT max(from_transition) FROM train_attempts").fetchone()[0]
        last_attempt, last_mode = con.execute("SELECT max(attempt), arg_max(resume_mode, attempt) "
                                              "FROM train_attempts").fetchone()
        return {
            "status": status, "resumed_from": resumed_from, "last_attempt": last_attempt, "last_mode": last_mode,
            "episodes": con.execute(f"SELECT attempt, {EPISODE_COLUMNS} FROM train_episodes_valid "
                                    "ORDER BY transition, env_index").fetchall(),
            "diagnostics": con.execute(f"SELECT attempt, {DIAGNOSTICS_COLUMNS} FROM train_diagnostics_valid "
                                       "ORDER BY transition").fetchall(),
            "checkpoints": con.execute("SELECT transition, regexp_extract(path, '[^/]+$') FROM train_checkpoints_valid "
                                       "ORDER BY ALL").fetchall(),
            "results": con.execute("SELECT transitions, updates, target_syncs, weights_moved, measured_transitions, "
                                   "transitions_per_s FROM train_results").fetchall(),
            "evaluations": con.execute("SELECT policy, seed, score, steps FROM episodes ORDER BY policy").fetchall(),
            "verdicts": con.execute("SELECT verdict, outcome FROM verdicts").fetchall(),
        }


def compare(got: dict, whole: dict) -> int:
    """Assert that a resumed run agrees with the uninterrupted one; returns the rows compared."""
    cut = got["resumed_from"]
    compared = 0
    assert got["status"] == "done"
    for table in ("episodes", "diagnostics"):
        before = [row[1:] for row in got[table] if row[1] <= cut]  # row[1]: transition (after attempt)
        assert before == [row[1:] for row in whole[table] if row[1] <= cut], table
        after = [row for row in got[table] if row[1] > cut]
        assert all(row[0] == got["last_attempt"] for row in after), table  # the killed attempt's are superseded
        keys = [row[1:3] for row in got[table]]
        assert len(keys) == len(set(keys)), table  # nothing stored twice
        compared += len(got[table])
    assert got["checkpoints"] == whole["checkpoints"]  # every checkpoint once, none lost
    assert [e[:2] for e in got["evaluations"]] == [e[:2] for e in whole["evaluations"]]  # each evaluated once
    assert [e for e in got["evaluations"] if int(e[0].split("@")[1]) <= cut] == \
        [e for e in whole["evaluations"] if int(e[0].split("@")[1]) <= cut]
    (result,) = got["results"]
    (expected,) = whole["results"]
    # a trainer state carries the throughput clock; a checkpoint's weights start it again
    measured = TOTAL - cut if got["last_mode"] == "checkpoint" else TOTAL
    assert result[0] == TOTAL and result[3] > 0 and result[4] == measured and result[5] > 0
    if cut == TOTAL:  # nothing was left to train: the results are the uninterrupted run's
        assert result[1:3] == expected[1:3] and result[3] == pytest.approx(expected[3])
    assert got["verdicts"] == whole["verdicts"] == [("trainer_healthy", "deployment-worthy")]
    return compared + len(got["checkpoints"]) + len(got["evaluations"]) + 2


@pytest.mark.slow
@pytest.mark.parametrize("share", [0, 1], ids=["even-points", "odd-points"])
def test_kill_at_every_file_event_then_resume(tmp_path, share, runs):
    """Every other kill point per test, so that a suite run with two workers (pytest -n 2)
    kills at all of them in half the time."""
    events_file = tmp_path / "events.txt"
    whole_run = runs.run_at(tmp_path / "whole", log=events_file)
    assert whole_run["returncode"] == 0, whole_run["stderr"][-3000:]
    whole = stored(tmp_path / "whole")
    assert whole["last_attempt"] == 0
    points = kill_points(events_file.read_text().splitlines())
    assert len(points) >= 12
    points = points[share::2]
    report = []
    for event, nth in points:
        folder = tmp_path / f"{event}-{nth}"
        killed = runs.run_at(folder, kill=(event, nth))
        assert killed["returncode"] == -9, (event, nth, killed["stderr"][-2000:])
        resumed = runs.run_at(folder, "--resume")
        assert resumed["returncode"] == 0, (event, nth, resumed["stderr"][-3000:])
        got = stored(folder)
        try:
            rows = compare(got, whole)
        except AssertionError as exc:
            raise AssertionError(f"killed before {event} #{nth}, resumed from {got['resumed_from']}: {exc}") from exc
        report.append(f"{event} #{nth}: resumed from {got['resumed_from']} ({got['last_mode']}), {rows} rows compared")
    print(f"\n{len(points)} kill points\n" + "\n".join(report))
