"""`runner check --json`: one document on stdout, nothing else there, with the fields
docs/json_output.md lists; a refusal is one line on stderr, exit 2, and no document. Run as a
real process, so that nothing else the check says (notes, progress, the libraries' own output)
can reach stdout unseen."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from small_check import SMALL_CHECK, set_args
from test_json_output import assert_documented
from user_exports import cleanrl_onnx

from breakout_core.common.hashing import file_sha256
from breakout_core.conversion.model_content import model_content_sha256
from breakout_core.game.contract import CONTRACTS

REFERENCE_ONNX = Path(__file__).resolve().parents[1] / "models" / "reference" / "dqn_breakout.onnx"
FP16_ONNX = REFERENCE_ONNX.with_name("dqn_breakout_fp16.onnx")


def runner(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "runner", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow
def test_check_json_names_the_run_the_contract_each_files_input_the_seeds_and_every_verdict(tmp_path):
    cleanrl_onnx(tmp_path / "cleanrl.onnx")  # CleanRL's own export: float32 in 0-255, batch fixed at 1
    done = runner("check", "cleanrl.onnx", "--input", "float32:0-255:nchw", *set_args(*SMALL_CHECK), "--json",
                  "--db", "r.duckdb", "--reports", "reports", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    document = json.loads(done.stdout)  # the whole of stdout is the one document
    assert_documented(document, "check")
    assert "check cleanrl.onnx under contract breakout-v3" in done.stderr  # said, on stderr
    v3 = CONTRACTS["breakout-v3"]
    assert document["contract"] == {"name": "breakout-v3", "hash": v3.hash, "rules": v3.rules()}
    assert document["exit_status"]["code"] == done.returncode
    assert document["exit_status"]["meaning"].startswith("passed" if done.returncode == 0 else "failed")
    assert document["model"] == "cleanrl.onnx" and document["baseline"] is None
    assert document["modified_gate"] == list(SMALL_CHECK)  # cut to seconds: not the shipped gate, and said
    assert document["question"]["asked"] == "identical" and len(document["question"]["gating"]) == 5
    assert document["check_number"] == 1
    assert document["model_content"] == model_content_sha256(tmp_path / "cleanrl.onnx")
    assert "modified gate: --set measurements.games.seeds=" in done.stderr
    assert done.stderr.index("question: ") < done.stderr.index("  verdict same_decisions: ")  # said, in order
    files = {f["runtime"]: f for f in document["files"]}
    assert files["candidate"]["input"] == "float32:0-255:nchw"
    assert files["candidate"]["input_adapter"] == "Cast uint8->float32" and files["candidate"]["static_batch"] == 1
    assert files["candidate"]["artifact_sha256"] == file_sha256(tmp_path / "cleanrl.onnx")
    assert files["baseline"]["input"] == "uint8:0-255:nchw" and files["baseline"]["input_adapter"] == "none"
    assert files["baseline"]["artifact_sha256"] == file_sha256(REFERENCE_ONNX)
    seeds = {s["measurement"]: s for s in document["seeds"]}
    assert list(seeds) == ["games"]
    played = seeds["games"]["seeds"]  # the looks played, 2 games each, until one decided
    assert played == list(range(3000, 3000 + len(played))) and len(played) in (2, 4, 6)
    assert seeds["games"]["drawn"] is None
    verdicts = {v["verdict"]: v for v in document["verdicts"]}
    assert len(verdicts) == 5 and verdicts["same_decisions"]["outcome"] == "deployment-worthy"
    games = verdicts["keeps_the_score"]
    assert games["in_words"].startswith("mean score ") and " games a runtime (" in games["in_words"]
    assert verdicts["same_decisions"]["in_words"].startswith("60 of 60 fixed states take the same action")
    assert games["reason"] and set(games["games"]) >= {"paired_diff_median", "identical_games_share"}
    with_run = subprocess.run([sys.executable, "-m", "runner", "sql", "--json", "--db", "r.duckdb",
                               "SELECT spec_name FROM runs WHERE run_id = '" + document["run_id"] + "'"],
                              cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert json.loads(with_run.stdout)["rows"] == [["check_onnx"]]


@pytest.mark.slow
def test_a_converted_file_is_asked_whether_it_is_as_good_and_exits_by_the_gating_verdicts(tmp_path):
    """The shipped FP16 file against the FP32 one: its decisions and 256 steps are shown beside
    the games, stalls and latency, which alone decide the exit status."""
    done = runner("check", str(FP16_ONNX), *set_args(*SMALL_CHECK), "--json", "--db", "r.duckdb", "--reports",
                  "reports", cwd=tmp_path)
    assert done.returncode in (0, 1), done.stderr
    document = json.loads(done.stdout)
    assert_documented(document, "check")
    question = document["question"]
    assert question["asked"] == "as-good" and question["why"] == "the file computes in fp16, its baseline in fp32"
    assert question["diagnostics"] == ["same_decisions", "plays_the_same_256_steps"]
    assert question["gating"] == ["not_slower_at_batch_1", "keeps_the_score", "no_more_stalls"]
    outcomes = {v["verdict"]: v["outcome"] for v in document["verdicts"]}
    assert done.returncode == (0 if all(outcomes[v] == "deployment-worthy" for v in question["gating"]) else 1)
    assert "question: is it as good and not slower?" in done.stderr
    assert "diagnostics, not gating: same_decisions " in done.stderr


def test_check_json_refusal_is_one_line_on_stderr_and_no_document(tmp_path):
    cleanrl_onnx(tmp_path / "cleanrl.onnx")
    done = runner("check", "cleanrl.onnx", "--json", "--db", "r.duckdb", cwd=tmp_path)
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: MODEL cleanrl.onnx: takes float32 (1, 4, 84, 84)")
    assert "--input DTYPE:RANGE:LAYOUT" in lines[0]
    assert not (tmp_path / "r.duckdb").exists()
