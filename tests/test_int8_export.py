"""INT8 files in the export kind: every bad INT8 declaration is one line with its file:line,
exit 2 and nothing stored; a real run stores each file's provenance; the ONNX Runtime
runtime says an INT8 file is INT8, which nodes are quantized and which ran on integers, and
the CPU's INT8 instruction sets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
from tiny_onnx import no_float_ops_model

from breakout_core.common.hashing import file_sha256
from breakout_core.conversion.quantize import cpu_isa, quantize_int8
from breakout_core.runtimes.registry import make_runtime
from runner.spec.document import SpecError, load_spec

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models" / "reference"

# The good spec; each bad one below replaces one of its lines, so the line a problem names is that line.
GOOD = f"""\
name: int8
contract: {{name: breakout-v3}}
artifacts:
  checkpoint: {{path: {MODELS / 'dqn_breakout.pt'}}}
  fixed_states: {{path: {MODELS / 'fixed_states_60.npz'}}}
  onnx_fp32: {{path: {MODELS / 'dqn_breakout.onnx'}}}
  int8_static: {{path: out/static.onnx, made_by: int8, precision: int8}}
  int8_dynamic: {{path: out/dynamic.onnx, made_by: int8, precision: int8}}
runtimes:
  ort_fp32: {{runtime: onnxruntime, intra_op_threads: 1, artifact: onnx_fp32}}
  ort_static: {{runtime: onnxruntime, intra_op_threads: 1, artifact: int8_static}}
  ort_dynamic: {{runtime: onnxruntime, intra_op_threads: 1, artifact: int8_dynamic}}
measurements:
  - kind: export
    name: files
    checkpoint: checkpoint
    int8:
      - onnx: int8_static
        source: onnx_fp32
        method: static
        calibrate_method: minmax
        calibration_states: 16
        calibration: {{episode_seeds: [100, 101], max_steps_per_episode: 60}}
        keep_float: [node_linear_1]
      - onnx: int8_dynamic
        source: onnx_fp32
        method: dynamic
  - kind: parity
    name: parity
    fixed_states: fixed_states
    runtimes: [ort_fp32, ort_static, ort_dynamic]
  - kind: closed_loop
    name: loop
    runtimes: [ort_fp32, ort_static]
    seed: 7
    steps: 20
verdicts:
  - name: decisive_kept
    measurement: parity
    candidate: ort_static
    baseline: ort_fp32
    deployment_worthy_when: {{decisive_action_agreement: ">= 1.0"}}
"""


def _spec(folder: Path, text: str) -> Path:
    path = folder / "int8.yaml"
    path.write_text(text)
    return path


def _line(text: str, fragment: str) -> int:
    lines = [i + 1 for i, line in enumerate(text.splitlines()) if fragment in line]
    assert len(lines) == 1, (fragment, lines)
    return lines[0]


# (line of GOOD replaced, its replacement, the fragment that marks the line named, the message)
BAD = [
    ("        calibration: {episode_seeds: [100, 101], max_steps_per_episode: 60}",
     "        calibration: {episode_seeds: [5, 100], max_steps_per_episode: 60}", "calibration:",
     "held-out seeds must be disjoint from every game the spec plays: the fixed states artifacts.fixed_states "
     f"({MODELS / 'fixed_states_60.npz'}) were captured from 5"),
    ("    seed: 7", "    seed: 101", "calibration:",
     "held-out seeds must be disjoint from every game the spec plays: measurement 'loop' (seed) plays 101"),
    ("        calibration: {episode_seeds: [100, 101], max_steps_per_episode: 60}",
     "        calibration: {episode_seeds: [], max_steps_per_episode: 60}", "calibration:",
     "the seed list is empty"),
    ("        calibration_states: 16", "        calibration_states: 0", "calibration_states:",
     "an empty calibration set: minmax calibration needs at least 16 states"),
    ("        calibration_states: 16", "        calibration_states: 15", "calibration_states:",
     "minmax calibration needs at least 16 states, 15 asked"),
    ("        calibrate_method: minmax", "        calibrate_method: percentile", "calibration_states:",
     "percentile calibration needs at least 64 states, 16 asked"),
    ("        keep_float: [node_linear_1]", "        keep_float: [node_linear_1, fc9]", "keep_float:",
     "'fc9' is not a node of dqn_breakout.onnx; its nodes are: node__to_copy, node_div, node_conv2d"),
    ("        keep_float: [node_linear_1]",
     "        keep_float: [node_conv2d, node_conv2d_1, node_conv2d_2, node_Reshape_8, node_linear, node_linear_1, "
     "node_relu, node_relu_1, node_relu_2, node_relu_3]", "keep_float:",
     "nothing to quantize in dqn_breakout.onnx: every node onnxruntime would quantize is in keep_float"),
    ("        source: onnx_fp32\n        method: dynamic", "        source: nothing\n        method: dynamic",
     "method: dynamic", "nothing to quantize in no_float_ops.onnx: no op onnxruntime's dynamic quantizer handles "
                        "(ops: Cast, Div, ReduceMean)"),
    ("        method: dynamic", "        method: dynamic\n        calibration_states: 64", "calibration_states: 64",
     "dynamic quantization takes its activation ranges at run time: no calibration_states here"),
    ("  int8_dynamic: {path: out/dynamic.onnx, made_by: int8, precision: int8}",
     "  int8_dynamic: {path: out/dynamic.onnx, made_by: int8}", "      - onnx: int8_dynamic",
     "'int8_dynamic' is an INT8 file: artifacts.int8_dynamic needs precision: int8"),
]


@pytest.mark.parametrize("old,new,marker,message", BAD, ids=[case[3][:40] for case in BAD])
def test_each_bad_int8_declaration_is_one_line_at_its_field(tmp_path, old, new, marker, message):
    assert GOOD.count(old) == 1
    nothing = no_float_ops_model(tmp_path / "no_float_ops.onnx")
    text = GOOD.replace(old, new).replace("runtimes:\n", f"  nothing: {{path: {nothing}}}\nruntimes:\n")
    path = _spec(tmp_path, text)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    problems = [p for p in caught.value.problems if message in p]
    assert len(problems) >= 1, caught.value.problems
    assert problems[0].startswith(f"{path}:{_line(path.read_text(), marker)}: measurements[0].int8["), problems[0]
    assert all("\n" not in p for p in caught.value.problems)


def test_keep_float_on_a_file_the_spec_writes_cannot_be_checked_and_is_refused(tmp_path):
    text = GOOD.replace("    checkpoint: checkpoint\n    int8:", "    checkpoint: checkpoint\n    onnx: own\n    int8:")
    text = text.replace("        source: onnx_fp32\n        method: static", "        method: static")
    text = text.replace("runtimes:\n", "  own: {path: out/own.onnx, made_by: int8}\nruntimes:\n")
    path = _spec(tmp_path, text)
    with pytest.raises(SpecError, match="keep_float names nodes of 'own', which this spec writes"):
        load_spec(path)
    load_spec(_spec(tmp_path, text.replace("        keep_float: [node_linear_1]\n", "")))  # no keep_float: fine


def _runner(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "runner", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env=env)


def test_a_bad_int8_spec_exits_2_and_stores_nothing(tmp_path):
    path = _spec(tmp_path, GOOD.replace("    seed: 7", "    seed: 100"))
    done = _runner("run", str(path), "--db", "r.duckdb", "--reports", "reports", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert lines[0].startswith(f"error: {path}:{_line(GOOD, 'calibration:')}: measurements[0].int8[0].calibration.")
    assert not (tmp_path / "r.duckdb").exists() and not (tmp_path / "out").exists()


def test_the_onnxruntime_runtime_says_an_int8_file_is_int8_and_what_ran_on_integers(tmp_path):
    made = quantize_int8(MODELS / "dqn_breakout.onnx", tmp_path / "dynamic.onnx", method="dynamic")
    with make_runtime("onnxruntime", intra_op_threads=1) as runtime:
        runtime.load(made.path)
        actual = runtime.describe()["actual"]
    assert actual["precision"] == "int8"
    assert tuple(actual["int8"]["nodes_quantized"]) == made.nodes_quantized
    assert actual["int8"]["method"] == "dynamic" and actual["int8"]["nodes_excluded"] == []
    kernels = {n["node"]: n["op"] for n in actual["nodes"] if n["node"] in actual["int8"]["integer_kernels"]}
    assert len(kernels) == 5 and set(kernels.values()) == {"ConvInteger", "DynamicQuantizeMatMul"}
    assert actual["cpu_isa"] == cpu_isa()
    with make_runtime("onnxruntime", intra_op_threads=1) as runtime:
        runtime.load(MODELS / "dqn_breakout.onnx")
        fp32 = runtime.describe()["actual"]
    assert fp32["precision"] == "fp32" and fp32["int8"] is None and fp32["cpu_isa"] == cpu_isa()


def _query(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


@pytest.mark.slow
def test_an_int8_export_stores_each_files_provenance_and_its_runtime_rows(tmp_path):
    path = _spec(tmp_path, GOOD)
    done = _runner("run", str(path), "--db", "r.duckdb", "--reports", "reports", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    db = tmp_path / "r.duckdb"
    files = {r[0]: r[1:] for r in _query(db, "SELECT artifact, precision, bytes, sha256, path FROM export_files")}
    assert set(files) == {"int8_static", "int8_dynamic"}
    for precision, size, sha, file in files.values():
        assert precision == "int8" and size == Path(file).stat().st_size and sha == file_sha256(file)
    made = {r[0]: r[1:] for r in _query(db, (
        "SELECT artifact, source_artifact, source_sha256, method, calibrate_method, calibration_states, "
        "calibration_seeds, nodes_excluded, nodes_quantized, excluded_quantized_at_load, onnxruntime_version "
        "FROM int8_files"))}
    import onnxruntime

    source_sha = file_sha256(MODELS / "dqn_breakout.onnx")
    static, dynamic = made["int8_static"], made["int8_dynamic"]
    assert static[:5] == ("onnx_fp32", source_sha, "static", "minmax", 16)
    assert json.loads(static[5]) == [100, 101] and json.loads(static[6]) == ["node_linear_1"]
    assert "node_linear_1" not in json.loads(static[7]) and "node_conv2d" in json.loads(static[7])
    assert json.loads(static[8]) == [] and static[9] == onnxruntime.__version__
    assert dynamic[:5] == ("onnx_fp32", source_sha, "dynamic", None, 0) and dynamic[5] is None
    rows = {r[0]: r[1:] for r in _query(db, (
        "SELECT runtime, precision, quantized_nodes, integer_kernels, cpu_int8_dot_product, cpu_isa "
        "FROM runtime_status WHERE measurement = 'parity'"))}
    assert rows["ort_static"][0] == "int8" and json.loads(rows["ort_static"][1]) == json.loads(static[7])
    assert rows["ort_static"][2] >= 4 and rows["ort_dynamic"][2] == 5
    assert rows["ort_fp32"][:3] == ("fp32", None, None)
    assert all(r[3] == cpu_isa()["int8_dot_product"] and json.loads(r[4]) == cpu_isa() for r in rows.values())
    outcome, reason = _query(db, "SELECT outcome, reason FROM verdicts WHERE verdict = 'decisive_kept'")[0]
    assert outcome in ("deployment-worthy", "rejected") and "decisive_action_agreement" in reason
    sizes = dict(_query(db, "SELECT artifact, size_vs_fp32 FROM export_sizes"))
    assert all(0.2 < sizes[a] < 0.3 for a in ("int8_static", "int8_dynamic"))
