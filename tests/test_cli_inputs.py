"""Malformed input through the CLI: one line naming what is wrong, exit 2, no traceback,
and nothing written anywhere. The commands run in this process through click's CliRunner; one
test runs a real process, to see that its exit status and its stderr are the same."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from test_end_to_end import cli, runner

from runner.cli.commands import main
from runner.store.database import Store


def assert_one_line_usage_error(result: Result | subprocess.CompletedProcess, *mentions: str) -> None:
    """Exit 2 and one `error: ...` line naming each of `mentions`, from `runner` run in this process
    (CliRunner) or as a real process."""
    if isinstance(result, subprocess.CompletedProcess):
        assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    else:
        assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
        # the command ended by exiting, not by an exception it let through (a traceback in a real process)
        assert isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for mention in mentions:
        assert mention in lines[0], (mention, lines[0])


@pytest.fixture
def db(tmp_path: Path) -> Path:
    path = tmp_path / "r.duckdb"
    Store(path).begin_run({"run_id": "r1", "spec_name": "s", "spec_hash": "h", "spec_text": "name: s", "host": "h"})
    return path


@pytest.mark.parametrize("query", ["", "  ;  ", "/* only a comment */"])
def test_sql_without_a_statement(tmp_path, db, query):
    assert_one_line_usage_error(cli("sql", query, "--db", str(db), cwd=tmp_path), "SQL")


@pytest.mark.parametrize("query", [
    "COPY (SELECT * FROM runs) TO 'out.csv'",
    "EXPORT DATABASE 'out'",
    "ATTACH 'out.duckdb' AS other",
    "SELECT * FROM read_csv('/etc/hostname')",
])
def test_sql_touches_no_file_but_the_database(tmp_path, db, query):
    before = sorted(p.name for p in tmp_path.iterdir())
    assert_one_line_usage_error(cli("sql", query, "--db", str(db), cwd=tmp_path), "SQL")
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert cli("sql", "SELECT count(*) FROM runs", "--db", str(db), cwd=tmp_path).exit_code == 0


EVALUATE = """\
name: hostile
policies:
  random: {type: random}
measurements:
  - kind: evaluate
    name: m
    policies: [random]
    seeds: [1]
"""


@pytest.mark.parametrize("text, mentions", [
    ("name: a\x07b\n" + EVALUATE[14:], ":1: invalid YAML: character U+0007"),
    ("name: a\x00b\n" + EVALUATE[14:], ":1: invalid YAML: character U+0000"),
    ("? [a, b]\n: c\n" + EVALUATE, "a key must be a plain"),
    ("? {a: 1}\n: c\n" + EVALUATE, "a key must be a plain"),
    (EVALUATE + "description: " + "[" * 5_000 + "]" * 5_000 + "\n", "nested"),
    (EVALUATE + "".join(" " * i + f"k{i}:\n" for i in range(600)) + " " * 600 + "v\n", "nested"),
    (EVALUATE + "description: &x [*x]\n", "description"),
], ids=["bell", "nul", "list-key", "mapping-key", "deep-list", "deep-mapping", "self-reference"])
def test_malformed_yaml_is_one_line(tmp_path, write_spec, text, mentions):
    spec = write_spec(text)
    assert_one_line_usage_error(cli("validate", str(spec), cwd=tmp_path), spec.name, mentions)


def test_a_real_process_exits_2_with_one_line_and_no_traceback(tmp_path, write_spec):
    """What the user's shell sees: the exit status, and stderr without a traceback, for a
    document nested past what the YAML reader follows."""
    spec = write_spec(EVALUATE + "description: " + "[" * 5_000 + "]" * 5_000 + "\n")
    result = runner("validate", str(spec), cwd=tmp_path)
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "nested" in lines[0], result.stderr


@pytest.mark.parametrize("args, mention", [
    (["check"], "runner check: Missing argument 'MODEL.onnx'. ('"),
    (["run", "--bogus", "x"], "runner run: No such option '--bogus'"),
    (["runs", "--status", "finished"], "runner runs: Invalid value for '--status': 'finished' is not one of"),
    (["bogus"], "runner: No such command 'bogus'"),
    (["--bogus"], "runner: No such option '--bogus'"),
    (["play", "--model"], "runner play: Option '--model' requires an argument."),
    (["convert"], "runner convert: Missing argument '{fp16|int8}'. Choose from: fp16, int8 ('"),
], ids=["missing-argument", "unknown-option", "bad-choice", "unknown-command", "unknown-top-option",
        "option-without-value", "choices-listed"])
def test_a_command_line_mistake_is_one_line(tmp_path, args, mention):
    assert_one_line_usage_error(runner(*args, cwd=tmp_path), mention, "--help' lists what it takes)")


STATES = Path(__file__).resolve().parent.parent / "models" / "reference" / "fixed_states_60.npz"
ONNX = STATES.with_name("dqn_breakout.onnx")


def _bad_files(tmp_path: Path) -> dict[str, Path]:
    import zipfile
    from fractions import Fraction

    import torch

    files = {"empty": b"", "junk": bytes(range(256)) * 3}
    made = {}
    for suffix in (".pt", ".npz", ".onnx"):
        for name, content in files.items():
            path = tmp_path / f"{name}{suffix}"
            path.write_bytes(content)
            made[path.name] = path
    with zipfile.ZipFile(tmp_path / "zip_of_junk.npz", "w") as archive:
        archive.writestr("header.npy", b"\x93NUMPY junk")
    made["zip_of_junk.npz"] = tmp_path / "zip_of_junk.npz"
    made["states_as.pt"] = tmp_path / "states_as.pt"
    made["states_as.pt"].write_bytes(STATES.read_bytes())
    made["objects.pt"] = tmp_path / "objects.pt"
    torch.save({"format": "breakout-dqn-checkpoint/1", "state_dict": Fraction(1, 3)}, made["objects.pt"])
    return made


CHECKPOINT_POLICY = """\
name: bad_checkpoint
contract: {{other_contracts: {contracts}}}
policies:
  dqn: {{type: checkpoint, path: {path}}}
measurements:
  - kind: evaluate
    name: m
    policies: [dqn]
    seeds: [1]
"""
PARITY = """\
name: bad_artifact
artifacts:
  states: {{path: {states}}}
  model: {{path: {model}}}
  reference: {{path: {reference}}}
runtimes:
  ort: {{runtime: onnxruntime, artifact: model}}
  ort_reference: {{runtime: onnxruntime, artifact: reference}}
measurements:
  - kind: parity
    name: p
    fixed_states: states
    runtimes: [ort, ort_reference]
"""
NEVER = ("StopIteration", "allow_pickle", "weights_only", "Traceback")


@pytest.mark.parametrize("contracts", ["refused", "deliberate"])
@pytest.mark.parametrize("name", ["empty.pt", "junk.pt", "states_as.pt", "objects.pt"])
def test_a_checkpoint_policy_that_is_not_a_checkpoint(tmp_path, write_spec, name, contracts):
    path = _bad_files(tmp_path)[name]
    result = cli("validate", str(write_spec(CHECKPOINT_POLICY.format(path=path, contracts=contracts))), cwd=tmp_path)
    assert_one_line_usage_error(result, name, "not a")
    assert not any(word in result.stderr for word in NEVER)


@pytest.mark.parametrize("role, name", [("states", "empty.npz"), ("states", "junk.npz"),
                                        ("states", "zip_of_junk.npz"), ("model", "empty.onnx"),
                                        ("model", "junk.onnx")])
def test_a_corrupt_artifact_names_the_file_and_what_is_wrong(tmp_path, write_spec, role, name):
    files = _bad_files(tmp_path)
    paths = {"states": STATES, "model": ONNX, "reference": ONNX, role: files[name]}
    result = cli("validate", str(write_spec(PARITY.format(**paths))), cwd=tmp_path)
    assert_one_line_usage_error(result, name)
    assert ("empty" in result.stderr) == name.startswith("empty")
    assert not any(word in result.stderr for word in NEVER)


TRAIN = """\
name: big_train
measurements:
  - kind: train
    name: t
    total_transitions: 1000
    replay_capacity: {capacity}
"""


@pytest.mark.slow
def test_a_replay_that_cannot_fit_in_memory(tmp_path, write_spec):
    result = cli("validate", str(write_spec(TRAIN.format(capacity=10**12))), cwd=tmp_path)
    assert_one_line_usage_error(result, "replay_capacity", "GB", "memory")
    assert cli("validate", str(write_spec(TRAIN.format(capacity=10_000))), cwd=tmp_path).exit_code == 0


@pytest.mark.parametrize("seeds, mentions", [
    ("[" + ",".join(["1"] * 100_001) + "]", "100000"),  # under the 256 KiB a spec file may be
    ("[1, 2147483648]", "2147483647"),
    ("{start: 2147483640, count: 10}", "2147483647"),
], ids=["too-many", "too-large", "range-past-the-largest"])
@pytest.mark.slow
def test_seed_lists_are_capped_like_ranges(tmp_path, write_spec, seeds, mentions):
    spec = write_spec(EVALUATE.replace("seeds: [1]", f"seeds: {seeds}"))
    assert_one_line_usage_error(cli("validate", str(spec), cwd=tmp_path), "seeds", mentions)


def test_every_problem_of_a_spec_in_one_pass(tmp_path, write_spec):
    spec = write_spec("""\
name: many_problems
policies:
  random: {type: random}
measurements:
  - kind: evaluate
    name: first
    policies: [random]
    seeds: [1]
    batch_size: 0
  - kind: evaluate
    name: second
    policies: [nobody]
    seeds: [2]
verdicts:
  - name: v
    measurement: second
    candidate: random
    deployment_worthy_when:
      no_such_metric: "> 0"
""")
    result = cli("validate", str(spec), cwd=tmp_path)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.exception
    lines = result.stderr.strip().splitlines()
    assert any("measurements[0].batch_size" in line for line in lines), lines
    assert any("unknown policy 'nobody'" in line for line in lines), lines
    assert any("no_such_metric" in line for line in lines), lines


@pytest.mark.parametrize("name", ["empty.onnx", "junk.onnx"])
def test_play_refuses_a_model_that_is_not_onnx(tmp_path, name):
    path = _bad_files(tmp_path)[name]
    result = cli("play", "--model", str(path), "--port", "0", "--db", str(tmp_path / "play.duckdb"), cwd=tmp_path)
    assert_one_line_usage_error(result, name, "not an ONNX model")


def test_report_requests_that_cannot_be_met_are_one_line(tmp_path, db):
    """An unknown run or spec, two ways of naming a run at once, or a reports folder that cannot
    be made: one line each, exit 2 for a wrong request, and no traceback."""
    (tmp_path / "afile").write_text("a file, not a folder")
    cli = CliRunner()
    for args, code, message in (
            (["nope"], 2, "no run 'nope' in the database"),
            (["--spec", "nope"], 2, "no run of spec 'nope' in the database"),
            (["r1", "--spec", "s"], 2, "either RUN_ID or --spec NAME"),
            (["--verdicts", "r1"], 2, "takes no RUN_ID or --spec"),
            (["r1", "--reports", str(tmp_path / "afile" / "sub")], 2, "cannot write the report there")):
        result = cli.invoke(main, ["report", *args, "--db", str(db)])
        assert result.exit_code == code, (args, result.output)
        assert result.output.startswith("error: ") and message in result.output, (args, result.output)
        assert len(result.output.strip().splitlines()) == 1 and isinstance(result.exception, SystemExit), args
