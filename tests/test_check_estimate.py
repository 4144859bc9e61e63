"""What a check says of its games before they start: the plan's least and most games, and the
minutes they take at the rate this host's earlier checks played in this database."""

from __future__ import annotations

import socket
from pathlib import Path

from runner.run.check_estimate import games_estimate
from runner.spec.document import load_spec
from runner.store.database import Store

CHECK_SPEC = Path(__file__).resolve().parents[1] / "specs" / "check_onnx.yaml"


def test_the_estimate_reads_the_plan_and_the_rate_of_earlier_checks_here(tmp_path):
    spec = load_spec(CHECK_SPEC, check_files=False).spec
    store = Store(tmp_path / "r.duckdb")
    first = games_estimate(store, spec)
    assert (first.games_low, first.games_high, first.runtimes, first.games_per_minute) == (50, 400, 2, None)
    assert first.words() == ("games: 50 to 400 games a runtime, as the staged test decides, 2 runtimes (no check's "
                             "games were timed on this host in this database yet: no estimate of the minutes)")
    for run_id, host in (("r1", socket.gethostname()), ("r2", "another-host")):
        store.begin_run({"run_id": run_id, "spec_name": "check_onnx", "spec_hash": "h", "spec_text": "name: s",
                         "host": host})
        store.append_rows("episode_inference", [{
            "run_id": run_id, "measurement": "games", "runtime": runtime, "episodes": 50, "batch_size": 10,
            "inference_calls": 1, "states_inferred": 1, "transitions": 1, "wall_s": 30.0 if host != "another-host"
            else 3000.0, "episodes_per_minute": 100.0} for runtime in ("baseline", "candidate")])
    timed = games_estimate(store, spec)  # this host's 100 games in 60 s; the other host's do not count
    assert timed.games_per_minute == 100.0 and (timed.minutes_low, timed.minutes_high) == (1.0, 8.0)
    assert timed.words() == ("games: 50 to 400 games a runtime, as the staged test decides, 2 runtimes, about 1.0 to "
                             "8.0 minutes at the 100.0 games a minute earlier checks played on this host")
