"""NNCF's INT8 export (`quantizer: nncf`) on the shipped model: the file is written whole with its
sha256 and provenance, pins the scaled input to 1/255, loads in OpenVINO on integer kernels and
agrees with FP32 on most of the 60 fixed states; its declaration is checked when the spec loads;
without NNCF it is unavailable with the reason."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest

from breakout_core.common.hashing import file_sha256
from breakout_core.conversion.quantize import INPUT_SCALE
from breakout_core.diagnosis.parity import compare_q
from breakout_core.evaluation.fixed_states import load_fixed_states
from breakout_core.runtimes.registry import make_runtime
from runner.spec.document import SpecError, load_spec

needs_nncf = pytest.mark.skipif(importlib.util.find_spec("nncf") is None or importlib.util.find_spec("openvino")
                                is None, reason="nncf or openvino is not installed (pip install -e '.[openvino]')")

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models" / "reference"
FP32 = MODELS / "dqn_breakout.onnx"
# Measured on this project's 2-core AMD EPYC (avx512_vnni): NNCF's file calibrated on the 16 states
# below took FP32's action on 55 of the 60 fixed states (41 of the 44 that set no range) in OpenVINO and
# in ONNX Runtime alike (int8_cpu's ONNX Runtime minmax file: 46). Near-ties decide the rest; 48 leaves room for
# another CPU's kernels without passing a file that lost its decisions.
MIN_AGREEMENT = 48


@pytest.fixture(scope="module")
def states() -> np.ndarray:
    return load_fixed_states(MODELS / "fixed_states_60.npz").obs


def _q(runtime: str, path: Path, obs: np.ndarray, **options):
    with make_runtime(runtime, **options) as rt:
        rt.load(path)
        return rt.infer(obs), rt.actual()


@pytest.fixture(scope="module")
def nncf_file(tmp_path_factory, states):
    from breakout_core.conversion.nncf_quantize import quantize_nncf

    # every fourth fixed state: 15 of them judge agreement below on states that set no range
    calibration = states[::4]
    calibration = np.concatenate([calibration, states[1:2]])  # 16, NNCF's minimum here
    return quantize_nncf(FP32, tmp_path_factory.mktemp("nncf") / "int8_nncf.onnx", calibration=calibration)


@needs_nncf
def test_the_file_is_written_whole_with_its_sha256_and_provenance(nncf_file):
    from breakout_core.conversion.export import inspect_onnx, onnx_precision

    made = nncf_file
    assert made.sha256 == file_sha256(made.path) and made.size_bytes == made.path.stat().st_size
    assert made.source_sha256 == file_sha256(FP32)
    assert [p.name for p in made.path.parent.iterdir()] == ["int8_nncf.onnx"]  # no temporary file left
    assert onnx_precision(made.path) == "int8"
    meta = inspect_onnx(made.path).metadata
    assert meta["breakout.int8_quantizer"].startswith("nncf ") and made.quantizer == meta["breakout.int8_quantizer"]
    assert meta["breakout.int8_calibration_states"] == "16" and meta["breakout.int8_calibrate_method"] == "mean_minmax"
    assert made.nodes_quantized == ("node_conv2d", "node_conv2d_1", "node_conv2d_2", "node_linear", "node_linear_1")
    assert made.input_scale == pytest.approx(INPUT_SCALE, rel=1e-6)  # pinned: every uint8 pixel exact


@needs_nncf
def test_it_loads_in_openvino_on_integer_kernels_and_agrees_with_fp32(nncf_file, states):
    fp32, _ = _q("onnxruntime", FP32, states, intra_op_threads=1)
    on_openvino, actual = _q("openvino", nncf_file.path, states, threads=1)
    on_onnxruntime, _ = _q("onnxruntime", nncf_file.path, states, intra_op_threads=1)
    assert actual.precision == "int8" and actual.int8.method == "static"
    assert actual.int8.nodes_quantized == nncf_file.nodes_quantized
    assert len(actual.int8.integer_kernels) == 5  # every convolution and fully connected layer on u8/i8
    judged = np.ones(len(states), dtype=bool)
    judged[::4], judged[1] = False, False
    parity, unseen = compare_q(fp32, on_openvino), compare_q(fp32[judged], on_openvino[judged])
    assert parity.action_agreement >= MIN_AGREEMENT, parity
    assert unseen.action_agreement >= MIN_AGREEMENT * judged.sum() / len(states), unseen
    assert 0 < parity.max_abs_diff < 2.0  # quantized, not a copy of FP32, and not lost
    assert compare_q(on_onnxruntime, on_openvino).max_abs_diff < 0.1  # one QDQ graph, two runtimes


@needs_nncf
def test_localisation_reads_every_layer_of_it_and_the_pinned_input_is_exact(nncf_file, states):
    from breakout_core.diagnosis.localise import localise

    found = localise(FP32, nncf_file.path, states)
    assert found.unmatched == ()  # NNCF keeps the FP32 graph's tensor names
    errors = {layer.tensor: layer.max_abs for layer in found.layers}
    # the dequantized input: scale 1/255 keeps every uint8 pixel (NNCF's own range was off by 1.1e-3)
    assert errors["div"] < 1e-6
    assert errors["conv2d"] > 1e-4  # quantized weights: the first layer departs


@needs_nncf
def test_kept_in_float_goes_to_nncfs_ignored_scope(tmp_path, states):
    from breakout_core.conversion.nncf_quantize import quantize_nncf
    from breakout_core.conversion.quantize import QuantizeError

    made = quantize_nncf(FP32, tmp_path / "kept.onnx", calibration=states[:16], nodes_to_exclude=["node_linear_1"])
    assert made.nodes_excluded == ("node_linear_1",) and "node_linear_1" not in made.nodes_quantized
    assert made.nodes_quantized == ("node_conv2d", "node_conv2d_1", "node_conv2d_2", "node_linear")
    with pytest.raises(QuantizeError, match="'fc9' is not a node of dqn_breakout.onnx"):
        quantize_nncf(FP32, tmp_path / "bad.onnx", calibration=states[:16], nodes_to_exclude=["fc9"])
    assert not (tmp_path / "bad.onnx").exists()


def test_without_nncf_it_is_unavailable_with_the_reason(tmp_path):
    code = ("import sys; sys.modules['nncf'] = None\n"
            "import numpy as np\n"
            "from breakout_core.conversion.nncf_quantize import nncf_available, quantize_nncf, QuantizerUnavailable\n"
            "print(nncf_available())\n"
            "try:\n"
            f"    quantize_nncf({str(FP32)!r}, {str(tmp_path / 'x.onnx')!r}, "
            "calibration=np.zeros((16, 4, 84, 84), np.uint8))\n"
            "except QuantizerUnavailable as exc:\n"
            "    print('refused:', exc)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    first, refused = out.stdout.splitlines()
    assert first.startswith("(False, \"nncf cannot be imported (ModuleNotFoundError") and "'.[openvino]'" in first
    assert refused.startswith("refused: nncf cannot be imported") and "pip install -e '.[openvino]'" in refused
    assert not (tmp_path / "x.onnx").exists()


SPEC = f"""\
name: nncf
contract: {{name: breakout-v3}}
artifacts:
  checkpoint: {{path: {MODELS / 'dqn_breakout.pt'}}}
  fixed_states: {{path: {MODELS / 'fixed_states_60.npz'}}}
  onnx_fp32: {{path: {FP32}}}
  int8_ort: {{path: out/ort.onnx, made_by: nncf, precision: int8}}
  int8_nncf: {{path: out/nncf.onnx, made_by: nncf, precision: int8}}
runtimes:
  ort_fp32: {{runtime: onnxruntime, intra_op_threads: 1, artifact: onnx_fp32}}
  ov_nncf: {{runtime: openvino, threads: 1, artifact: int8_nncf}}
measurements:
  - kind: export
    name: files
    checkpoint: checkpoint
    int8:
      - onnx: int8_ort
        source: onnx_fp32
        calibration_states: 16
        calibration: {{episode_seeds: [100, 101], max_steps_per_episode: 60}}
      - onnx: int8_nncf
        source: onnx_fp32
        quantizer: nncf
        calibration_states: 16
        calibration: {{episode_seeds: [100, 101], max_steps_per_episode: 60}}
  - kind: parity
    name: parity
    fixed_states: fixed_states
    runtimes: [ort_fp32, ov_nncf]
"""

BAD = [
    ("        quantizer: nncf\n", "        quantizer: nncf\n        calibrate_method: percentile\n",
     "calibrate_method: percentile", "nncf chooses its own ranges"),
    ("        quantizer: nncf\n", "        quantizer: nncf\n        method: dynamic\n", "method: dynamic",
     "nncf quantizes statically, from calibration states: method: static"),
    ("        quantizer: nncf\n        calibration_states: 16",
     "        quantizer: nncf\n        calibration_states: 8", "calibration_states: 8",
     "nncf calibration needs at least 16 states, 8 asked"),
    ("        quantizer: nncf\n", "        quantizer: nncf\n        per_channel: false\n", "per_channel: false",
     "no per_channel: false with quantizer: nncf"),
    ("        quantizer: nncf\n", "        quantizer: tflite\n", "quantizer: tflite", "quantizer"),
]


@pytest.mark.parametrize("old,new,marker,message", BAD, ids=[case[3][:30] for case in BAD])
def test_a_bad_nncf_declaration_is_one_line_at_its_field(tmp_path, old, new, marker, message):
    assert SPEC.count(old) == 1
    path = tmp_path / "nncf.yaml"
    path.write_text(SPEC.replace(old, new))
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    line = next(i + 1 for i, text in enumerate(path.read_text().splitlines()) if marker in text)
    [problem] = caught.value.problems  # one line: the entry's files are not also "written by nothing"
    assert message in problem and problem.startswith(f"{path}:{line}: measurements[0].int8[1]"), problem
    assert "\n" not in problem


def test_the_good_spec_validates(tmp_path):
    path = tmp_path / "nncf.yaml"
    path.write_text(SPEC)
    load_spec(path)


@needs_nncf
@pytest.mark.slow
def test_a_run_stores_both_files_from_the_same_states_and_openvino_runs_nncfs(tmp_path):
    (tmp_path / "nncf.yaml").write_text(SPEC)
    done = subprocess.run([sys.executable, "-m", "runner", "run", "nncf.yaml", "--db", "r.duckdb", "--no-report"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True) as con:
        files = {r[0]: r[1:] for r in con.execute("SELECT artifact, sha256, path FROM export_files").fetchall()}
        made = {r[0]: r[1:] for r in con.execute(
            "SELECT artifact, quantizer, calibration_sha256, calibration_seeds, calibration_states, input_scale "
            "FROM int8_files").fetchall()}
        status = con.execute("SELECT runtime, precision, integer_kernels FROM runtime_status "
                             "WHERE runtime = 'ov_nncf'").fetchone()
    for sha256, path in files.values():
        assert sha256 == file_sha256(tmp_path / path)  # a path in the spec is read from its folder
    assert made["int8_nncf"][0].startswith("nncf ") and made["int8_ort"][0].startswith("onnxruntime ")
    assert made["int8_nncf"][1:4] == made["int8_ort"][1:4]  # the same states, seeds and count
    assert json.loads(made["int8_nncf"][2]) == [100, 101]
    assert made["int8_nncf"][4] == pytest.approx(INPUT_SCALE) == made["int8_ort"][4]
    assert status == ("ov_nncf", "int8", 5)


def test_a_run_without_nncf_fails_in_one_line_before_any_calibration_game(tmp_path):
    (tmp_path / "nncf.yaml").write_text(SPEC)
    done = _run_without_nncf(tmp_path, "nncf.yaml")
    assert done.returncode == 3, done.stderr[-2000:]  # the environment lacks a package: not the user's spec
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [lines[0]] and "measurements[files].int8[1].quantizer: nncf is unavailable here: nncf cannot " \
                                   "be imported" in lines[0] and "pip install -e '.[openvino]'" in lines[0]
    assert not list(tmp_path.glob("out/*.onnx"))
    with duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM episodes").fetchone() == (0,)


@needs_nncf
@pytest.mark.slow
def test_the_repair_search_keeps_layers_in_float_through_nncf(tmp_path, states):
    """`methods: [nncf]` in a repair: every step is NNCF's file with the search's nodes in its
    ignored scope, and keeping the worst layers in float brings FP32's actions back."""
    import onnx

    from breakout_core.diagnosis.repair import NNCF_METHOD, Int8Converter, RepairTarget, repair_search

    calibration = np.concatenate([states[::4], states[1:2]])  # the 16 states of nncf_file
    found = repair_search(FP32, states, tmp_path, convert=Int8Converter(calibration, calibrate_method=NNCF_METHOD),
                          target=RepairTarget(min_agreement=1.0), latency_runs=64)
    assert found.steps[0].excluded == () and found.steps[0].agreement < 1.0  # as nncf_file: some decisions lost
    assert found.chosen is not None and found.chosen.agreement == 1.0 and found.chosen.excluded
    for step in found.steps:
        metadata = {p.key: p.value for p in onnx.load(step.path).metadata_props}
        assert metadata["breakout.int8_quantizer"].startswith("nncf ")
        assert metadata["breakout.int8_nodes_excluded"] == ",".join(step.excluded)
    assert {node for node, _ in found.order} >= set(found.chosen.excluded)


def _repair_spec(path: Path, methods: str, extra: str = "") -> Path:
    """A repair search of the shipped FP32 file through `methods`, 16 calibration states."""
    path.write_text(f"""name: nncf_repair
artifacts:
  fp32: {{path: {FP32}}}
  states: {{path: {MODELS / "fixed_states_60.npz"}}}
  out: {{path: out/int8.onnx, made_by: nncf_repair, precision: int8}}
measurements:
  - kind: repair
    name: search
    source: fp32
    check_states: states
    output: out
{extra}    calibration: {{methods: [{methods}], n_states: 16, capture: {{episode_seeds: [9100, 9101]}}}}
""")
    return path


def _run_without_nncf(folder: Path, spec: str) -> subprocess.CompletedProcess:
    """`runner run spec` in a process where `import nncf` fails."""
    code = ("import sys; sys.modules['nncf'] = None\n"
            "from runner.cli.commands import main\n"
            f"main(['run', {spec!r}, '--db', 'r.duckdb', '--no-report'])\n")
    return subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True, text=True, timeout=300)


def test_a_repair_that_asks_nncf_for_tensor_scales_is_one_line(tmp_path):
    spec = _repair_spec(tmp_path / "repair.yaml", "minmax, nncf", "    per_channel: false\n")
    with pytest.raises(SpecError) as refused:
        load_spec(spec)
    assert refused.value.problems == [f"{spec}:12: measurements[0].per_channel: nncf's CPU preset gives each output "
                                      "channel its own weight scale: per_channel: false is for onnxruntime's methods"]


def test_a_repair_search_without_nncf_fails_in_one_line_before_any_calibration_game(tmp_path):
    _repair_spec(tmp_path / "repair.yaml", "nncf")
    done = _run_without_nncf(tmp_path, "repair.yaml")
    assert done.returncode == 3, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert lines == [lines[0]] and "measurements[search].calibration.methods: nncf is unavailable here: nncf " \
                                   "cannot be imported" in lines[0] and "pip install -e '.[openvino]'" in lines[0]
    assert not list(tmp_path.glob("out/*.onnx"))
    with duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM episodes").fetchone() == (0,)
