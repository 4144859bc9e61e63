"""Full games in stages through the `episodes` kind: a clear case stops at the first look, a
case that cannot decide plays to the cap and is inconclusive with its figures, and every look
is stored; bad stages are one-line errors naming their line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import duckdb
import pytest
from kill_server import KillServer
from test_cli_inputs import assert_one_line_usage_error, cli
from test_end_to_end import runner

from runner.run.verdicts import decide
from runner.spec.document import SpecError, load_spec
from runner.spec.fields import VerdictSpec

REPO = Path(__file__).resolve().parents[1]

# Two runtimes of one untrained checkpoint play the same games, 60 steps each (it scores 0):
# `clear` (margin 1 point) is non-inferior at the first look; `undecidable` takes the default
# margin, 10% of the baseline's mean, which is 0 here, so its interval [0, 0] can never lie
# above minus the margin and the test plays to the cap.
SPEC = """\
name: staged
contract: {max_episode_frames: 240, other_contracts: deliberate}
artifacts:
  checkpoint: {path: model.pt}
runtimes:
  torch_a: {runtime: torch, threads: 1, artifact: checkpoint}
  torch_b: {runtime: torch, threads: 1, artifact: checkpoint}
measurements:
  - kind: episodes
    name: clear
    runtimes: [torch_a, torch_b]
    seeds: {start: 10, count: 6}
    batch_size: 2
    stages: {games: 2, margin: 1.0}
  - kind: episodes
    name: undecidable
    runtimes: [torch_a, torch_b]
    seeds: {start: 10, count: 6}
    batch_size: 2
    stages: {games: 2}
verdicts:
  - name: clear_keeps
    measurement: clear
    candidate: torch_b
    baseline: torch_a
    deployment_worthy_when: {diff_plus_margin_ci_low: "> 0"}
  - name: undecidable_keeps
    measurement: undecidable
    candidate: torch_b
    baseline: torch_a
    deployment_worthy_when: {diff_plus_margin_ci_low: "> 0"}
"""


@pytest.mark.slow
def test_a_clear_case_stops_at_the_first_look_and_one_that_cannot_decide_reaches_the_cap(tmp_path, checkpoint,
                                                                                          write_spec):
    spec = write_spec(SPEC)
    db = tmp_path / "r.duckdb"
    done = cli("run", str(spec), "--db", str(db), "--no-report", cwd=tmp_path)
    assert done.exit_code == 0, (done.output, done.exception)
    assert "games in stages of 2" in done.output  # the progress bar counts games
    con = duckdb.connect(str(db), read_only=True)
    looks = con.execute("SELECT measurement, stage, games, max_games, planned_looks, baseline_mean, mean_diff, ci_low, "
                        "ci_high, margin, decision FROM episode_looks ORDER BY measurement, stage").fetchall()
    assert looks == [("clear", 1, 2, 6, 3, 0.0, 0.0, 0.0, 0.0, 1.0, "non-inferior"),
                     ("undecidable", 1, 2, 6, 3, 0.0, 0.0, 0.0, 0.0, 0.0, "continue"),
                     ("undecidable", 2, 4, 6, 3, 0.0, 0.0, 0.0, 0.0, 0.0, "continue"),
                     ("undecidable", 3, 6, 6, 3, 0.0, 0.0, 0.0, 0.0, 0.0, "inconclusive")]
    games = dict(con.execute("SELECT measurement || ' ' || policy, list(seed ORDER BY seed) FROM episodes "
                             "GROUP BY ALL").fetchall())
    assert games == {"clear torch_a": [10, 11], "clear torch_b": [10, 11],  # stopped after one stage
                     "undecidable torch_a": [10, 11, 12, 13, 14, 15], "undecidable torch_b": [10, 11, 12, 13, 14, 15]}
    verdicts = dict(con.execute("SELECT verdict, outcome || ': ' || reason FROM verdicts").fetchall())
    assert verdicts["clear_keeps"].startswith("deployment-worthy: diff_plus_margin_ci_low = 1 > 0")
    outcome, reason = verdicts["undecidable_keeps"].split(": ", 1)
    assert outcome == "inconclusive" and "the cap of 6 games was reached without a decision" in reason
    assert "interval [0.00, 0.00] against a margin of -0.00 after 6 games a runtime in 3 look(s)" in reason
    evidence = json.loads(con.execute("SELECT evidence FROM verdicts WHERE verdict = 'undecidable_keeps'")
                          .fetchone()[0])
    assert evidence["metrics"]["staged_decision"] == "inconclusive" and evidence["metrics"]["staged_games"] == 6
    figures = {k: evidence["metrics"][k] for k in ("paired_diff_median", "paired_diff_iqm", "identical_games_share")}
    assert figures == {"paired_diff_median": 0.0, "paired_diff_iqm": 0.0, "identical_games_share": 1.0}


@pytest.mark.slow
def test_the_json_of_a_games_verdict_carries_its_robust_figures(tmp_path, checkpoint, write_spec):
    from test_json_output import assert_documented

    spec = write_spec(SPEC)
    done = cli("run", str(spec), "--db", str(tmp_path / "r.duckdb"), "--no-report", "--json", cwd=tmp_path)
    assert done.exit_code == 0, (done.output, done.exception)
    document = json.loads(done.stdout)
    assert_documented(document, "run")
    games = {v["verdict"]: v["games"] for v in document["verdicts"]}
    assert games["clear_keeps"] == {"paired_diff_median": 0.0, "paired_diff_iqm": 0.0, "identical_games_share": 1.0,
                                    "fragility": None}


def _verdict(**rules: str) -> VerdictSpec:
    return VerdictSpec(name="v", measurement="m", candidate="c", baseline="b", deployment_worthy_when=rules)


def test_an_undecided_staged_interval_is_inconclusive_and_other_rules_still_decide():
    undecided = {"diff_plus_margin_ci_low": -2.0, "diff_plus_margin_ci_high": 5.0, "latency_p50_ratio_ci_high": 0.9,
                 "latency_p50_ratio_ci_low": 0.8, "undecided_metrics": ("diff_plus_margin_ci_low",),
                 "undecided_reason": "the cap of 400 games was reached without a decision: figures"}
    outcome, reason, _ = decide(_verdict(diff_plus_margin_ci_low="> 0"), undecided)
    assert outcome == "inconclusive" and reason.endswith("the cap of 400 games was reached without a decision: figures")
    outcome, reason, _ = decide(_verdict(diff_plus_margin_ci_low="> 0", latency_p50_ratio_ci_high="< 0.6"), undecided)
    assert outcome == "rejected" and reason.startswith("latency_p50_ratio_ci_high = 0.9")
    decided = {"diff_plus_margin_ci_low": -9.0, "diff_plus_margin_ci_high": -1.0}  # inferior: the whole interval below
    assert decide(_verdict(diff_plus_margin_ci_low="> 0"), decided)[0] == "rejected"


BAD = [
    ("count: 6}\n    batch_size: 2\n    stages: {games: 2, margin: 1.0}",
     "count: 6}\n    batch_size: 2\n    stages: {games: 5, margin: 1.0}", 14,
     "stages: 6 seeds in stages of 5 games are 2 look(s); the staged test plans at least 3"),
    ("stages: {games: 2}", "stages: {games: 1}", 20, "greater than or equal to 2"),
    ("stages: {games: 2}", "stages: {games: 2, margin: -3}", 20, "margin: Input should be greater than 0"),
    ("stages: {games: 2}", "stages: {games: 2, margin_fraction: 0}", 20,
     "margin_fraction: Input should be greater than 0"),
    ("stages: {games: 2}", "stages: {games: 2, margin_fraction: 1.5}", 20,
     "margin_fraction: Input should be less than 1"),
    ("stages: {games: 2}", "stages: {games: 2, margin: 2, margin_fraction: 0.1}", 20,
     "give margin (score points) or margin_fraction (of the baseline's mean), not both"),
    ("stages: {games: 2}", "stages: {games: 2, alpha: 0.5}", 20, "alpha: Input should be less than 0.5"),
    ("stages: {games: 2}", "stages: {games: 2, looks: 3}", 20, "unknown key"),
]


@pytest.mark.parametrize("old,new,line,message", BAD)
def test_bad_stages_name_their_line(checkpoint, write_spec, old, new, line, message):
    assert SPEC.count(old) == 1
    path = write_spec(SPEC.replace(old, new))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert any(p.startswith(f"{path}:{line}: ") and message in p for p in caught.value.problems), caught.value.problems


def test_a_verdict_on_the_bootstrap_interval_of_staged_games_is_refused(checkpoint, write_spec):
    path = write_spec(SPEC.replace("deployment_worthy_when: {diff_plus_margin_ci_low: \"> 0\"}\n"
                                   "  - name: undecidable_keeps",
                                   "deployment_worthy_when: {paired_score_diff_ci_low: \"> -1\"}\n"
                                   "  - name: undecidable_keeps"))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert any("paired_score_diff_ci_low is a bootstrap interval that knows nothing of the looks" in p
               for p in caught.value.problems), caught.value.problems
    plain = write_spec(SPEC.replace("    stages: {games: 2, margin: 1.0}\n", ""), name="plain.yaml")
    with pytest.raises(SpecError) as caught:
        load_spec(plain)
    assert any("diff_plus_margin_ci_low comes from games in stages: give `stages:`" in p for p in caught.value.problems)


def test_bad_stages_through_the_cli_are_one_line_and_exit_2(tmp_path, checkpoint, write_spec):
    spec = write_spec(SPEC.replace("stages: {games: 2}", "stages: {games: 2, margin: -3}"))
    done = runner("run", str(spec), "--db", str(tmp_path / "r.duckdb"), "--no-report", cwd=tmp_path)
    assert_one_line_usage_error(done, f"{spec}:20:", "margin: Input should be greater than 0")
    assert not (tmp_path / "r.duckdb").exists()


def test_fewer_looks_than_allowed_through_the_cli_are_one_line_and_exit_2(tmp_path, checkpoint, write_spec):
    spec = write_spec(SPEC.replace("stages: {games: 2}", "stages: {games: 4}"))
    done = runner("run", str(spec), "--db", str(tmp_path / "r.duckdb"), "--no-report", cwd=tmp_path)
    assert_one_line_usage_error(done, f"{spec}:20:", "6 seeds in stages of 4 games are 2 look(s)")
    assert not (tmp_path / "r.duckdb").exists()


def test_staged_seeds_that_a_calibration_also_plays_are_refused(write_spec):
    """Calibration games must be none of the games the spec judges by, staged or not."""
    reference = REPO / "models" / "reference"
    text = f"""\
name: overlap
artifacts:
  checkpoint: {{path: {reference / "dqn_breakout.pt"}}}
  onnx_fp32: {{path: {reference / "dqn_breakout.onnx"}}}
  fixed_states: {{path: {reference / "fixed_states_60.npz"}}}
  onnx_int8: {{path: out/int8.onnx, made_by: overlap, precision: int8}}
runtimes:
  ort_fp32: {{runtime: onnxruntime, intra_op_threads: 1, artifact: onnx_fp32}}
  ort_int8: {{runtime: onnxruntime, intra_op_threads: 1, artifact: onnx_int8}}
measurements:
  - kind: repair
    name: int8
    source: onnx_fp32
    checkpoint: checkpoint
    check_states: fixed_states
    output: onnx_int8
    calibration:
      n_states: 16
      capture: {{episode_seeds: {{start: 3950, count: 4}}, batch_size: 4}}
  - kind: episodes
    name: games
    runtimes: [ort_fp32, ort_int8]
    seeds: {{start: 3900, count: 150}}
    stages: {{games: 50}}
"""
    path = write_spec(text)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert any(p.startswith(f"{path}:19: ") and "the spec plays: measurement 'games' (seeds) plays 3950, 3951, 3952, "
               "3953" in p for p in caught.value.problems), caught.value.problems


@pytest.mark.slow
def test_a_staged_run_killed_midway_resumes_without_a_game_or_a_look_twice(tmp_path, checkpoint):
    """Killed (SIGKILL) at the middle database event of an uninterrupted run, then resumed: the
    same games and looks as that run, none stored twice. The runs are children of one
    tests/kill_at.py (a `runner` CLI in a process of its own each, killed with SIGKILL just
    before the n-th event of a class where asked), asked one request at a time."""
    folders = {name: tmp_path / name for name in ("whole", "killed")}
    for folder in folders.values():
        folder.mkdir()
        (folder / "spec.yaml").write_text(SPEC.replace("{path: model.pt}", "{path: ../model.pt}"))
    args = ["run", "spec.yaml", "--db", "r.duckdb", "--no-report"]
    events = tmp_path / "events.txt"
    with KillServer(900) as server:
        whole = server.ask(folders["whole"], args, log=events)
        assert whole["returncode"] == 0, whole["stderr"]
        middle = events.read_text().split().count("database") // 2
        killed = server.ask(folders["killed"], args, kill=["database", middle])
        resumed = server.ask(folders["killed"], [*args, "--resume"])
    assert killed["returncode"] == -9 and resumed["returncode"] == 0, resumed["stderr"]

    def stored(folder: Path) -> tuple[list, list]:
        con = duckdb.connect(str(folder / "r.duckdb"), read_only=True)
        games = con.execute("SELECT measurement, policy, seed, score, steps FROM episodes ORDER BY ALL").fetchall()
        looks = con.execute("SELECT measurement, candidate, stage, games, mean_diff, ci_low, ci_high, margin, decision "
                            "FROM episode_looks ORDER BY ALL").fetchall()
        return games, looks

    assert stored(folders["killed"]) == stored(folders["whole"])


def _staged_found(tmp_path, baseline: list[tuple[float, int]], candidate: list[tuple[float, int]],
                  plan_games: int, margin: float, contract: str = "breakout-v3") -> tuple[dict, object]:
    """The episodes kind's metrics over stored games ((score, steps) per seed, both sides) played
    under the named contract, and the last look the staged test took of them; (metrics, that look)."""
    import numpy as np

    from breakout_core.game.contract import CONTRACTS
    from breakout_core.statistics.sequential import SequentialPlan, SequentialTest
    from runner.kinds.episodes import EpisodesMeasurement, metrics
    from runner.store.database import Store

    count = len(baseline)
    diffs = np.array([c[0] - b[0] for c, b in zip(candidate, baseline)])
    test = SequentialTest(SequentialPlan(margin=margin, stage_games=plan_games, max_games=count))
    for start in range(0, count, plan_games):
        if not test.looks or test.looks[-1].decision == "continue":
            test.add(diffs[start:start + plan_games])
    look = test.looks[-1]
    tmp_path.mkdir(parents=True, exist_ok=True)
    store = Store(tmp_path / "r.duckdb")
    store.begin_run({"run_id": "r1", "spec_name": "s", "spec_hash": "h", "spec_text": "name: s", "host": "h",
                     "contract_hash": CONTRACTS[contract].hash, "contract": json.dumps(CONTRACTS[contract].to_dict())})
    game = {"run_id": "r1", "measurement": "games", "frames": 4, "ended_by": "game_over", "action_noop": 0,
            "action_fire": 0, "action_right": 0, "action_left": 0, "wall_s": 0.1, "contract_hash": "c"}
    store.append_rows("episodes", [{**game, "policy": policy, "seed": i, "score": score, "steps": steps}
                                   for policy, games in (("b", baseline), ("c", candidate))
                                   for i, (score, steps) in enumerate(games[:look.n])])
    store.append_rows("episode_looks", [{
        "run_id": "r1", "measurement": "games", "candidate": "c", "baseline": "b", "stage": look.stage,
        "games": look.n, "max_games": count, "planned_looks": -(-count // plan_games),
        "candidate_mean": 100 + look.mean, "baseline_mean": 100.0, "mean_diff": look.mean, "sd_diff": look.sd,
        "ci_low": look.low, "ci_high": look.high, "confidence": look.confidence, "margin": look.margin,
        "decision": look.decision}])
    m = EpisodesMeasurement.model_validate({"kind": "episodes", "name": "games", "runtimes": ["b", "c"],
                                            "seeds": {"start": 0, "count": count},
                                            "stages": {"games": plan_games, "margin": margin}})
    with store.reader() as con:
        return metrics(con, "r1", m, "c", "b"), look


def test_a_decision_one_game_carries_says_so_in_its_reason(tmp_path):
    """Stored games whose last look is non-inferior only thanks to three big games: the
    verdict's reason names them, and its evidence holds the robust figures."""
    import numpy as np

    bulk = np.random.default_rng(4).normal(0, 1, 97)
    diffs = np.concatenate([(bulk - bulk.mean()) / bulk.std(ddof=1) * 15 - 5.25, [90.0, 95.0, 100.0]])
    found, look = _staged_found(tmp_path, [(100.0, 1)] * 100, [(100.0 + d, 1) for d in diffs], 40, 8.0)
    outcome, reason, evidence = decide(_verdict(diff_plus_margin_ci_low="> 0"), found)
    assert outcome == "deployment-worthy" and look.decision == "non-inferior"
    assert reason.endswith("fragile: removing any one of 3 of the 100 games alone would change non-inferior: seed 97 "
                           "(+90) -> inconclusive, seed 98 (+95) -> inconclusive, seed 99 (+100) -> inconclusive")
    assert evidence["metrics"]["identical_games_share"] == 0.0
    assert evidence["metrics"]["paired_diff_median"] == pytest.approx(float(np.median(diffs)))


def test_games_that_replay_a_few_games_decide_nothing(tmp_path):
    """Under a contract whose games are deterministic from their start, 50 seeds may replay 4
    games: the test's non-inferior rests on 4 distinct games, fewer than a stage of 50, and the
    verdict is inconclusive and says so; the same scores as 50 different games decide, and so do
    the same 4 games under sticky actions, where every seed's game is its own."""
    played = [(score, 900 + score) for score in (47.0, 58.0, 212.0, 126.0)] * 38
    replayed, look = _staged_found(tmp_path / "few", played[:150], played[:150], 50, 8.0, "deepmind-noframeskip-v4")
    assert look.decision == "non-inferior" and replayed["distinct_paired_games"] == 4
    outcome, reason, _ = decide(_verdict(diff_plus_margin_ci_low="> 0"), replayed)
    assert outcome == "inconclusive"
    assert "the 50 games a runtime are only 4 distinct games" in reason and "fewer than a stage of 50" in reason
    different = [(score, steps + i) for i, (score, steps) in enumerate(played[:150])]
    found, _ = _staged_found(tmp_path / "many", different, different, 50, 8.0, "deepmind-noframeskip-v4")
    assert decide(_verdict(diff_plus_margin_ci_low="> 0"), found)[0] == "deployment-worthy"
    sticky, _ = _staged_found(tmp_path / "sticky", played[:150], played[:150], 50, 8.0, "breakout-v3")
    assert decide(_verdict(diff_plus_margin_ci_low="> 0"), sticky)[0] == "deployment-worthy"


UNAVAILABLE_SPEC = f"""\
name: staged_unavailable
contract: {{max_episode_frames: 240, other_contracts: deliberate}}
artifacts:
  fp32: {{path: {REPO / "models" / "reference" / "dqn_breakout.onnx"}, precision: fp32}}
runtimes:
  ort: {{runtime: onnxruntime, provider: cpu, artifact: fp32}}
  ort_b: {{runtime: onnxruntime, provider: cpu, artifact: fp32}}
  trt: {{runtime: tensorrt, precision: fp32, artifact: fp32}}
measurements:
  - kind: episodes
    name: games
    runtimes: [ort, {{runtimes}}]
    seeds: {{start: 10, count: 6}}
    batch_size: 2
    stages: {{games: 2}}
verdicts:
  - name: trt_keeps
    measurement: games
    candidate: trt
    baseline: ort
    deployment_worthy_when: {{diff_plus_margin_ci_low: "> 0"}}
"""


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed here")
@pytest.mark.parametrize("others", [["trt"], ["trt", "ort_b"]], ids=["alone", "beside-another"])
def test_a_candidate_unavailable_here_plays_no_game_and_the_others_go_on(tmp_path, write_spec, others):
    """Every runtime is opened before a game is played: an unavailable candidate plays nothing, and
    no game is played at all where no candidate can be judged."""
    spec = write_spec(UNAVAILABLE_SPEC.replace("{runtimes}", ", ".join(others)))
    done = cli("run", str(spec), "--db", "r.duckdb", "--no-report", cwd=tmp_path)
    assert done.exit_code == 0, (done.output, done.exception)
    assert "verdict trt_keeps: unavailable — runtime trt (tensorrt) unavailable here" in done.output
    with duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True) as con:
        played = dict(con.execute("SELECT policy, count(*) FROM episodes GROUP BY policy").fetchall())
        looks = {c for (c,) in con.execute("SELECT DISTINCT candidate FROM episode_looks").fetchall()}
    assert "trt" not in played and "trt" not in looks
    assert played == ({} if others == ["trt"] else {"ort": 2, "ort_b": 2})  # the same file: non-inferior at once


# SPEC less its `clear` measurement and verdict: three stages, each a play of both runtimes and a look
KILLED_SPEC = SPEC
for first, next_one in (("  - kind: episodes\n    name: clear", "  - kind: episodes\n    name: undecidable"),
                        ("  - name: clear_keeps", "  - name: undecidable_keeps")):
    KILLED_SPEC = KILLED_SPEC.replace(SPEC[SPEC.index(first):SPEC.index(next_one)], "")

# what differs between two runs that stored the same things: ids, clocks, and times measured
UNCOMPARED = {"run_id", "started_at", "ended_at", "heartbeat_at", "decided_at", "recorded_at", "pid", "wall_s",
              "episodes_per_minute", "ms", "load_s", "evidence", "error"}


def _rows(db: Path) -> dict[str, list]:
    """Every table's rows, less the UNCOMPARED columns, in order."""
    with duckdb.connect(str(db), read_only=True) as con:
        tables = [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables() WHERE table_name NOT IN "
                                            "('schema_migrations', 'spooled_batches') ORDER BY 1").fetchall()]
        found = {}
        for table in tables:
            columns = [c for (c,) in con.execute("SELECT column_name FROM duckdb_columns() WHERE table_name = ? "
                                                 "ORDER BY column_index", [table]).fetchall() if c not in UNCOMPARED]
            found[table] = con.execute(f"SELECT {', '.join(f'{c!r}'.replace(chr(39), chr(34)) for c in columns)} "
                                       f"FROM {table} ORDER BY ALL").fetchall()
        return found


@pytest.mark.slow
@pytest.mark.parametrize("half", [0, 1], ids=["even-points", "odd-points"])  # two halves the two workers share
def test_a_staged_run_killed_at_any_write_then_resumed_stores_what_an_uninterrupted_one_does(tmp_path, checkpoint,
                                                                                              half):
    """Killed (SIGKILL) at each opening of the database for writing of an uninterrupted staged
    run, then resumed: every table holds the same rows as that run's (ids, clocks and measured
    times aside), so no stage's games, inference counts, call times or baseline marks are lost
    or stored twice."""
    args = ["run", "spec.yaml", "--db", "r.duckdb", "--no-report"]
    events = tmp_path / "events.txt"

    def ask(folder: Path, extra: list[str], log: Path | None = None, kill: list | None = None) -> dict:
        folder.mkdir(exist_ok=True)
        (folder / "spec.yaml").write_text(KILLED_SPEC.replace("{path: model.pt}", "{path: ../model.pt}"))
        return server.ask(folder, [*args, *extra], log=log, kill=kill)

    with KillServer(3000) as server:
        whole = ask(tmp_path / "whole", [], log=events)
        assert whole["returncode"] == 0, whole["stderr"]
        log = events.read_text().splitlines()
        opened = [line for line in log if line.startswith("database")]
        writes = [n for n, line in enumerate(opened, start=1) if line == "database"]  # a reader writes nothing
        assert len(writes) >= 8, log
        expected = _rows(tmp_path / "whole" / "r.duckdb")
        assert len(expected["episode_inference_calls"]) > 0 and len(expected["baseline_games"]) == 6
        ended = []
        for n in writes[half::2]:
            folder = tmp_path / f"killed-{n}"
            killed = ask(folder, [], kill=["database", n])
            if killed["returncode"] == 0:  # past its end: the whole run's heartbeat wrote once more than its own
                ended.append(n)
                continue
            assert killed["returncode"] == -9, (n, killed["stderr"])
            resumed = ask(folder, ["--resume"])
            if n == writes[0] and resumed["returncode"] == 2:  # killed before its run row was stored
                resumed = ask(folder, [])
            assert resumed["returncode"] == 0, (n, resumed["stderr"])
            got = _rows(folder / "r.duckdb")
            for table, rows in expected.items():
                assert got[table] == rows, (n, table, len(got[table]), len(rows))
        assert len(ended) <= 2 and all(n > writes[-3] for n in ended), ended
