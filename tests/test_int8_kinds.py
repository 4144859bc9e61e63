"""The localisation and repair kinds through `runner run` into a DuckDB file: the perturbed layer of a
tiny network is the one named, its rows equal a direct computation; a planted fragile layer of
the shipped model is the one the repair keeps in float; bad inputs are one line, exit 2,
nothing stored."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper
from tiny_onnx import fp16_fragile_weights, tiny_model, tiny_states, tiny_weights

from breakout_core.evaluation.fixed_states import FixedStates, save_fixed_states
from breakout_core.game.contract import CONTRACTS
from runner.spec.document import SpecError, load_spec

REPO = Path(__file__).parents[1]
SHIPPED = REPO / "models" / "reference"


def _runner(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "runner", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env=env)


def _tiny_states_file(path: Path, n: int) -> Path:
    """A fixed-states file of the tiny network's (4, 12, 12) states, under breakout-v3."""
    obs = tiny_states(n, seed=3)
    return save_fixed_states(path, FixedStates(
        obs=obs, episode_seeds=np.zeros(n, np.int64), steps=np.arange(n, dtype=np.int64),
        actions=np.zeros(n, np.int64), contract_hash=CONTRACTS["breakout-v3"].hash, checkpoint_path=None,
        checkpoint_sha256=None))


def _every_tensor(path: Path, states: np.ndarray) -> dict[str, np.ndarray]:
    """Each node output of a model on every state (batch 1), in float64: (N, ...) per tensor."""
    model = onnx.load(path)
    names = [o for n in model.graph.node for o in n.output]
    model.graph.output.extend(onnx.ValueInfoProto(name=t) for t in names if t != model.graph.output[0].name)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    runs = [dict(zip(outputs, session.run(None, {"obs": states[i:i + 1]}))) for i in range(len(states))]
    return {t: np.concatenate([r[t] for r in runs]).astype(np.float64) for t in outputs}


LOCALISATION_SPEC = """
name: tiny_localisation
artifacts:
  fp32: {path: fp32.onnx}
  perturbed: {path: perturbed.onnx}
  renamed: {path: renamed.onnx}
  states: {path: states.npz}
runtimes:
  ort_fp32: {runtime: onnxruntime, provider: cpu, intra_op_threads: 1, artifact: fp32}
  ort_perturbed: {runtime: onnxruntime, provider: cpu, intra_op_threads: 1, artifact: perturbed}
  ort_same: {runtime: onnxruntime, provider: cpu, artifact: fp32}
  ort_renamed: {runtime: onnxruntime, provider: cpu, artifact: renamed}
measurements:
  - kind: localisation
    name: where
    fixed_states: states
    runtimes: [ort_fp32, ort_perturbed, ort_same, ort_renamed]
    tolerance: 0.01
"""


@pytest.mark.slow
def test_localisation_names_the_perturbed_layer_and_its_rows_equal_a_direct_computation(tmp_path):
    tiny_model(tmp_path / "fp32.onnx")
    weights = tiny_weights()
    rng = np.random.default_rng(7)
    weights["wc"] = weights["wc"] + (0.5 * rng.standard_normal(weights["wc"].shape)).astype(np.float32)  # fc_a
    tiny_model(tmp_path / "perturbed.onnx", weights)
    renamed = onnx.load(tmp_path / "fp32.onnx")  # no tensor name in common with the baseline
    produced = {o for n in renamed.graph.node for o in n.output}
    for node in renamed.graph.node:
        node.output[:] = [f"other_{o}" for o in node.output]
        node.input[:] = [f"other_{i}" if i in produced else i for i in node.input]
    renamed.graph.output[0].name = "other_q"
    onnx.save_model(renamed, tmp_path / "renamed.onnx")
    _tiny_states_file(tmp_path / "states.npz", 40)
    (tmp_path / "spec.yaml").write_text(LOCALISATION_SPEC, encoding="utf-8")

    done = _runner("run", "spec.yaml", "--db", "x.duckdb", "--runs-dir", "runs", "--report", "--reports", "reports",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr

    states = tiny_states(40, seed=3)
    base, cand = _every_tensor(tmp_path / "fp32.onnx", states), _every_tensor(tmp_path / "perturbed.onnx", states)
    with duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True) as con:
        rows = con.execute("SELECT layer, depth, max_abs, rel_l2, cosine, sqnr_db, over_tolerance FROM "
                           "localisation_layers WHERE candidate = 'ort_perturbed' ORDER BY depth").fetchall()
        first, flips = con.execute("SELECT first_layer, flips FROM localisation_candidates "
                                   "WHERE candidate = 'ort_perturbed'").fetchone()
        same = con.execute("SELECT first_layer, flips, max(l.max_abs) FROM localisation_candidates c JOIN "
                           "localisation_layers l USING (run_id, measurement, candidate) WHERE candidate = 'ort_same' "
                           "GROUP BY ALL").fetchone()
        unavailable = con.execute("SELECT runtime, reason FROM runtime_status WHERE NOT available").fetchall()
        flipped = con.execute("SELECT state, baseline_action, candidate_action, first_layer FROM localisation_flips "
                              "ORDER BY state").fetchall()
    assert [r[0] for r in rows] == ["x", "x01", "ca", "ra", "cb", "rb", "flat", "fa", "rf", "q"]
    for layer, depth, max_abs, rel_l2, cosine, sqnr_db, over in rows:
        b, c = base[layer].ravel(), cand[layer].ravel()
        d = c - b
        assert max_abs == pytest.approx(np.abs(d).max(), abs=1e-12)
        assert rel_l2 == pytest.approx(np.linalg.norm(d) / np.linalg.norm(b), rel=1e-9, abs=1e-12)
        assert cosine == pytest.approx(b @ c / np.sqrt((b @ b) * (c @ c)), rel=1e-9)
        if d.any():
            assert sqnr_db == pytest.approx(10 * np.log10((b @ b) / (d @ d)), rel=1e-9)
        else:
            assert sqnr_db == float("inf") and depth < 7  # every layer before fc_a is exact
        assert over == (rel_l2 > 0.01)
    assert first == "fa"  # fc_a's output: the layer that was perturbed
    expected_flips = np.flatnonzero(base["q"].argmax(1) != cand["q"].argmax(1)).tolist()
    assert flips == len(expected_flips) > 0
    assert [r[0] for r in flipped] == expected_flips
    assert {r[3] for r in flipped} == {"fa"}
    assert all(r[1] == base["q"][r[0]].argmax() and r[2] == cand["q"][r[0]].argmax() for r in flipped)
    assert same == (None, 0, 0.0)
    assert unavailable == [("ort_renamed", "no tensor of fp32.onnx has a counterpart in renamed.onnx")]
    page = next((tmp_path / "reports").glob("tiny_localisation-*.html")).read_text(encoding="utf-8")
    assert "<b>ort_perturbed</b> (fp32): first over the tolerance is <code>fa</code> (depth 7)" in page
    assert "<b>ort_same</b> (fp32): no layer's relative L2 error over all states passes 0.01; 0 of 40" in page


def _fragile_shipped(path: Path) -> Path:
    """The shipped FP32 file with node_linear made fragile for INT8: channel 63 of the last conv is
    dead (zero weights, negative bias, zero after the Relu) and every unit of the first fully
    connected layer reads its first feature with a giant weight. In float that weight multiplies
    zeros; quantized per output channel, each row's scale becomes 1000 / 127 and every other
    weight of the row rounds to zero."""
    model = onnx.load(SHIPPED / "dqn_breakout.onnx")
    weights = {i.name: i for i in model.graph.initializer}

    def change(name: str, edit) -> None:
        array = numpy_helper.to_array(weights[name]).copy()
        edit(array)
        weights[name].CopyFrom(numpy_helper.from_array(array, name))

    change("torso.4.weight", lambda w: w.__setitem__(63, 0.0))
    change("torso.4.bias", lambda b: b.__setitem__(63, -1.0))
    change("head.0.weight", lambda w: w.__setitem__((slice(None), 63 * 49), 1000.0))
    onnx.save_model(model, path)
    return path


REPAIR_SPEC = f"""
name: fragile_repair
contract: {{name: breakout-v3}}
artifacts:
  checkpoint: {{path: {SHIPPED / "dqn_breakout.pt"}}}
  fragile: {{path: fragile.onnx}}
  fixed_states: {{path: {SHIPPED / "fixed_states_60.npz"}}}
  repaired: {{path: out/repaired.onnx, made_by: fragile_repair, precision: int8}}
measurements:
  - kind: repair
    name: repair
    source: fragile
    checkpoint: checkpoint
    check_states: fixed_states
    output: repaired
    calibration:
      n_states: 16
      capture: {{episode_seeds: [9100, 9101], max_steps_per_episode: 80, batch_size: 2}}
    target: {{min_agreement: null, max_abs_dq: 0.5}}
    latency_runs: 64
"""


@pytest.mark.slow
def test_repair_finds_the_fragile_layer_and_writes_the_chosen_file(tmp_path):
    _fragile_shipped(tmp_path / "fragile.onnx")
    (tmp_path / "spec.yaml").write_text(REPAIR_SPEC, encoding="utf-8")
    done = _runner("run", "spec.yaml", "--db", "x.duckdb", "--runs-dir", "runs", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True) as con:
        order = con.execute("SELECT node, alone_mean_abs_dq FROM repair_order ORDER BY rank").fetchall()
        steps = con.execute("SELECT step, kept_float, kept_float_quantized_at_load, max_abs_dq, passes, chosen, "
                            "sha256 FROM repair_steps ORDER BY step").fetchall()
        result = con.execute("SELECT path, sha256, step, met_target, calibration_states, calibration_seeds "
                             "FROM repair_results").fetchone()
    assert order[0][0] == "node_linear" and order[0][1] > 10 * order[1][1]  # the planted layer, ranked first
    # node_linear alone kept in float sits between quantized neighbours, and onnxruntime gives its weights
    # int8 when it loads the file: the step records it, fails the target, and the search goes on
    assert [(s[1], s[2]) for s in steps] == [("[]", "[]"), ('["node_linear"]', '["node_linear"]'),
                                             ('["node_linear", "node_linear_1"]', "[]")]
    assert [(s[4], s[5]) for s in steps] == [(False, False), (False, False), (True, True)]
    assert steps[0][3] > 0.5 and steps[2][3] <= 0.5
    path, sha, step, met, n_calibration, seeds = result
    assert step == 2 and met and n_calibration == 16 and seeds == "[9100, 9101]"
    from breakout_core.common.hashing import file_sha256

    assert Path(path) == tmp_path / "out" / "repaired.onnx" and file_sha256(path) == sha == steps[2][6]
    metadata = {p.key: p.value for p in onnx.load(path).metadata_props}
    assert metadata["breakout.int8_nodes_excluded"] == "node_linear,node_linear_1"


FP16_REPAIR_SPEC = """
name: fp16_repair
artifacts:
  fragile: {path: fragile.onnx}
  states: {path: states.npz}
  repaired: {path: out/repaired.onnx, made_by: fp16_repair, precision: fp16}
measurements:
  - kind: repair
    name: repair
    precision: fp16
    source: fragile
    check_states: states
    output: repaired
    latency_runs: 64
"""


@pytest.mark.slow
def test_an_fp16_repair_keeps_the_fragile_layer_in_float32_and_stores_its_precision(tmp_path):
    tiny_model(tmp_path / "fragile.onnx", fp16_fragile_weights())
    _tiny_states_file(tmp_path / "states.npz", 40)
    (tmp_path / "spec.yaml").write_text(FP16_REPAIR_SPEC, encoding="utf-8")
    done = _runner("run", "spec.yaml", "--db", "x.duckdb", "--runs-dir", "runs", "--report", "--reports", "reports",
                   cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    with duckdb.connect(str(tmp_path / "x.duckdb"), read_only=True) as con:
        order = con.execute("SELECT calibrate_method, node FROM repair_order ORDER BY rank").fetchall()
        steps = con.execute("SELECT calibrate_method, kept_float, nodes_quantized, passes, chosen FROM repair_steps "
                            "ORDER BY step").fetchall()
        result = con.execute("SELECT precision, calibrate_method, calibration_states, calibration_seeds, "
                             "calibration_sha256, step, met_target, path FROM repair_results").fetchone()
        label = con.execute("SELECT label FROM artifacts").fetchone()[0]
    assert order[0] == (None, "fc_b")
    assert [s[1] for s in steps] == ["[]", '["fc_b"]'] and [s[3:] for s in steps] == [(False, False), (True, True)]
    assert steps[0][0] is None and "fc_b" in steps[0][2] and "fc_b" not in steps[1][2]
    assert result[:7] == ("fp16", None, None, None, None, 1, True) and label == "repaired (onnx, fp16)"
    weights = {t.name: t.data_type for t in onnx.load(result[7]).graph.initializer}
    assert weights["wd"] == onnx.TensorProto.FLOAT and weights["wc"] == onnx.TensorProto.FLOAT16
    page = next((tmp_path / "reports").glob("fp16_repair-*.html")).read_text(encoding="utf-8")
    assert "FP16, step 1, keeping 1 node(s) in float (fc_b)" in page and "no calibration" in page


def test_repair_settings_leave_out_what_the_precision_does_not_use():
    from runner.kinds.repair import RepairMeasurement

    common = {"kind": "repair", "name": "r", "source": "a", "check_states": "s", "output": "o"}
    int8 = RepairMeasurement.model_validate({**common, "checkpoint": "c",
                                             "calibration": {"capture": {"episode_seeds": [9000]}}})
    assert "precision" not in int8.model_dump(mode="json")  # the settings INT8 runs stored before the field
    fp16 = RepairMeasurement.model_validate({**common, "precision": "fp16"})
    stored = fp16.model_dump(mode="json")
    assert stored["precision"] == "fp16" and not set(stored) & {"checkpoint", "calibration", "per_channel"}
    assert RepairMeasurement.model_validate(stored) == fp16


BAD = """
name: bad
contract: {{name: breakout-v3}}
artifacts:
  checkpoint: {{path: {shipped}/dqn_breakout.pt}}
  onnx_fp32: {{path: {shipped}/dqn_breakout.onnx}}
  fixed_states: {{path: {shipped}/fixed_states_60.npz}}
{out}runtimes:
  ort_fp32: {{runtime: onnxruntime, provider: cpu, artifact: onnx_fp32}}
  torch_fp32: {{runtime: torch, device: cpu, artifact: checkpoint}}
measurements:
  - kind: episodes
    name: games
    runtimes: [ort_fp32]
    seeds: {{start: 500, count: 3}}
  - kind: {kind}
    name: m
{body}
"""
OUT = "  out: {path: out.onnx, made_by: bad, precision: int8}\n"
REPAIR_BODY = """    source: onnx_fp32
    checkpoint: checkpoint
    check_states: fixed_states
    output: out
    calibration:
      n_states: {n_states}
      capture: {{episode_seeds: {seeds}}}
    keep_float: {keep}
"""


DISJOINT = ": held-out seeds must be disjoint from every game the spec plays: "
# a repair's calibration seeds, another measurement of the spec (none but `games`), and the problem: each
# game the spec plays, or took its fixed states from, that a calibration seed also is
OVERLAPS = [
    ("[9000, 501]", "", f"[1]{DISJOINT}measurement 'games' (seeds) plays 501"),
    ("{start: 3, count: 2}", "", f"{DISJOINT}the fixed states artifacts.fixed_states "
                                 f"({SHIPPED / 'fixed_states_60.npz'}) were captured from 3, 4"),
    ("[9000, 9001]", "  - {kind: train, name: tr, total_transitions: 1000, score_seeds: [9001, 9002]}\n",
     f"[1]{DISJOINT}measurement 'tr' (score_seeds) plays 9001"),
    ("[9000, 9001]", "  - {kind: train, name: tr, total_transitions: 1000,\n"
                     "     evaluate_checkpoints: {seeds: {start: 8990, count: 20}}}\n",
     f"[0]{DISJOINT}measurement 'tr' (evaluate_checkpoints.seeds) plays 9000, 9001"),
    ("[9000, 9001]", "  - {kind: closed_loop, name: loop, runtimes: [ort_fp32], seed: 9001}\n",
     f"[1]{DISJOINT}measurement 'loop' (seed) plays 9001"),
]
FP16_BODY = "    source: onnx_fp32\n    check_states: fixed_states\n    output: out\n"


@pytest.mark.parametrize("kind,body,at,message", [
    ("localisation", "    fixed_states: fixed_states\n    runtimes: [ort_fp32, torch_fp32]\n", "torch_fp32]",
     "measurements[1].runtimes[1]: runtime 'torch_fp32' (torch) cannot expose its intermediate tensors"),
    ("repair", REPAIR_BODY.format(n_states=64, seeds="[9000]", keep="[node_linear_9]"), "keep_float",
     "measurements[1].keep_float[0]: 'node_linear_9' is not a node of dqn_breakout.onnx; its nodes are: node__to_copy"),
    ("repair", REPAIR_BODY.format(n_states=0, seeds="[9000]", keep="[]"), "n_states",
     "measurements[1].calibration.n_states: an empty calibration set: minmax calibration needs at least 16 states"),
    ("repair", REPAIR_BODY.format(n_states=8, seeds="[9000]", keep="[]"), "n_states",
     "measurements[1].calibration.n_states: 8 states: minmax calibration needs at least 16 states"),
    ("repair", "    precision: fp16\n" + FP16_BODY + "    calibration:\n      capture: {episode_seeds: [9000]}\n",
     "calibration:", "measurements[1].calibration: int8 only: an fp16 repair captures no calibration games and "
     "quantizes nothing, so no calibration here"),
    ("repair", "    checkpoint: checkpoint\n" + FP16_BODY, "kind: repair",
     "measurements[1]: an int8 repair needs calibration: `calibration: {capture: {episode_seeds: ...}}`, seeds no "
     "other part of the spec plays"),
    ("repair", "    precision: fp16\n" + FP16_BODY, "output: out",
     "measurements[1].output: artifacts.out is written as FP16: declare it with precision: fp16"),
] + [("repair", REPAIR_BODY.format(n_states=64, seeds=seeds, keep="[]") + other, "episode_seeds",
        "measurements[1].calibration.capture.episode_seeds" + message) for seeds, other, message in OVERLAPS])
def test_bad_inputs_are_one_line_each_naming_file_and_line(tmp_path, kind, body, at, message):
    text = BAD.format(shipped=SHIPPED, kind=kind, body=body, out=OUT if kind == "repair" else "")
    path = tmp_path / "spec.yaml"
    path.write_text(text, encoding="utf-8")
    line = next(n for n, content in enumerate(text.splitlines(), 1) if at in content)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert len(caught.value.problems) == 1, caught.value.problems
    assert caught.value.problems[0].startswith(f"{path}:{line}: {message}"), caught.value.problems[0]


@pytest.mark.slow
@pytest.mark.parametrize("seeds,other,message", OVERLAPS, ids=["episodes", "fixed_states", "score_seeds",
                                                               "evaluate_checkpoints", "closed_loop"])
def test_a_calibration_seed_the_spec_plays_exits_2_with_one_line_and_stores_nothing(tmp_path, seeds, other,
                                                                                    message):
    body = REPAIR_BODY.format(n_states=64, seeds=seeds, keep="[]") + other
    text = BAD.format(shipped=SHIPPED, kind="repair", body=body, out=OUT)
    (tmp_path / "spec.yaml").write_text(text, encoding="utf-8")
    done = _runner("run", "spec.yaml", "--db", "x.duckdb", cwd=tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    line = next(n for n, content in enumerate(text.splitlines(), 1) if "episode_seeds" in content)
    assert done.stderr.strip().splitlines() == [
        f"error: spec.yaml:{line}: measurements[1].calibration.capture.episode_seeds{message}"]
    assert not (tmp_path / "x.duckdb").exists()
