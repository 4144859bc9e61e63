"""The real CLI, as a user types it: run a tiny spec into a fresh DuckDB, query, report. A run
that is interrupted runs in a process of its own; other commands run in this process through
click's CliRunner (`cli`)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner, Result

from runner.cli.commands import main
from runner.spec.document import settings_as_written

TINY = """\
name: tiny_eval
contract:
  max_episode_frames: 800
  other_contracts: deliberate  # a capped game: the checkpoint was made under breakout-v3 itself
policies:
  random: {type: random}
  dqn: {type: checkpoint, path: model.pt, epsilon: 0.1}
measurements:
  - kind: evaluate
    name: scores
    policies: [random, dqn]
    seeds: [4, 5, 6, 7]
    batch_size: 4
    gif: {policy: dqn, seed: 5}
verdicts:
  - name: dqn_beats_random
    measurement: scores
    candidate: dqn
    baseline: random
    deployment_worthy_when:
      paired_score_diff_ci_low: "> 0"
"""


def runner(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def cli(*args: str, cwd: Path) -> Result:
    """`runner ARGS` in this process, from the folder `cwd`."""
    with contextlib.chdir(cwd):
        return CliRunner().invoke(main, list(args))


@pytest.mark.slow
def test_run_sql_report_and_verdicts(tmp_path, checkpoint, write_spec):
    spec = write_spec(TINY)
    db = tmp_path / "results.duckdb"
    done = cli("run", str(spec), "--db", str(db), "--reports", "reports", cwd=tmp_path)
    assert done.exit_code == 0, (done.stderr, done.exception)
    run_id = done.stdout.split()[1]
    assert "verdict dqn_beats_random:" in done.stdout

    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()[0] == "done"
        # the spec as it ran, every default filled in, for `runner compare` across commits
        text, settings = con.execute("SELECT spec_text, spec_settings FROM runs WHERE run_id = ?", [run_id]).fetchone()
        assert json.loads(settings) == settings_as_written(text)
        assert json.loads(settings)["policies"]["dqn"]["path"] == "model.pt"  # as written, whatever the checkout
        rows = con.execute("SELECT policy, count(*), min(seed), max(seed) FROM episodes WHERE run_id = ? "
                           "GROUP BY policy ORDER BY policy", [run_id]).fetchall()
        assert rows == [("dqn", 4, 4, 7), ("random", 4, 4, 7)]
        # the bytes the checkpoint policy played, for `runner compare`; a random policy has no file
        from breakout_core.common.hashing import file_sha256
        assert con.execute("SELECT policy, path, sha256 FROM policy_files WHERE run_id = ?", [run_id]).fetchall() == \
            [("dqn", str(tmp_path / "model.pt"), file_sha256(tmp_path / "model.pt"))]
        outcome, reason, evidence = con.execute(
            "SELECT outcome, reason, evidence FROM verdicts WHERE run_id = ?", [run_id]).fetchone()
        low = con.execute("SELECT evidence->>'$.metrics.paired_score_diff_ci_low' FROM verdicts").fetchone()[0]
        score, steps, ended_by = con.execute("SELECT score, steps, ended_by FROM episodes WHERE run_id = ? "
                                             "AND policy = 'dqn' AND seed = 5", [run_id]).fetchone()
        gif_label = con.execute("SELECT label FROM artifacts WHERE run_id = ?", [run_id]).fetchone()[0]
        scores = con.execute("SELECT policy, list(score) FROM episodes WHERE run_id = ? GROUP BY policy",
                             [run_id]).fetchall()
        distinct = dict(con.execute("SELECT policy, distinct_scores FROM episode_summary WHERE run_id = ?",
                                    [run_id]).fetchall())
    assert distinct == {policy: len(set(values)) for policy, values in scores}
    assert json.loads(evidence)["metrics"]["candidate_distinct_scores"] == distinct["dqn"]
    # the GIF's caption is the recorded episode's own result; 200 steps at most, so it is not cut
    assert gif_label == f"dqn, seed 5: score {score:g} in {steps} steps ({ended_by})"
    assert outcome in {"deployment-worthy", "rejected", "inconclusive"}
    assert (outcome == "deployment-worthy") == (float(low) > 0)
    assert "paired_score_diff_ci_low" in evidence

    query = cli("sql", "SELECT policy, count(*) AS n FROM episodes GROUP BY policy ORDER BY policy", "--db",
                str(db), "--csv", cwd=tmp_path)
    assert query.exit_code == 0 and query.stdout.splitlines() == ["policy,n", "dqn,4", "random,4"]

    bad = cli("sql", "SELEC nonsense", "--db", str(db), cwd=tmp_path)
    assert bad.exit_code == 2 and bad.stderr.startswith("error: SQL:") and isinstance(bad.exception, SystemExit)

    report = cli("report", run_id, "--db", str(db), "--reports", "reports", cwd=tmp_path)
    assert report.exit_code == 0, report.stderr
    page = (tmp_path / "reports" / f"tiny_eval-{run_id}.html").read_text()
    assert "vegaEmbed" in page and not re.search(r"<script[^>]*\ssrc=", page)  # inlined: opens offline
    assert "dqn_beats_random" in page and outcome in page
    assert "data:image/gif;base64," in page

    verdicts = cli("report", "--verdicts", "--db", str(db), "--reports", "reports", cwd=tmp_path)
    assert verdicts.exit_code == 0 and outcome in verdicts.stdout
    assert "dqn_beats_random" in (tmp_path / "reports" / "verdicts.html").read_text()

    runs = cli("runs", "--db", str(db), cwd=tmp_path)
    assert runs.exit_code == 0 and "tiny_eval" in runs.stdout


def test_user_mistakes_exit_non_zero_without_traceback(tmp_path, write_spec):
    missing_db = runner("runs", "--db", str(tmp_path / "none.duckdb"), cwd=tmp_path)
    assert missing_db.returncode == 3 and "no results database" in missing_db.stderr
    bad_spec = runner("run", str(write_spec("name: x\nmeasurements: []\n")), "--db", str(tmp_path / "r.duckdb"),
                      cwd=tmp_path)
    assert bad_spec.returncode == 2 and "measurements" in bad_spec.stderr
    assert not (tmp_path / "r.duckdb").exists()  # nothing runs (or is created) for an invalid spec
    for result in (missing_db, bad_spec):
        assert "Traceback" not in result.stderr


LONG = """\
name: long_eval
policies:
  random: {type: random}
measurements:
  - kind: evaluate
    name: first
    policies: [random]
    seeds: [1, 2]
  - kind: evaluate
    name: second
    policies: [random]
    seeds: {start: 100, count: 400}
    batch_size: 2
"""


def wait_for_rows(db: Path, count_sql: str, params: list | None = None, timeout: float = 120) -> None:
    """Poll a database another process is writing until `count_sql` (a count) is above 0."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with duckdb.connect(str(db), read_only=True) as con:
                if con.execute(count_sql, params or []).fetchone()[0]:
                    return
        except duckdb.Error:
            pass  # not created yet, or a write is in progress
        time.sleep(0.3)
    raise AssertionError(f"no rows for {count_sql} {params or ''} within {timeout} s")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["sigint", "sigkill"])
def test_interrupted_run_is_marked_and_keeps_what_was_stored(tmp_path, write_spec, how):
    spec = write_spec(LONG)
    db = tmp_path / "results.duckdb"
    # SIGINT as a terminal delivers it: a suite started in the background (`cmd &`) would hand its
    # children an ignored SIGINT, and the run would then finish instead of stopping
    proc = subprocess.Popen([sys.executable, "-m", "runner", "run", str(spec), "--db", str(db)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        # the first measurement's rows are in, and its writer has closed the file (a reader opened it):
        # the run is on to the second measurement, 400 episodes, still going when the signal lands
        wait_for_rows(db, "SELECT count(*) FROM episodes WHERE measurement = ?", ["first"])
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT if how == "sigint" else signal.SIGKILL)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    if how == "sigint":
        assert proc.returncode == 130 and "interrupted" in stderr and "Traceback" not in stderr
    # the next command that opens the database for writing closes a killed run
    from runner.store.database import Store

    with Store(db).writer() as con:
        status, error = con.execute("SELECT status, error FROM runs").fetchone()
        first = con.execute("SELECT count(*) FROM episodes WHERE measurement = 'first'").fetchone()[0]
    assert status == "interrupted"
    assert ("Ctrl-C" in error) if how == "sigint" else ("killed" in error)
    assert first == 2
    assert os.path.getsize(db) > 0


TWO_RANDOM = """\
name: two_random
contract:
  max_episode_frames: 400
policies:
  first: {type: random}
  second: {type: random}
measurements:
  - kind: evaluate
    name: scores
    policies: [first, second]
    seeds: [1, 2]
"""


@pytest.mark.slow
def test_a_resumed_run_goes_on_in_the_game_it_began(tmp_path, write_spec):
    """A run stored under another contract than this runner's default builds from the same
    spec text (a spec that names none) is resumed under its own contract, and says so."""
    from breakout_core.game.contract import CONTRACTS

    spec = write_spec(TWO_RANDOM)
    db = tmp_path / "r.duckdb"
    assert cli("run", str(spec), "--db", str(db), "--no-report", cwd=tmp_path).exit_code == 0
    began = CONTRACTS["breakout-v2"].replace(max_episode_frames=400)  # as if the default had been v2 then
    with duckdb.connect(str(db)) as con:
        run_id, settings = con.execute("SELECT run_id, spec_settings FROM runs").fetchone()
        settings = json.loads(settings)
        settings["contract"]["name"] = "breakout-v2"  # what that runner would have filled in
        con.execute("UPDATE runs SET status = 'interrupted', contract = ?, contract_hash = ?, spec_settings = ?",
                    [json.dumps(began.to_dict()), began.hash, json.dumps(settings)])
        con.execute("DELETE FROM episodes WHERE policy = 'second'")
    resumed = cli("run", str(spec), "--db", str(db), "--no-report", "--resume", cwd=tmp_path)
    assert resumed.exit_code == 0, resumed.stderr
    assert f"goes on under its own contract breakout-v2 ({began.hash})" in " ".join(resumed.stderr.split())
    with duckdb.connect(str(db), read_only=True) as con:
        hashes = con.execute("SELECT DISTINCT contract_hash FROM episodes WHERE run_id = ? AND policy = 'second'",
                             [run_id]).fetchall()
    assert hashes == [(began.hash,)]


@pytest.mark.slow
def test_a_resume_under_other_settings_than_the_run_began_with_is_refused(tmp_path, write_spec):
    """A runner whose defaults read the same spec text differently does not go on with a run
    begun under others: one line, exit 2, and the run stays interrupted."""
    spec = write_spec(TWO_RANDOM)
    db = tmp_path / "r.duckdb"
    assert cli("run", str(spec), "--db", str(db), "--no-report", cwd=tmp_path).exit_code == 0
    with duckdb.connect(str(db)) as con:
        settings = json.loads(con.execute("SELECT spec_settings FROM runs").fetchone()[0])
        settings["measurements"][0]["policy_seed"] = 7  # as if the default had been 7 then
        con.execute("UPDATE runs SET status = 'interrupted', spec_settings = ?", [json.dumps(settings)])
    resumed = cli("run", str(spec), "--db", str(db), "--no-report", "--resume", cwd=tmp_path)
    assert resumed.exit_code == 2 and isinstance(resumed.exception, SystemExit)  # no exception let through
    line = " ".join(resumed.stderr.split())
    assert "began with other settings than this runner reads from its spec (measurements[0].policy_seed: 7 →" in line
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"
