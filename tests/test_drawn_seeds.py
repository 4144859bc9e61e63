"""Seeds drawn for a candidate: the same files draw the same seeds, another candidate file
other seeds, `--confirm` seeds of the confirmation range; the draw is stored with the run;
a spec that names a confirmation seed is one line, file:line, exit 2, nothing stored; the
held-out check still refuses calibration seeds a draw could give; a --resume keeps the
run's --confirm and refuses another."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from kill_server import KillServer
from test_cli_inputs import assert_one_line_usage_error
from test_end_to_end import cli

from breakout_core.common.hashing import file_sha256
from runner.spec.document import SpecError, load_spec
from runner.spec.seed_pools import CHECK_RANGE, CONFIRMATION_RANGE, draw_key, draw_seeds

REPO = Path(__file__).resolve().parents[1]


def test_a_draw_is_a_function_of_its_key_and_pool():
    key = draw_key(["a" * 64])
    seeds = draw_seeds(key, 400, "check")
    assert seeds == draw_seeds(key, 400, "check") and len(set(seeds)) == 400
    assert all(s in CHECK_RANGE for s in seeds) and seeds[:30] == draw_seeds(key, 30, "check")
    assert all(s in CONFIRMATION_RANGE for s in draw_seeds(key, 400, "confirmation"))
    other = draw_seeds(draw_key(["b" * 64]), 400, "check")
    assert len(set(seeds) & set(other)) < 5  # another file: other games
    assert draw_key(["a" * 64, "b" * 64]) == draw_key(["b" * 64, "a" * 64])  # order does not count
    assert CHECK_RANGE.start > 20_000  # above every explicit seed a shipped spec names
    with pytest.raises(ValueError, match="draw 1 to"):
        draw_seeds(key, 0, "check")


SPEC = """\
name: drawn
contract: {max_episode_frames: 120, other_contracts: deliberate}
artifacts:
  baseline: {path: model.pt}
  candidate: {path: model.pt}
runtimes:
  torch_a: {runtime: torch, threads: 1, artifact: baseline}
  torch_b: {runtime: torch, threads: 1, artifact: candidate}
measurements:
  - kind: episodes
    name: games
    baseline: torch_a
    runtimes: [torch_a, torch_b]
    seeds: {drawn: 3}
    batch_size: 3
verdicts:
  - name: no_more_stalls
    measurement: games
    candidate: torch_b
    baseline: torch_a
    deployment_worthy_when: {stall_excess_ci_low: "<= 0"}
"""


@pytest.mark.slow
def test_the_same_file_draws_the_same_games_and_a_new_one_new_games(tmp_path, checkpoint, write_spec):
    """Five runs: the second draws the first's seeds and copies its baseline games; another
    candidate file draws other seeds; --confirm draws from the confirmation range; another
    contract draws the same seeds but replays the baseline's games."""
    import torch

    from breakout_core.game.contract import CONTRACTS
    from breakout_core.learning.qnetwork import QNetwork, save_checkpoint

    torch.manual_seed(1)
    save_checkpoint(tmp_path / "other.pt", QNetwork(), CONTRACTS["breakout-v3"], transitions=0)
    spec = write_spec(SPEC)

    def run(*args: str) -> str:
        done = cli("run", str(spec), "--db", "r.duckdb", "--no-report", *args, cwd=tmp_path)
        assert done.exit_code == 0, (done.output, done.exception)
        return done.stdout.split()[1]

    first, again = run(), run()
    new_file = run("--set", "artifacts.candidate.path=other.pt")
    confirmed = run("--confirm")
    other_contract = run("--set", "contract.max_episode_frames=124")
    with duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True) as con:
        drawn = {r: (pool, json.loads(files), json.loads(seeds)) for r, pool, files, seeds in con.execute(
            "SELECT run_id, pool, files, seeds FROM drawn_seeds WHERE measurement = 'games'").fetchall()}
        played = dict(con.execute("SELECT run_id, list(DISTINCT seed ORDER BY seed) FROM episodes "
                                  "GROUP BY run_id").fetchall())
        reused = con.execute("SELECT run_id, runtime, count(*), list(DISTINCT reused_from) FROM baseline_games "
                             "WHERE reused_from IS NOT NULL GROUP BY ALL").fetchall()
        games = {r: con.execute("SELECT seed, score, steps, ended_by FROM episodes WHERE run_id = ? "
                                "AND policy = 'torch_a' ORDER BY seed", [r]).fetchall() for r in (first, again)}
        keys = dict(con.execute("SELECT run_id, any_value(key) FROM baseline_games GROUP BY run_id").fetchall())
    assert drawn[first] == drawn[again] and drawn[first][0] == "check"
    assert drawn[first][1] == {"torch_b": file_sha256(checkpoint)}  # the candidate's file keys the draw
    assert drawn[new_file][1] == {"torch_b": file_sha256(tmp_path / "other.pt")}
    assert not set(drawn[first][2]) & set(drawn[new_file][2])
    assert drawn[confirmed][0] == "confirmation" and all(s in CONFIRMATION_RANGE for s in drawn[confirmed][2])
    for run_id, (_, _, seeds) in drawn.items():
        assert played[run_id] == sorted(seeds)  # both runtimes played exactly the drawn seeds
    # the baseline's games of the second run are the first's, copied; no other run copied any
    assert reused == [(again, "torch_a", 3, [first])] and games[again] == games[first]
    assert drawn[other_contract][2] == drawn[first][2] and keys[other_contract] != keys[first]


@pytest.mark.slow
def test_a_resume_keeps_the_runs_confirm_and_refuses_another(tmp_path, checkpoint, write_spec):
    """A --confirm run killed (SIGKILL, by tests/kill_at.py) after its run row is stored and
    before it draws: its --resume without --confirm is one line, exit 2, and draws nothing; with
    --confirm it draws from the confirmation range."""
    write_spec(SPEC)
    args = ["run", "spec.yaml", "--db", "r.duckdb", "--no-report"]

    def ask(extra: list[str], kill: list | None = None) -> subprocess.CompletedProcess:
        reply = server.ask(tmp_path, [*args, *extra], kill=kill)
        return subprocess.CompletedProcess(args, reply["returncode"], "", reply["stderr"])

    def stored() -> list:
        with duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True) as con:
            return con.execute("SELECT pool, seeds FROM drawn_seeds").fetchall()

    with KillServer(600) as server:
        killed = ask(["--confirm"], kill=["database", 4])  # the 4th opening: the run row stored, nothing drawn
        assert killed.returncode == -9 and stored() == [], (killed, stored())
        assert_one_line_usage_error(ask(["--resume"]), "began with --confirm", "resume it with --confirm, "
                                    "not without --confirm")
        assert stored() == []
        resumed = ask(["--resume", "--confirm"])
    assert resumed.returncode == 0, resumed.stderr
    [(pool, seeds)] = stored()
    assert pool == "confirmation" and all(s in CONFIRMATION_RANGE for s in json.loads(seeds))
    with duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True) as con:
        assert con.execute("SELECT confirm, status FROM runs").fetchall() == [(True, "done")]


def test_a_seed_in_the_confirmation_range_is_one_line_and_stores_nothing(tmp_path, checkpoint, write_spec):
    spec = write_spec(SPEC.replace("seeds: {drawn: 3}", "seeds: {start: 1499999998, count: 3}"))
    result = cli("run", str(spec), "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, f"{spec}:14: measurements[0].seeds: seed 1500000000 is in the "
                                        "confirmation range 1500000000-1999999999, which only `--confirm` plays")
    assert not (tmp_path / "r.duckdb").exists()
    listed = write_spec(SPEC.replace("seeds: {drawn: 3}", "seeds: [7, 1600000000]"))
    result = cli("run", str(listed), "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, f"{listed}:14: measurements[0].seeds: seed 1600000000")
    result = cli("run", str(spec), "--db", "r.duckdb", "--set", "measurements.games.seeds={drawn: 0}", cwd=tmp_path)
    assert_one_line_usage_error(result, "measurements[0].seeds.drawn: Input should be greater than 0")
    assert not (tmp_path / "r.duckdb").exists()


@pytest.mark.parametrize("spec, seed_field", [("check_onnx.yaml", "measurements.closed_loop.seed"),
                                              ("day14_learning_rate.yaml", "measurements.lr.gif.seed")])
def test_a_single_episode_seed_in_the_confirmation_range_is_refused_where_it_is_set(spec, seed_field):
    """A closed loop's game, or a GIF's, is one seed: it may not be a confirmation seed either."""
    with pytest.raises(SpecError) as refused:
        load_spec(REPO / "specs" / spec, overrides=(f"{seed_field}=1600000000",))
    [problem] = refused.value.problems
    assert problem.endswith(".seed: seed 1600000000 is in the confirmation range 1500000000-1999999999, which only "
                            "`--confirm` plays (a spec may name no seed there)"), problem
    load_spec(REPO / "specs" / spec, overrides=(f"{seed_field}=1499999999",))


def test_calibration_seeds_a_draw_could_give_are_refused_where_they_are_declared():
    spec = REPO / "specs" / "int8_cpu.yaml"
    capture = "measurements.int8_repair.calibration.capture.episode_seeds"
    with pytest.raises(SpecError) as refused:
        load_spec(spec, overrides=(f"{capture}={{start: {CHECK_RANGE.start + 5}, count: 8}}",))
    assert "held-out seeds must be disjoint from every game the spec plays: measurement 'int8_games' (seeds) " \
           f"plays {CHECK_RANGE.start + 5}" in str(refused.value)
    assert load_spec(spec).spec.measurements[-1].seeds.drawn == 400  # as shipped: 9100-9107, never drawn


def _context(tmp_path: Path, run_id: str, contract=None):
    from runner.run.context import RunContext
    from runner.store.database import Store

    spec = load_spec(REPO / "specs" / "check_onnx.yaml").spec
    return RunContext(run_id=run_id, spec=spec, contract=contract or spec.contract.build(),
                      store=Store(tmp_path / "r.duckdb"), reports_dir=tmp_path, progress=None,
                      artifacts_dir=tmp_path)


def _played(ctx, key: str, keyed_by: dict, seeds=(5, 6)) -> list[dict]:
    """Store baseline games of `ctx`'s run on `seeds` as played under `key`; their episode rows."""
    from runner.kinds.shared.baseline_games import played_marks

    episodes = [{"run_id": ctx.run_id, "measurement": "games", "policy": "baseline", "seed": seed,
                 "score": 10.0 + seed, "steps": 100, "frames": 400, "ended_by": "game_over", "action_noop": 1,
                 "action_fire": 2, "action_right": 3, "action_left": 4, "wall_s": 1.0,
                 "contract_hash": ctx.contract.hash} for seed in seeds]
    ctx.store.append_together({"episodes": episodes,
                               "baseline_games": played_marks(ctx, "games", "baseline", episodes, key, keyed_by)})
    return episodes


def test_stored_baseline_games_are_copied_only_under_the_same_key(tmp_path):
    from runner.kinds.shared.baseline_games import game_key, reuse_games
    from runner.store.provenance import code_identity

    earlier = _context(tmp_path, "earlier")
    key, keyed_by = game_key(earlier, "baseline", 10)
    assert game_key(earlier, "baseline", 10)[0] == key and keyed_by["batch_size"] == 10
    assert keyed_by["file_sha256"] == file_sha256(REPO / "models" / "reference" / "dqn_breakout.onnx")
    assert {"cpu", "packages", "contract", "backend", "options"} <= set(keyed_by)
    assert keyed_by["code"] == code_identity() and len(keyed_by["code"]["sources_sha256"]) == 64
    other_contract = _context(tmp_path, "x", earlier.contract.replace(max_episode_frames=1000))
    others = {game_key(earlier, "baseline", 1)[0], game_key(earlier, "candidate", 10)[0],  # another batch, file
              game_key(other_contract, "baseline", 10)[0]}
    assert key not in others and len(others) == 3
    _played(earlier, key, keyed_by)
    later = _context(tmp_path, "later")
    assert reuse_games(later, "games", "baseline", [7, 6, 5], key, keyed_by) == [7]  # 7 is left to play
    assert reuse_games(later, "games", "baseline", [5], others.pop(), keyed_by) == [5]  # another key: none
    with later.store.reader() as con:
        copied = con.execute("SELECT seed, score, action_left FROM episodes WHERE run_id = 'later' ORDER BY seed"
                             ).fetchall()
        marks = con.execute("SELECT seed, reused_from FROM baseline_games WHERE run_id = 'later' ORDER BY seed"
                            ).fetchall()
    assert copied == [(5, 15.0, 4), (6, 16.0, 4)] and marks == [(5, "earlier"), (6, "earlier")]
    # a copy is never copied from: only games that were played
    assert reuse_games(_context(tmp_path, "third"), "games", "baseline", [5], key, keyed_by) == []
    with later.store.reader() as con:
        assert con.execute("SELECT DISTINCT reused_from FROM baseline_games WHERE run_id = 'third'").fetchall() == \
            [("earlier",)]


@pytest.mark.parametrize("edit, problem", [
    ("UPDATE baseline_games SET keyed_by = json_merge_patch(keyed_by, '{\"contract\": \"v2\"}')",
     "its key is not the sha256 of its stored keyed_by"),
    ("UPDATE baseline_games SET key = ?", "its key is not the sha256 of its stored keyed_by"),  # another key's games
    ("UPDATE episodes SET score = score + 100", "its episode's stored values are not those recorded when it was "
     "played (game_sha256)"),
    ("UPDATE episodes SET contract_hash = 'v2'; UPDATE baseline_games SET game_sha256 = ?",
     "its episode was played under contract v2, not this run's"),
], ids=["keyed-by", "key", "score", "contract"])
def test_an_edited_baseline_game_is_refused_in_one_line_and_nothing_is_copied(tmp_path, edit, problem):
    """What a database edit can change in a stored baseline game, each refused by a check that
    its own stored fields make: its key against its keyed_by, its values against the sha256
    recorded as it was played, its contract against the run's."""
    from runner.kinds.shared.baseline_games import game_key, game_sha256, key_of, reuse_games
    from runner.store.errors import StoredRowChanged

    earlier = _context(tmp_path, "earlier")
    key, keyed_by = game_key(earlier, "baseline", 10)
    other = _context(tmp_path, "v2", earlier.contract.replace(max_episode_frames=1000))
    other_key, other_keyed_by = game_key(other, "baseline", 10)
    if "SET key =" in edit:  # another contract's games, relabelled with this run's key
        _played(other, other_key, other_keyed_by, seeds=(5,))
        arguments = [key]
    else:
        episode, = _played(earlier, key, keyed_by, seeds=(5,))
        arguments = [game_sha256({**episode, "contract_hash": "v2"})] if "game_sha256" in edit else []
    assert key_of(keyed_by) == key
    with earlier.store.writer() as con:
        con.execute(edit, arguments)
    later = _context(tmp_path, "later")
    with pytest.raises(StoredRowChanged) as refused:
        reuse_games(later, "games", "baseline", [5, 7], key, keyed_by)
    message = str(refused.value)
    assert "\n" not in message and "baseline_games row of run " in message and "seed 5" in message
    assert f"refused: {problem}" in message, message
    with later.store.reader() as con:
        assert con.execute("SELECT count(*) FROM episodes WHERE run_id = 'later'").fetchone() == (0,)


@pytest.mark.slow
def test_baseline_games_are_copied_by_the_same_code_only_and_an_edited_one_fails_the_run(tmp_path, checkpoint,
                                                                                          write_spec):
    """`runner run` of one spec in processes of a copy of the project in a git repository: at one
    commit a second run copies the first's baseline games; with the game's code changed, before
    and after it is committed, each replays them; an edited score of a played game fails the next
    run in one line (exit 3), with nothing copied."""
    project = tmp_path / "project"
    for package in ("breakout_core", "runner"):
        shutil.copytree(REPO / package, project / package, ignore=shutil.ignore_patterns("__pycache__"))

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=project, check=True,
                              capture_output=True, text=True).stdout.strip()

    git("init", "-q")
    git("add", ".")
    git("commit", "-qm", "a")
    spec = write_spec(SPEC)

    def run() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "runner", "run", str(spec), "--db", "r.duckdb", "--no-report"],
                              cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(project)}, capture_output=True,
                              text=True, timeout=600)

    def run_id() -> str:
        done = run()
        assert done.returncode == 0, done.stderr
        return done.stdout.split()[1]

    first, again = run_id(), run_id()
    driver = project / "breakout_core" / "game" / "driver.py"
    driver.write_text(driver.read_text() + "\n# the game's code, changed\n")
    dirty = run_id()
    git("commit", "-qam", "b")
    committed = run_id()
    with duckdb.connect(str(tmp_path / "r.duckdb")) as con:
        reused = con.execute("SELECT run_id, count(*), list(DISTINCT reused_from) FROM baseline_games "
                             "WHERE reused_from IS NOT NULL GROUP BY ALL").fetchall()
        commits = dict(con.execute("SELECT run_id, any_value(keyed_by->>'$.code.commit') FROM baseline_games "
                                   "GROUP BY run_id").fetchall())
        con.execute("UPDATE episodes SET score = score + 100 WHERE run_id = ? AND policy = 'torch_a'", [committed])
    assert reused == [(again, 3, [first])]  # the same code copies; changed code, committed or not, replays
    head = git("rev-parse", "HEAD")
    assert commits == {first: commits[again], again: commits[first], dirty: commits[first] + "-dirty",
                       committed: head} and commits[first] != head
    refused = run()
    lines = [line for line in refused.stderr.splitlines() if "/3 episodes" not in line]  # its progress bar aside
    assert refused.returncode == 3 and len(lines) == 1 and lines[0].startswith("error: "), refused.stderr
    assert f"baseline_games row of run {committed} (games · torch_a, seed " in lines[0]
    assert "its episode's stored values are not those recorded when it was played" in lines[0]
    with duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True) as con:
        last, status = con.execute("SELECT run_id, status FROM runs ORDER BY started_at DESC LIMIT 1").fetchone()
        assert status == "failed" and con.execute("SELECT count(*) FROM episodes WHERE run_id = ?",
                                                  [last]).fetchone() == (0,)


def test_a_gif_cannot_name_a_seed_not_yet_drawn(tmp_path, write_spec):
    spec = write_spec("""\
name: gif
policies:
  a: {type: random}
measurements:
  - kind: evaluate
    name: games
    policies: [a]
    seeds: {drawn: 2}
    gif: {policy: a, seed: 3}
verdicts:
  - name: v
    measurement: games
    candidate: a
    deployment_worthy_when: {candidate_mean_score: ">= 0"}
""")
    result = cli("run", str(spec), "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, f"{spec}:9: measurements[0].gif.seed: gif.seed names a seed, and drawn "
                                        "seeds are known only once the run draws them")


def test_a_resaved_onnx_model_with_renamed_nodes_draws_the_same_seeds(tmp_path):
    """Seeds are keyed by an ONNX model's content: the FP16 file re-saved with every node renamed
    (other bytes, the same graph and weights) draws the same games; a checkpoint by its sha256."""
    import onnx

    from runner.kinds.shared.drawn_seeds import seed_identity

    fp16 = REPO / "models" / "reference" / "dqn_breakout_fp16.onnx"
    model = onnx.load(str(fp16))
    for i, node in enumerate(model.graph.node):
        node.name = f"renamed_{i}"
    onnx.save(model, str(tmp_path / "resaved.onnx"))
    assert file_sha256(tmp_path / "resaved.onnx") != file_sha256(fp16)
    same = [draw_seeds(draw_key([seed_identity(path)]), 400, pool) for path in (fp16, tmp_path / "resaved.onnx")
            for pool in ("check", "confirmation")]
    assert same[0] == same[2] and same[1] == same[3] and same[0] != same[1]
    reference = REPO / "models" / "reference" / "dqn_breakout.onnx"
    assert draw_seeds(draw_key([seed_identity(reference)]), 400, "check") != same[0]
    checkpoint = tmp_path / "model.pt"
    checkpoint.write_bytes(b"weights")
    assert seed_identity(checkpoint) == file_sha256(checkpoint)
