"""Checking your own model: `--set` on a spec, `runner check MODEL.onnx`, `runner specs`."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from perturbed_onnx import perturbed_onnx
from small_check import SMALL_CHECK, set_args
from test_cli_inputs import assert_one_line_usage_error, cli
from test_end_to_end import runner

from runner.spec.document import load_spec
from runner.spec.yaml_source import read_spec_text
from runner.store.database import Store

REPO = Path(__file__).resolve().parents[1]
DAY24 = REPO / "specs" / "day24_ort_latency.yaml"
FP16_ONNX = REPO / "models" / "reference" / "dqn_breakout_fp16.onnx"


def test_set_a_mapping_key_and_one_the_file_leaves_to_its_default():
    written = DAY24.read_text(encoding="utf-8")
    given = ("runtimes.ort_cpu.intra_op_threads=2", "runtimes.ort_cpu.graph_optimization_level=basic")
    loaded = load_spec(DAY24, overrides=given)
    assert loaded.spec.runtimes["ort_cpu"].intra_op_threads == 2
    assert loaded.spec.runtimes["ort_cpu"].graph_optimization_level == "basic"
    assert loaded.overrides == given
    assert read_spec_text(loaded.text)["runtimes"]["ort_cpu"]["intra_op_threads"] == 2  # what a run stores
    assert "--set \"runtimes.ort_cpu.intra_op_threads=2\"" in loaded.text.splitlines()[1]
    assert loaded.hash != load_spec(DAY24).hash  # --resume matches the overridden text, not the file's
    assert DAY24.read_text(encoding="utf-8") == written


def test_set_a_list_item_by_index_or_by_its_name():
    rule = 'deployment_worthy_when={latency_p50_ratio_ci_high: "<= 1.1"}'
    by_index = load_spec(DAY24, overrides=(f"verdicts.0.{rule}", "measurements.0.warmup=4"))
    by_name = load_spec(DAY24, overrides=(f"verdicts.ort_cpu_faster_than_torch_cpu.{rule}",
                                          "measurements.day24_latency.warmup=4"))
    assert by_index.spec == by_name.spec
    assert dict(by_index.spec.verdicts[0].deployment_worthy_when) == {"latency_p50_ratio_ci_high": "<= 1.1"}
    assert by_index.spec.measurements[0].warmup == 4
    assert by_index.spec.verdicts[1] == load_spec(DAY24).spec.verdicts[1]


def test_set_values_are_read_as_yaml():
    loaded = load_spec(DAY24, overrides=("measurements.day24_latency.batch_sizes=[1, 4]",
                                         "measurements.day24_latency.warmup=20", "description='010'"))
    assert loaded.spec.measurements[0].batch_sizes == [1, 4] and loaded.spec.measurements[0].warmup == 20
    assert loaded.spec.description == "010"  # quoted: text, not YAML 1.1's octal 8


@pytest.mark.parametrize("given, mention", [
    ("verdicts.7.candidate=ort_cpu", "verdicts has 2 item(s) (0 to 1); no item 7"),
    ("verdicts.fastest.candidate=ort_cpu", "verdicts has no item named 'fastest'"),
    ("runtimes.ort_gpu.provider=cpu", "runtimes has no key 'ort_gpu'"),
    ("name.first=x", "name is a value"),
    ("measurements.0.iterations", "expected PATH=VALUE"),
    ("description=[1, 2", "invalid YAML"),
], ids=["index-out-of-range", "no-such-name", "no-such-key", "below-a-value", "no-value", "bad-yaml"])
def test_a_bad_path_is_one_line_naming_the_argument(tmp_path, given, mention):
    result = cli("validate", str(DAY24), "--set", given, cwd=tmp_path)
    assert_one_line_usage_error(result, f"day24_ort_latency.yaml: --set {given}: ", mention)


@pytest.mark.parametrize("given, mention", [
    ("measurements.0.iterations=many", "measurements[0].iterations: Input should be a valid integer"),
    ("verdicts.0.candidate=nobody", "verdicts[0].candidate: 'nobody' is not in measurement 'day24_latency'"),
    ("runtimes.ort_cpu={runtime: onnxruntime, artifact: onnx_fp32, thread: 2}", "runtimes.ort_cpu.thread: unknown key"),
], ids=["type", "reference", "unknown-key-below"])
def test_a_bad_value_is_a_validation_error_naming_the_argument(tmp_path, given, mention):
    result = cli("validate", str(DAY24), "--set", given, cwd=tmp_path)
    assert_one_line_usage_error(result, f"day24_ort_latency.yaml: --set {given}: {mention}")


def test_an_error_about_a_part_holding_an_override_names_the_line_and_the_override(tmp_path):
    result = cli("validate", str(DAY24), "--set", "measurements.0.batch_sizes=[0]", cwd=tmp_path)
    assert_one_line_usage_error(result, "day24_ort_latency.yaml:17 (with --set measurements.0.batch_sizes=[0]): "
                                        "measurements[0]: batch_sizes must be distinct, each 1..4096")


def test_run_with_a_bad_override_stores_nothing(tmp_path):
    result = cli("run", str(DAY24), "--set", "verdicts.9.name=x", "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, "--set verdicts.9.name=x")
    assert list(tmp_path.iterdir()) == []


def test_validate_resolved_prints_the_overridden_document(tmp_path):
    result = runner("validate", "--resolved", str(DAY24), "--set", "measurements.day24_latency.warmup=4", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == load_spec(DAY24, overrides=("measurements.day24_latency.warmup=4",)).text
    assert read_spec_text(result.stdout)["measurements"][0]["warmup"] == 4


QUESTION = """\
name: own_question
policies:
  first: {type: random}
  second: {type: random}
measurements:
  - kind: evaluate
    name: games
    policies: [first, second]
    seeds: [1]
verdicts:
  - name: scores
    measurement: games
    candidate: second
    baseline: first
    deployment_worthy_when:
      candidate_mean_score: ">= 0"
"""


def test_a_run_stores_its_overrides_and_its_verdicts_stand_apart(tmp_path, write_spec):
    spec = write_spec(QUESTION)
    other_seed = "measurements.games.seeds=[2]"

    def run(*overrides: str) -> str:
        done = cli("run", str(spec), *[arg for o in overrides for arg in ("--set", o)], "--db", "r.duckdb",
                   "--no-report", cwd=tmp_path)
        assert done.exit_code == 0, (done.output, done.exception)
        return done.stdout.split()[1]

    plain, overridden, again = run(), run(other_seed), run(other_seed)
    with duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True) as con:
        stored = dict(con.execute("SELECT run_id, overrides FROM runs").fetchall())
        text = con.execute("SELECT spec_text FROM runs WHERE run_id = ?", [overridden]).fetchone()[0]
        seeds = dict(con.execute("SELECT run_id, min(seed) FROM episodes GROUP BY run_id").fetchall())
    assert stored[plain] is None and json.loads(stored[overridden]) == [other_seed]
    assert read_spec_text(text)["measurements"][0]["seeds"] == [2] and seeds == {plain: 1, overridden: 2, again: 2}
    with Store(tmp_path / "r.duckdb").reader() as con:
        latest = con.execute("SELECT run_id, overrides FROM latest_verdicts ORDER BY run_id").fetchall()
    assert latest == [(plain, None), (again, stored[overridden])]  # the file's question and the other one
    shown = cli("report", "--verdicts", "--db", "r.duckdb", cwd=tmp_path)
    assert shown.exit_code == 0, shown.output
    assert f"own_question --set {other_seed}" in shown.stdout


def test_specs_lists_what_each_shipped_spec_asks_and_needs(tmp_path):
    db = tmp_path / "r.duckdb"
    store = Store(db)
    store.begin_run({"run_id": "r1", "spec_name": "quickstart", "spec_hash": "h", "spec_text": "name: quickstart",
                     "host": "h"})
    store.finish_run("r1", "done")
    before = db.read_bytes()
    listed = runner("specs", "--db", str(db), cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = {line.split("│")[1].strip(): line for line in listed.stdout.splitlines() if line.count("│") > 2}
    assert "_reference_deploy" not in rows and "day24_ort_latency" in rows and "check_onnx" in rows
    assert "GPU for 2 of 4 runtimes" in rows["day23_ort_parity"] and "CPU only" in rows["check_onnx"]
    assert "browser" in rows["day27_browser_wasm"] and "parity, latency, closed_loop, episodes" in rows["check_onnx"]
    assert "(done)" in rows["quickstart"] and "(done)" not in rows["day24_ort_latency"]
    assert db.read_bytes() == before  # opened read-only
    without = runner("specs", "--db", str(tmp_path / "none.duckdb"), cwd=tmp_path)
    assert without.returncode == 0 and "no database at" in without.stdout
    assert not (tmp_path / "none.duckdb").exists()


@pytest.mark.parametrize("name, content, mention", [
    ("missing.onnx", None, "MODEL missing.onnx: no such file"),
    ("notes.onnx", b"not a model\n", "MODEL notes.onnx: not an ONNX model"),
    ("empty.onnx", b"", "MODEL empty.onnx: the file is empty"),
])
def test_check_refuses_what_is_not_an_onnx_model(tmp_path, name, content, mention):
    if content is not None:
        (tmp_path / name).write_bytes(content)
    result = cli("check", name, "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, mention)
    assert result.stdout == ""  # the check's first line waits until its files passed
    assert not (tmp_path / "r.duckdb").exists()


def test_check_refuses_a_model_that_does_not_take_the_agents_observations(tmp_path):
    from tiny_onnx import tiny_model

    tiny_model(tmp_path / "tiny.onnx")  # uint8 (B, 4, 12, 12) in
    result = cli("check", "tiny.onnx", "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, "MODEL tiny.onnx: the agent's model takes one input (B, 4, 84, 84)",
                                "this one has obs: uint8 ('batch', 4, 12, 12)")
    assert not (tmp_path / "r.duckdb").exists()


def test_check_refuses_a_baseline_that_is_not_a_file(tmp_path):
    result = cli("check", str(FP16_ONNX), "--baseline", str(tmp_path), "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, f"--baseline {tmp_path}: not a file")


@pytest.mark.parametrize("override, mention", [
    ("measurements.games.seeds={start: 3000, count: 100}",
     "measurements[3].stages: 100 seeds in stages of 50 games are 2 look(s); the staged test plans at least 3"),
    ("measurements.games.stages.margin_fraction=1.2", "measurements[3].stages.margin_fraction: Input should be less "
     "than 1"),
    ("measurements.games.stages.margin_fraction=0", "measurements[3].stages.margin_fraction: Input should be greater "
     "than 0"),
])
def test_check_refuses_a_games_plan_the_staged_test_cannot_keep(tmp_path, override, mention):
    result = cli("check", str(FP16_ONNX), "--set", override, "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, "specs/check_onnx.yaml", mention)
    assert not (tmp_path / "r.duckdb").exists()


@pytest.mark.parametrize("override, mention", [
    ("contract.noop_start_max=-1", "contract.noop_start_max: Input should be greater than or equal to 0"),
    ("contract.name=pong", "contract.name: unknown contract 'pong'"),
], ids=["contract-option", "contract-name"])
@pytest.mark.parametrize("command", ["check", "convert"])
def test_a_bad_set_is_refused_before_any_file_is_read_or_game_played(tmp_path, command, override, mention):
    """With a baseline of the user's own, the fixed states would be captured from its games first:
    the --set arguments are checked before that, and nothing is captured or stored."""
    fp32 = str(REPO / "models" / "reference" / "dqn_breakout.onnx")
    args = (["check", fp32, "--baseline", str(FP16_ONNX)] if command == "check"  # not the spec's own baseline
            else ["convert", "fp16", fp32, "--out", "out.onnx"])
    result = cli(*args, "--set", override, "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, f"specs/{'check_onnx' if command == 'check' else 'convert_fp16'}.yaml",
                                mention)
    assert result.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_bad_games_plan_is_refused_before_the_baselines_states_are_captured(tmp_path):
    fp32 = str(REPO / "models" / "reference" / "dqn_breakout.onnx")
    result = cli("check", fp32, "--baseline", str(FP16_ONNX), "--set", "measurements.games.stages.margin_fraction=2",
                 "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, "specs/check_onnx.yaml",
                                "measurements[3].stages.margin_fraction: Input should be less than 1")
    assert result.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == []  # no runs/baseline_states


@pytest.mark.parametrize("command, override, mention", [
    ("check", "artifacts.candidate.path=/nowhere/mine.onnx", "/nowhere/mine.onnx: no such file"),
    ("check", "artifacts.fixed_states.path=/nowhere/states.npz", "/nowhere/states.npz: no such file"),
    ("check", "artifacts.candidate.path={full18}", "{full18}: it gives 18 Q-values, ALE's full action space"),
    ("convert", "artifacts.onnx_fp32.path=/nowhere/mine.onnx", "/nowhere/mine.onnx: no such file"),
], ids=["missing-model", "missing-states", "width", "convert-missing-source"])
def test_a_file_a_set_names_is_checked_before_any_game(tmp_path, command, override, mention):
    """As MODEL is: with a --baseline of the user's own, its fixed states would be captured first."""
    from user_exports import cleanrl_onnx

    fp32 = str(REPO / "models" / "reference" / "dqn_breakout.onnx")
    full18 = cleanrl_onnx(tmp_path / "full18.onnx", actions=18)
    override, mention = override.format(full18=full18), mention.format(full18=full18)
    args = (["check", fp32, "--baseline", str(FP16_ONNX)] if command == "check"
            else ["convert", "fp16", fp32, "--out", "out.onnx"])
    result = cli(*args, "--set", override, "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, f"--set {override}: {mention}")
    assert result.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["full18.onnx"]


def test_check_refuses_a_contract_given_by_the_option_and_a_set_alike(tmp_path):
    result = cli("check", str(FP16_ONNX), "--contract", "breakout-v3", "--set", "contract.name=breakout-v2",
                 "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, "--contract and --set contract.name=breakout-v2 both say contract.name")
    assert result.stdout == "" and list(tmp_path.iterdir()) == []


TENSORRT_FP32 = "runtimes.{}={{runtime: tensorrt, precision: fp32, artifact: {}}}"


def test_the_set_arguments_are_judged_with_the_users_files_in_the_spec(tmp_path):
    """A TensorRT FP32 runtime needs an FP32 file: MODEL, an FP32 file, passes where the spec's own
    FP16 candidate would not, so the one problem said is the real one; an FP16 --baseline under it
    is refused before its fixed states are captured."""
    fp32 = str(REPO / "models" / "reference" / "dqn_breakout.onnx")
    result = cli("check", fp32, "--set", TENSORRT_FP32.format("candidate", "candidate"), "--set",
                 "measurements.games.stages.margin_fraction=2", "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, "measurements[3].stages.margin_fraction: Input should be less than 1")
    result = cli("check", fp32, "--baseline", str(FP16_ONNX), "--set", TENSORRT_FP32.format("baseline", "baseline"),
                 "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, "an fp32 TensorRT engine needs an fp32 ONNX file", "dqn_breakout_fp16.onnx")
    assert result.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == []


@pytest.mark.slow
def test_check_rejects_a_model_whose_decisions_changed(tmp_path):
    model = perturbed_onnx(tmp_path / "perturbed.onnx")
    result = cli("check", "perturbed.onnx", *set_args(*SMALL_CHECK), "--db", "r.duckdb",
                 cwd=tmp_path)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (result.output, result.exception)
    assert "verdict same_decisions: rejected" in result.stdout
    assert "check failed:" in result.stdout.splitlines()[-1]
    assert result.stdout.splitlines()[-1].endswith(f"; modified gate: {' '.join(set_args(*SMALL_CHECK))})")
    with Store(tmp_path / "r.duckdb").reader() as con:
        overrides, text = con.execute("SELECT overrides, spec_text FROM runs").fetchone()
        outcomes = dict(con.execute("SELECT verdict, outcome FROM latest_verdicts").fetchall())
    candidate = json.dumps({"path": str(model.resolve()), "precision": "fp32"})
    assert json.loads(overrides) == [f"artifacts.candidate={candidate}", *SMALL_CHECK]
    assert read_spec_text(text)["artifacts"]["candidate"] == {"path": str(model.resolve()), "precision": "fp32"}
    assert outcomes["same_decisions"] == "rejected" and len(outcomes) == 5


def test_check_fail_fast_stops_at_the_first_rejected_gating_verdict(tmp_path):
    """The shipped gate, --fail-fast: a file whose decisions changed is asked whether it is
    identical, its parity (the cheapest gating measurement, first) rejects it, and nothing after
    it runs: no latency round, no closed loop, no game; the verdicts not reached are said."""
    perturbed_onnx(tmp_path / "perturbed.onnx")
    result = cli("check", "perturbed.onnx", "--fail-fast", "--db", "r.duckdb", "--reports", "reports", cwd=tmp_path)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (result.output, result.exception)
    assert "--fail-fast: verdict same_decisions is rejected; the run stops here" in result.stderr
    assert ("not reached (--fail-fast): not_slower_at_batch_1, plays_the_same_256_steps, keeps_the_score, "
            "no_more_stalls") in result.stdout
    assert result.stdout.splitlines()[-1].startswith("check failed: 1 rejected (identical; perturbed.onnx)")
    assert "of 60 fixed states take the same action" in result.stdout  # said in words, beside the rule
    with Store(tmp_path / "r.duckdb").reader() as con:
        assert con.execute("SELECT verdict, outcome FROM verdicts").fetchall() == [("same_decisions", "rejected")]
        assert con.execute("SELECT status FROM runs").fetchall() == [("done",)]
        for table in ("episodes", "closed_loop_steps", "latency_samples"):
            found = con.execute("SELECT count(*) FROM information_schema.tables WHERE table_name = ?",
                                [table]).fetchone()[0]
            assert not found or con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table


def test_fail_fast_runs_the_measurements_gating_verdicts_read_first_unless_the_spec_writes_files():
    from runner.run.fail_fast import FailFast

    spec = load_spec(REPO / "specs" / "check_onnx.yaml", check_files=False).spec
    as_good = FailFast(frozenset({"not_slower_at_batch_1", "keeps_the_score", "no_more_stalls"}))
    assert [m.name for m in as_good.order(spec, writes_files=False)] == ["latency", "games", "parity", "closed_loop"]
    assert [m.name for m in as_good.order(spec, writes_files=True)] == ["parity", "latency", "closed_loop", "games"]


def test_a_second_confirmation_of_the_same_content_is_refused_unless_confirm_again(tmp_path):
    """The ledger: a model whose content this database confirmed is refused a second --confirm in
    one line, before any game (a re-save with other bytes is the same content); --confirm-again
    goes on, says which check it is, and is recorded as such."""
    import onnx

    from breakout_core.conversion.model_content import model_content_sha256
    from runner.run.check_attempts import record_attempt

    model = perturbed_onnx(tmp_path / "perturbed.onnx")
    graph = onnx.load(str(model))
    for i, node in enumerate(graph.graph.node):
        node.name = f"renamed_{i}"
    onnx.save(graph, str(tmp_path / "resaved.onnx"))  # other bytes, the same content
    assert (tmp_path / "resaved.onnx").read_bytes() != model.read_bytes()
    content = model_content_sha256(model)
    record_attempt(Store(tmp_path / "r.duckdb"), content=content, run_id="20261201-000000-aaaaaa",
                   question="identical", confirm=True, confirm_again=False, modified_gate=[], passed=False)
    result = cli("check", "resaved.onnx", "--confirm", "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, f"--confirm: this database confirmed MODEL resaved.onnx's content "
                                        f"({content[:12]}) before")
    assert "--confirm-again" in result.stderr
    result = cli("check", "resaved.onnx", "--confirm-again", "--fail-fast", "--db", "r.duckdb", "--reports",
                 "reports", cwd=tmp_path)
    assert result.exit_code == 1, (result.output, result.exception)
    assert f"check 2 of this model (content {content[:12]}) in this database: its games are the same drawn seeds " \
           "each time" in result.stdout
    assert "chance up to 4.9%, not 2.5%" in result.stdout
    with Store(tmp_path / "r.duckdb").reader() as con:
        rows = con.execute("SELECT model_content, confirm, confirm_again, passed FROM check_attempts "
                           "ORDER BY checked_at").fetchall()
    assert rows == [(content, True, False, False), (content, False, True, False)]  # stopped before its games


def test_a_check_on_a_database_an_older_runner_wrote_upgrades_it_and_goes_on(tmp_path):
    """A check reads its ledger and its games' rate before its run writes: from a file an older
    runner wrote (without the ledger) it upgrades the file first, as its run would, not refuse it."""
    perturbed_onnx(tmp_path / "perturbed.onnx")
    with Store(tmp_path / "r.duckdb").writer() as con:
        con.execute("DROP TABLE check_attempts")
        con.execute("DELETE FROM schema_migrations WHERE name = '0700_check_attempts'")
    result = cli("check", "perturbed.onnx", "--fail-fast", "--db", "r.duckdb", cwd=tmp_path)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), (result.output, result.exception)
    assert "check 1 of this model" in result.stdout
    with Store(tmp_path / "r.duckdb").reader() as con:
        assert con.execute("SELECT count(*) FROM check_attempts").fetchone()[0] == 1
