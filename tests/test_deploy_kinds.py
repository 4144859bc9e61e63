"""Deployment kinds (export, parity, latency, closed_loop, episodes) and the spec's runtimes/artifacts.

The SQL views are checked against breakout_core's own numpy math on known arrays; a tiny
spec then runs end to end through the real CLI into a temp DuckDB, with an untrained
checkpoint: export -> parity -> latency (64 samples) -> closed loop -> episodes, where the
CUDA and TensorRT runtimes run on a machine that has them and elsewhere come out unavailable
with their reasons.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import duckdb
import numpy as np
import pytest
from test_end_to_end import cli

from breakout_core.diagnosis.parity import compare_q
from breakout_core.runtimes.registry import RUNTIMES, runtime_available
from runner.kinds.shared.runtime_lifecycle import greedy
from runner.spec.document import SpecError, load_spec
from runner.spec.runtimes import RUNTIME_CONFIGS
from runner.store.database import Store

REPO = Path(__file__).parents[1]
Q_COLUMNS = ("q_noop", "q_fire", "q_right", "q_left")


# -- parity math: SQL views against breakout_core.diagnosis.parity.compare_q ------------------------------

def _parity_rows(runtime: str, q: np.ndarray, batch_size: int = 1) -> list[dict]:
    actions = greedy(q)
    return [{"run_id": "r", "measurement": "p", "runtime": runtime, "batch_size": batch_size, "state": i,
             **{c: float(q[i, j]) for j, c in enumerate(Q_COLUMNS)}, "action": int(actions[i])} for i in range(len(q))]


def _settings(runtime: str, atol: float, rtol: float) -> dict:
    return {"run_id": "r", "measurement": "p", "runtime": runtime, "precision": "fp32", "atol": atol, "rtol": rtol,
            "tolerance_from": "test", "states_path": "-", "states_sha256": "-", "n_states": 0}


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(tmp_path / "views.duckdb")


KNOWN_BASE = np.array([
    [1.0, 2.0, 3.0, 0.0],       # clear winner, margin 1
    [0.5, 0.50001, 0.0, 0.0],   # near tie (margin 1e-5)
    [0.0, 0.0, 0.0, 4.0],
    [-2.0, 5.0, 1.0, 1.0],
    [3.0, 3.0, 1.0, 0.0],       # exact tie: lowest index wins
], dtype=np.float32)


@pytest.mark.parametrize("atol,rtol", [(1e-5, 1e-5), (1e-3, 1e-3), (0.0, 0.0)])
def test_parity_views_equal_compare_q_on_known_arrays(store, atol, rtol):
    candidate = KNOWN_BASE.copy()
    candidate[0, 2] += 2e-5        # fails 1e-5, passes 1e-3
    candidate[1, 0] += 3e-5        # swaps the near tie: action 0 over 1
    candidate[3, 1] = np.nan       # never passes, infinitely far, action -1
    candidate[4] += 1e-6
    store.append_rows("parity_q", _parity_rows("base", KNOWN_BASE) + _parity_rows("cand", candidate))
    store.append_rows("parity_settings", [_settings("cand", atol, rtol), _settings("base", atol, rtol)])
    expected = compare_q(KNOWN_BASE, candidate, atol=atol, rtol=rtol)
    with store.reader() as con:
        states = con.execute("SELECT state, max_abs_dq, agree, near_tie, elements_fail, candidate_action "
                             "FROM parity_state_pairs WHERE candidate = 'cand' AND baseline = 'base' "
                             "ORDER BY state").fetchall()
        summary = con.execute("SELECT n_states, max_abs_dq, mean_abs_dq, elements_pass, elements_fail, states_pass, "
                              "allclose, action_agreement, action_agreement_fraction, disagreeing_states, "
                              "near_tie_states "
                              "FROM parity_summary WHERE candidate = 'cand' AND baseline = 'base'").fetchone()
        from runner.kinds.shared.runtime_metrics import parity_pair_metrics as pair_metrics

        metrics = pair_metrics(con, "r", "p", "cand", "base")
    np.testing.assert_array_equal([s[1] for s in states], expected.per_state_max_abs_diff)
    assert [s[5] for s in states] == expected.candidate_actions.tolist()
    assert tuple(i for i, s in enumerate(states) if not s[2]) == expected.disagreeing_states
    assert tuple(i for i, s in enumerate(states) if s[3]) == expected.near_tie_states
    n, max_dq, mean_dq, e_pass, e_fail, s_pass, allclose, agree, fraction, disagreeing, near = summary
    assert n == expected.n_states
    assert max_dq == expected.max_abs_diff == np.inf
    assert mean_dq == expected.mean_abs_diff
    assert (e_pass, e_fail, s_pass, allclose) == (expected.elements_pass, expected.elements_fail, expected.states_pass,
                                                  expected.allclose)
    assert (agree, fraction) == (expected.action_agreement, expected.action_agreement_fraction)
    assert tuple(disagreeing) == expected.disagreeing_states == (1, 3)
    assert tuple(near or ()) == expected.near_tie_states
    assert metrics["action_agreement"] == expected.action_agreement_fraction
    assert metrics["action_disagreements"] == 2.0 and metrics["allclose"] == float(expected.allclose)


def test_parity_views_finite_differences_and_worst_batch_size_decides(store):
    rng = np.random.default_rng(3)
    base = rng.normal(size=(40, 4)).astype(np.float32)
    same = base + rng.normal(scale=1e-7, size=base.shape).astype(np.float32)
    worse = same.copy()
    worse[7] = base[7, [1, 0, 2, 3]]  # another batch size swaps one state's Q-values
    store.append_rows("parity_q", _parity_rows("base", base, 1) + _parity_rows("cand", same, 1)
                      + _parity_rows("base", base, 8) + _parity_rows("cand", worse, 8))
    store.append_rows("parity_settings", [_settings("cand", 1e-5, 1e-5), _settings("base", 1e-5, 1e-5)])
    with store.reader() as con:
        rows = con.execute("SELECT batch_size, max_abs_dq, mean_abs_dq, elements_fail, action_agreement, near_ties "
                           "FROM parity_summary WHERE candidate = 'cand' AND baseline = 'base' "
                           "ORDER BY batch_size").fetchall()
        from runner.kinds.shared.runtime_metrics import parity_pair_metrics as pair_metrics

        metrics = pair_metrics(con, "r", "p", "cand", "base")
        invariance = con.execute("SELECT max_abs_dq, action_changes FROM parity_batch_consistency "
                                 "WHERE runtime = 'cand' AND batch_size = 8").fetchone()
    for (batch, max_dq, mean_dq, fails, agree, near), cand in zip(rows, (same, worse)):
        expected = compare_q(base, cand)
        assert max_dq == pytest.approx(expected.max_abs_diff, rel=1e-12)
        assert mean_dq == pytest.approx(expected.mean_abs_diff, rel=1e-12)
        assert (fails, agree, near) == (expected.elements_fail, expected.action_agreement,
                                        len(expected.near_tie_states))
    worst = compare_q(base, worse)
    assert metrics["action_agreement"] == worst.action_agreement_fraction < 1.0
    assert metrics["max_abs_dq"] == pytest.approx(worst.max_abs_diff)
    assert invariance[0] == pytest.approx(float(np.abs(worse.astype(np.float64) - same).max())) and invariance[1] >= 1


def test_latency_view_percentiles_equal_numpy(store):
    from breakout_core.diagnosis.latency import latency_result

    samples = np.random.default_rng(0).lognormal(mean=-1.0, sigma=0.4, size=257)
    store.append_rows("latency_samples", [{"run_id": "r", "measurement": "l", "runtime": "a", "batch_size": 1,
                                           "round": 0, "sample": i, "ms": float(v)} for i, v in enumerate(samples)]
                      + [{"run_id": "r", "measurement": "l", "runtime": "b", "batch_size": 1, "round": 0, "sample": i,
                          "ms": float(2 * v)} for i, v in enumerate(samples)])
    expected = latency_result(samples)
    with store.reader() as con:
        row = con.execute("SELECT n, p50_ms, p90_ms, p95_ms, p99_ms, mean_ms, std_ms, min_ms, max_ms "
                          "FROM latency_summary WHERE runtime = 'a'").fetchone()
        from runner.kinds.shared.runtime_metrics import latency_pair_metrics as pair_metrics

        metrics = pair_metrics(con, "r", "l", "a", "b", 1)
    assert row[0] == expected.n
    np.testing.assert_allclose(row[1:], [expected.p50_ms, expected.p90_ms, expected.p95_ms, expected.p99_ms,
                                         expected.mean_ms, expected.std_ms, expected.min_ms, expected.max_ms],
                               rtol=1e-12)
    assert metrics["latency_p95_ratio"] == pytest.approx(0.5)
    assert metrics["latency_p50_ms"] == pytest.approx(expected.p50_ms)



def test_the_p50_ratio_interval_comes_from_the_interleaved_rounds(store):
    """Each round's P50 ratio, paired by round: the interval is the t interval on their logarithms,
    and one round gives none (a verdict on it is inconclusive with that reason)."""
    from breakout_core.statistics.stats import paired_ratio_interval
    from runner.kinds.shared.runtime_metrics import latency_pair_metrics as pair_metrics
    from runner.run.verdicts import decide
    from runner.spec.fields import VerdictSpec

    rng = np.random.default_rng(1)
    base = rng.lognormal(mean=-1.0, sigma=0.3, size=(4, 64))
    factors = np.array([0.45, 0.5, 0.48, 0.55])  # the candidate's speed-up differs a little per round
    rows = []
    for runtime, ms in (("base", base), ("cand", base * factors[:, None])):
        rows += [{"run_id": "r", "measurement": "l", "runtime": runtime, "batch_size": 1, "round": r, "sample": i,
                  "ms": float(v)} for r in range(4) for i, v in enumerate(ms[r])]
    rows += [{"run_id": "r", "measurement": "one", "runtime": runtime, "batch_size": 1, "round": 0, "sample": i,
              "ms": float(v)} for runtime in ("base", "cand") for i, v in enumerate(base[0])]
    store.append_rows("latency_samples", rows)
    with store.reader() as con:
        found = pair_metrics(con, "r", "l", "cand", "base", 1)
        one_round = pair_metrics(con, "r", "one", "cand", "base", 1)
    low, high = paired_ratio_interval(np.median(base, axis=1) * factors, np.median(base, axis=1))
    assert (found["latency_p50_ratio_ci_low"], found["latency_p50_ratio_ci_high"]) == pytest.approx((low, high))
    assert low < 0.5 < high < 0.6 and found["latency_rounds"] == 4
    faster = VerdictSpec(name="faster", measurement="l", candidate="cand", baseline="base",
                         deployment_worthy_when={"latency_p50_ratio_ci_high": "< 0.6"})
    assert decide(faster, found)[0] == "deployment-worthy"
    assert "latency_p50_ratio_ci_high" not in one_round
    outcome, reason, _ = decide(faster, one_round)
    assert outcome == "inconclusive" and "needs rounds >= 2" in reason

# -- spec validation: runtimes, artifacts, references -----------------------------------------

VALID = """\
name: deploy
artifacts:
  checkpoint: {path: model.pt}
  onnx: {path: out/model.onnx, made_by: deploy}
  states: {path: out/states.npz, made_by: deploy}
runtimes:
  torch_fp32: {runtime: torch, device: cpu, precision: fp32, artifact: checkpoint}
  ort_cpu: {runtime: onnxruntime, provider: cpu, artifact: onnx}
measurements:
  - kind: export
    name: export
    checkpoint: checkpoint
    onnx: onnx
    fixed_states: states
  - kind: latency
    name: latency
    runtimes: [torch_fp32, ort_cpu]
    iterations: 128
    rounds: 2
verdicts:
  - name: faster
    measurement: latency
    candidate: ort_cpu
    baseline: torch_fp32
    deployment_worthy_when: {latency_p50_ratio_ci_high: "< 1000"}
"""


def _problems(write_spec, text: str, **kwargs) -> list[str]:
    path = write_spec(text)
    try:
        load_spec(path, **kwargs)
    except SpecError as exc:
        return exc.problems
    return []


def test_valid_deploy_spec(checkpoint, write_spec):
    assert _problems(write_spec, VALID) == []
    spec = load_spec(write_spec(VALID)).spec
    assert spec.runtimes["ort_cpu"].options()["provider"] == "cpu"
    assert spec.artifacts["onnx"].type == "onnx" and spec.artifacts["onnx"].path.endswith("out/model.onnx")


@pytest.mark.parametrize("old,new,line,message", [
    ("runtime: onnxruntime, provider: cpu", "runtime: tflite, provider: cpu", 8,
     f"does not match any of the expected tags: {', '.join(map(repr, RUNTIMES))}"),
    ("provider: cpu, artifact", "provider: rocm, artifact", 8, "Input should be 'cpu' or 'cuda'"),
    ("provider: cpu, artifact", "provider: cpu, disable_cpu_ep_fallback: true, artifact", 8,
     "disable_cpu_ep_fallback applies to a non-CPU provider"),
    ("device: cpu, precision", "device: cpu, cores: 2, precision", 7, "unknown key"),
    ("device: cpu, precision", "device: cpu, threads: 0, precision", 7, "greater than or equal to 1"),
    ("runtimes: [torch_fp32, ort_cpu]", "runtimes: [torch_fp32, ort_gpu]", 17,
     "unknown runtime 'ort_gpu'; defined: ort_cpu, torch_fp32"),
    ("iterations: 128", "iterations: 63", 18, "greater than or equal to 64"),
    ("provider: cpu, artifact: onnx}", "provider: cpu, artifact: checkpoint}", 8,
     "runtime onnxruntime loads onnx files; 'checkpoint' is checkpoint"),
    ("  states: {path: out/states.npz, made_by: deploy}\n", "  states: {path: out/states.npz, made_by: deploy}\n"
     "  extra: {path: out/extra.onnx, made_by: deploy}\n", 6, "none of its export measurements writes 'extra'"),
    ("onnx: {path: out/model.onnx, made_by: deploy}", "onnx: {path: out/model.onnx}", 4, "model file not found"),
    ("onnx: {path: out/model.onnx, made_by: deploy}", "onnx: {path: out/model.onnx, made_by: day22_export}", 4,
     "file not found: "),
    ("  checkpoint: {path: model.pt}\n", "  checkpoint: {path: model.bin}\n", 3, "unknown artifact type '.bin'"),
    ("    iterations: 128\n", "    iterations: 128\n    fixed_states: onnx\n", 19, "'onnx' is onnx ("),
    ("measurements:\n",
     "measurements:\n  - {kind: latency, name: early, runtimes: [ort_cpu], fixed_states: states}\n", 10,
     "'states' is written by this spec, but by no measurement before this one"),
])
def test_deploy_spec_problems(checkpoint, write_spec, old, new, line, message):
    assert VALID.count(old) == 1
    path = write_spec(VALID.replace(old, new))
    problems = _problems(write_spec, VALID.replace(old, new))
    assert any(message in p for p in problems), problems
    assert any(p.startswith(f"{path}:{line}: ") and message in p for p in problems), problems


def test_missing_output_of_another_spec_names_the_spec_and_a_chain_accepts_it(checkpoint, write_spec, tmp_path):
    write_spec("name: maker\n", name="maker.yaml")
    consumer = VALID.replace("onnx: {path: out/model.onnx, made_by: deploy}",
                             "onnx: {path: out/model.onnx, made_by: maker}")
    consumer = consumer.replace("    onnx: onnx\n", "    onnx: written\n").replace(
        "  states: {", "  written: {path: out/written.onnx, made_by: deploy}\n  states: {")
    problems = _problems(write_spec, consumer)
    assert any("it is made by spec 'maker'" in p and "runner run" in p and "maker.yaml" in p
               for p in problems), problems
    assert _problems(write_spec, consumer, will_exist=[tmp_path / "out" / "model.onnx"]) == []


def test_episodes_verdict_needs_the_measurement_its_metric_comes_from(checkpoint, write_spec):
    text = VALID + """\
  - name: scores
    measurement: eps
    candidate: ort_cpu
    baseline: torch_fp32
    deployment_worthy_when:
      {action_agreement: ">= 1.0", latency_p50_ratio_ci_high: "< 1", paired_score_diff_ci_low: "> -1"}
""".replace("  - name: scores", "  - name: scores", 1)
    text = text.replace("verdicts:\n", "  - kind: episodes\n    name: eps\n    runtimes: [torch_fp32, ort_cpu]\n"
                                       "    seeds: [1, 2]\n    latency: export\nverdicts:\n")
    problems = _problems(write_spec, text)
    assert any("action_agreement is a parity metric" in p for p in problems), problems
    assert any("'export' is not a latency measurement of this spec; choose from latency" in p
               for p in problems), problems


def test_runtime_config_models_are_the_backends_options():
    from breakout_core.runtimes.registry import RUNTIMES

    assert list(RUNTIME_CONFIGS) == list(RUNTIMES)
    for name, model in RUNTIME_CONFIGS.items():
        options = RUNTIMES[name].OPTIONS
        assert set(model.model_fields) - {"runtime", "artifact"} == set(options), name
        assert {k: model.model_fields[k].default for k in options} == {k: o.default for k, o in options.items()}, name
        assert {k: model.model_fields[k].description for k in options if options[k].description} == \
            {k: o.description for k, o in options.items() if o.description}, name


def test_repository_specs_validate_as_a_chain():
    """Every spec in specs/ validates once the specs that write its inputs have run (the bf16 study
    but on a CPU that would emulate bf16); every made_by names a spec in specs/ that writes that
    very file."""
    from runner.spec.extends import is_base_only, resolve_extends
    from runner.spec.yaml_source import load_yaml

    specs = [path for path in sorted((REPO / "specs").glob("*.yaml")) if not is_base_only(path)]
    produced: dict[str, str] = {}
    declared: list[tuple[str, str, str]] = []
    for path in specs:
        data = resolve_extends(load_yaml(path)).data
        for artifact in (data.get("artifacts") or {}).values():
            if "made_by" in artifact:
                resolved = str((path.parent / artifact["path"]).resolve())
                declared.append((path.name, artifact["made_by"], resolved))
                if artifact["made_by"] == data["name"]:
                    produced[resolved] = data["name"]
    assert declared, "no spec declares artifacts made by another"
    for spec_file, maker, resolved in declared:
        assert produced.get(resolved) == maker, f"{spec_file}: {resolved} is not written by spec {maker!r}"
        assert (REPO / "specs" / f"{maker}.yaml").is_file()
    from shipped_specs import but_bf16_refused_here

    problems = []
    for path in specs:
        try:
            load_spec(path, will_exist=produced)
        except SpecError as exc:
            problems += exc.problems
    assert but_bf16_refused_here(problems) == []


# -- end to end through the CLI -----------------------------------------------------------------

TINY = """\
name: tiny_deploy
contract:
  max_episode_frames: 200
policies:
  dqn: {type: checkpoint, path: model.pt}
artifacts:
  checkpoint: {path: model.pt}
  onnx_fp32: {path: out/model.onnx, made_by: tiny_deploy}
  onnx_fp16: {path: out/model_fp16.onnx, made_by: tiny_deploy, precision: fp16}
  states: {path: out/states.npz, made_by: tiny_deploy}
runtimes:
  torch_fp32: {runtime: torch, threads: 1, artifact: checkpoint}
  ort_cpu: {runtime: onnxruntime, provider: cpu, intra_op_threads: 1, artifact: onnx_fp32}
  ort_fp16: {runtime: onnxruntime, provider: cpu, intra_op_threads: 1, artifact: onnx_fp16}
  ort_cuda: {runtime: onnxruntime, provider: cuda, disable_cpu_ep_fallback: true, artifact: onnx_fp32}
  torch_cuda: {runtime: torch, device: cuda, artifact: checkpoint}
  trt_fp32: {runtime: tensorrt, precision: fp32, artifact: onnx_fp32}
measurements:
  - kind: export
    name: export
    checkpoint: checkpoint
    onnx: onnx_fp32
    onnx_fp16: onnx_fp16
    fixed_states: states
    n_states: 12
    capture: {episode_seeds: [0, 1, 2], max_steps_per_episode: 40, batch_size: 3}
  - kind: parity
    name: parity
    fixed_states: states
    baseline: torch_fp32
    runtimes: [torch_fp32, ort_cpu, ort_fp16, ort_cuda, torch_cuda, trt_fp32]
    batch_sizes: [1, 5, 12]
  - kind: latency
    name: latency
    fixed_states: states
    runtimes: [torch_fp32, ort_cpu, trt_fp32]
    iterations: 128
    rounds: 2
  - kind: closed_loop
    name: loop
    runtimes: [torch_fp32, ort_cpu, ort_fp16, ort_cuda]
    steps: 20
  - kind: episodes
    name: scores
    baseline: torch_fp32
    runtimes: [torch_fp32, ort_cpu, trt_fp32]
    seeds: [0, 1, 2]
    batch_size: 3
    parity: parity
    latency: latency
  - kind: evaluate
    name: reference
    policies: [dqn]
    seeds: [0, 1, 2]
    batch_size: 3
verdicts:
  - name: onnx_ok
    measurement: export
    candidate: onnx_fp32
    deployment_worthy_when: {verify_max_abs_dq: "<= 1e-4", verify_states: ">= 12"}
  - name: fp16_half
    measurement: export
    candidate: onnx_fp16
    baseline: onnx_fp32
    deployment_worthy_when: {size_ratio: "<= 0.55"}
  - name: ort_parity
    measurement: parity
    candidate: ort_cpu
    baseline: torch_fp32
    deployment_worthy_when: {action_agreement: ">= 1.0", allclose: "== 1", max_abs_dq: "<= 1e-5"}
  - name: cuda_parity
    measurement: parity
    candidate: ort_cuda
    baseline: torch_fp32
    deployment_worthy_when: {action_agreement: ">= 1.0"}
  - name: ort_not_slower
    measurement: latency
    candidate: ort_cpu
    baseline: torch_fp32
    deployment_worthy_when: {latency_p50_ratio_ci_high: "<= 100"}
  - name: impossible_speed
    measurement: latency
    candidate: ort_cpu
    baseline: torch_fp32
    deployment_worthy_when: {latency_p50_ratio_ci_high: "<= 0.0001"}
  - name: loop_same
    measurement: loop
    candidate: ort_cpu
    baseline: torch_fp32
    deployment_worthy_when: {score_diff: "== 0", diverged: "== 0"}
  - name: trt_worthy
    measurement: scores
    candidate: trt_fp32
    baseline: ort_cpu
    deployment_worthy_when:
      {action_agreement: ">= 1.0", latency_p50_ratio_ci_high: "< 1.0", paired_score_diff_ci_low: ">= -1.0"}
  - name: ort_scores
    measurement: scores
    candidate: ort_cpu
    baseline: torch_fp32
    deployment_worthy_when:
      {action_agreement: ">= 1.0", latency_p50_ratio_ci_high: "<= 100", paired_score_diff_ci_low: ">= -1.0"}
"""


# The spec's GPU runtimes, as (backend, options): measured where this machine can run them.
GPU_RUNTIMES = {"ort_cuda": ("onnxruntime", {"provider": "cuda", "disable_cpu_ep_fallback": True}),
                "torch_cuda": ("torch", {"device": "cuda"}),
                "trt_fp32": ("tensorrt", {"precision": "fp32"})}
MEASURED = {"parity": ("torch_fp32", "ort_cpu", "ort_fp16", "ort_cuda", "torch_cuda", "trt_fp32"),
            "latency": ("torch_fp32", "ort_cpu", "trt_fp32"), "loop": ("torch_fp32", "ort_cpu", "ort_fp16", "ort_cuda"),
            "scores": ("torch_fp32", "ort_cpu", "trt_fp32")}


@functools.cache
def _runs_here(runtime: str) -> bool:
    backend, options = GPU_RUNTIMES.get(runtime, (None, None))
    return backend is None or runtime_available(backend, **options)[0]


def _ran(measurement: str) -> set[str]:
    return {r for r in MEASURED[measurement] if _runs_here(r)}


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, one_torch_thread):
    """The tiny spec run once through the CLI, in this process (one torch thread: this machine has
    2 cores and other work)."""
    import torch

    from breakout_core.game.contract import CONTRACTS
    from breakout_core.learning.qnetwork import QNetwork, save_checkpoint

    folder = tmp_path_factory.mktemp("deploy_e2e")
    torch.manual_seed(0)
    save_checkpoint(folder / "model.pt", QNetwork(), CONTRACTS["breakout-v3"].replace(max_episode_frames=200),
                    transitions=0)
    (folder / "tiny.yaml").write_text(TINY)
    done = cli("run", "tiny.yaml", "--db", "r.duckdb", "--reports", "reports", cwd=folder)
    assert done.exit_code == 0, (done.stderr[-3000:], done.exception)
    return folder, done


def _query(folder: Path, sql: str, args=()) -> list[tuple]:
    with duckdb.connect(str(folder / "r.duckdb"), read_only=True) as con:
        return con.execute(sql, list(args)).fetchall()


@pytest.mark.slow
def test_e2e_export_files_states_and_fp16_io(tiny_run):
    from breakout_core.conversion.export import inspect_onnx
    from breakout_core.evaluation.fixed_states import load_fixed_states

    folder, _ = tiny_run
    rows = dict(_query(folder, "SELECT artifact, bytes FROM export_files"))
    assert set(rows) == {"states", "onnx_fp32", "onnx_fp16"}
    assert rows["onnx_fp32"] == (folder / "out" / "model.onnx").stat().st_size
    assert 0.4 < rows["onnx_fp16"] / rows["onnx_fp32"] < 0.55
    fp16 = inspect_onnx(folder / "out" / "model_fp16.onnx")
    assert (fp16.precision, fp16.inputs[0].dtype, fp16.outputs[0].dtype) == ("fp16", "uint8", "float32")
    states = load_fixed_states(folder / "out" / "states.npz")
    assert len(states) == 12 and _query(folder, "SELECT count(*) FROM fixed_state_index")[0][0] == 12
    assert len(set(states.episode_seeds.tolist())) == 3  # spread over the three games


@pytest.mark.slow
def test_e2e_parity_rows_and_round_trip_on_real_states(tiny_run):
    folder, _ = tiny_run
    counts = dict(_query(folder, "SELECT runtime, count(*) FROM parity_q GROUP BY runtime"))
    assert counts == {r: 36 for r in _ran("parity")}  # 12 states x 3 batch sizes; none for a runtime not here
    max_dq, agreement, allclose = _query(
        folder, "SELECT max(max_abs_dq), min(action_agreement_fraction), bool_and(allclose) "
                "FROM parity_summary WHERE candidate = 'ort_cpu' AND baseline = 'torch_fp32'")[0]
    assert max_dq < 1e-5 and agreement == 1.0 and allclose  # ONNX round trip on states from real play
    tolerance = dict(_query(folder, "SELECT runtime, atol FROM parity_settings"))
    assert tolerance == {"torch_fp32": 1e-5, "ort_cpu": 1e-5, "ort_fp16": 1e-3}


@pytest.mark.slow
def test_e2e_unavailable_runtimes_have_reasons_and_no_rows(tiny_run):
    folder, _ = tiny_run
    rows = _query(folder,
                  "SELECT measurement, runtime, reason, runtime_describe FROM runtime_status WHERE NOT available")
    found = {(m, r): reason for m, r, reason, _ in rows}
    assert set(found) == {(m, r) for m, runtimes in MEASURED.items() for r in runtimes if not _runs_here(r)}
    for runtime, needle in (("ort_cuda", "CUDAExecutionProvider"), ("torch_cuda", "CUDA"), ("trt_fp32", "tensorrt")):
        assert _runs_here(runtime) or needle in found[("parity", runtime)]
    assert all(describe is None for *_, describe in rows)
    described = _query(
        folder, "SELECT runtime_describe FROM runtime_status WHERE available AND runtime = 'ort_cpu' LIMIT 1")
    actual = json.loads(described[0][0])["actual"]
    assert actual["provider"] == "CPUExecutionProvider" and actual["nodes_not_on_requested_provider"] == []
    torch_threads = _query(folder, "SELECT DISTINCT runtime_describe->>'$.actual.cpu_threads' FROM runtime_status "
                                   "WHERE available AND runtime = 'torch_fp32'")
    assert torch_threads == [("1",)]
    if not _runs_here("trt_fp32"):
        assert _query(folder, "SELECT count(*) FROM latency_samples WHERE runtime = 'trt_fp32'")[0][0] == 0
        assert _query(folder, "SELECT count(*) FROM episodes WHERE policy = 'trt_fp32'")[0][0] == 0


@pytest.mark.slow
def test_e2e_latency_closed_loop_and_episodes_rows(tiny_run):
    folder, _ = tiny_run
    assert dict(_query(folder, "SELECT runtime, count(*) FROM latency_samples GROUP BY runtime")) == \
        {r: 128 for r in _ran("latency")}
    timer, resolution = _query(folder, "SELECT DISTINCT timer, timer_resolution_s FROM latency_series")[0]
    assert timer == "time.perf_counter_ns" and 0 < resolution < 1e-3
    loop = dict(_query(folder, "SELECT runtime, steps FROM closed_loop_summary"))
    assert loop == {r: 20 for r in _ran("loop")}
    # the runtimes play exactly what the evaluator plays with the checkpoint policy
    by_runtime = _query(folder, "SELECT policy, seed, score, steps, frames FROM episodes WHERE measurement = 'scores' "
                                "ORDER BY policy, seed")
    reference = _query(
        folder, "SELECT seed, score, steps, frames FROM episodes WHERE measurement = 'reference' ORDER BY seed")
    for runtime in ("ort_cpu", "torch_fp32"):
        assert [r[1:] for r in by_runtime if r[0] == runtime] == reference
    calls, states, transitions, batch = _query(
        folder, "SELECT inference_calls, states_inferred, transitions, batch_size "
                "FROM episode_inference WHERE runtime = 'ort_cpu'")[0]
    assert batch == 3 and calls <= transitions / 3 + 1 and states <= transitions  # one inference per vector step
    summary = dict(_query(folder, "SELECT policy, episodes FROM episode_summary WHERE measurement = 'scores'"))
    assert summary == {r: 3 for r in _ran("scores")}


@pytest.mark.slow
def test_e2e_verdicts_report_and_verdicts_page(tiny_run):
    folder, done = tiny_run
    outcomes = {v: (o, r) for v, o, r in _query(folder, "SELECT verdict, outcome, reason FROM verdicts")}
    assert outcomes["onnx_ok"][0] == "deployment-worthy"
    assert outcomes["fp16_half"][0] == "deployment-worthy"
    assert outcomes["ort_parity"][0] == "deployment-worthy"
    assert outcomes["ort_not_slower"][0] == "deployment-worthy"
    impossible = outcomes["impossible_speed"]
    assert impossible[0] == "rejected" and "latency_p50_ratio_ci_high" in impossible[1]
    assert outcomes["loop_same"][0] == "deployment-worthy"
    assert outcomes["ort_scores"][0] == "deployment-worthy"
    for name, runtime, needle in (("cuda_parity", "ort_cuda", "CUDAExecutionProvider"),
                                  ("trt_worthy", "trt_fp32", "tensorrt")):
        outcome, reason = outcomes[name]
        if _runs_here(runtime):  # decided on its numbers
            assert outcome in ("deployment-worthy", "rejected", "inconclusive"), (name, reason)
        else:
            assert outcome == "unavailable" and needle in reason, (name, reason)
            assert f"verdict {name}: unavailable" in done.stdout
    assert _query(folder, "SELECT status FROM runs")[0][0] == "done"
    page = next((folder / "reports").glob("tiny_deploy-*.html")).read_text()
    for text in ("Q-value parity", "action agreement", "P50 in black, P95 in red", "paired differences",
                 "cumulative score", "fixed states were taken"):
        assert text in page, text
    assert ("unavailable here" in page) == (not all(map(_runs_here, GPU_RUNTIMES)))
    verdicts = cli("report", "--verdicts", "--db", "r.duckdb", "--reports", "reports", cwd=folder)
    assert verdicts.exit_code == 0 and "trt_worthy" in verdicts.stdout
    assert _runs_here("trt_fp32") or "unavailable" in verdicts.stdout


@pytest.mark.slow
def test_artifacts_made_from_another_checkpoint_are_refused(tiny_run):
    import torch

    from breakout_core.game.contract import CONTRACTS
    from breakout_core.learning.qnetwork import QNetwork, save_checkpoint
    from runner.kinds.shared.lineage import check_lineage

    folder, _ = tiny_run
    torch.manual_seed(1)
    save_checkpoint(folder / "newer.pt", QNetwork(), CONTRACTS["breakout-v3"].replace(max_episode_frames=200),
                    transitions=1)
    text = ("name: consumer\ncontract: {max_episode_frames: 200}\nartifacts:\n  checkpoint: {path: CKPT}\n"
            "  onnx: {path: out/model.onnx, made_by: tiny_deploy}\n"
            "  states: {path: out/states.npz, made_by: tiny_deploy}\n"
            "runtimes:\n  ort: {runtime: onnxruntime, artifact: onnx}\n"
            "  torch: {runtime: torch, artifact: checkpoint}\n"
            "measurements:\n  - {kind: parity, name: p, runtimes: [torch, ort], fixed_states: states}\n")
    from types import SimpleNamespace

    for checkpoint, ok in (("model.pt", True), ("newer.pt", False)):
        path = folder / f"consumer_{checkpoint}.yaml"
        path.write_text(text.replace("CKPT", checkpoint))
        ctx = SimpleNamespace(spec=load_spec(path).spec, run_id=f"lineage-{checkpoint}")
        for artifact in ("onnx", "states"):
            if ok:
                check_lineage(ctx, [artifact])
            else:
                with pytest.raises(ValueError, match="made from a checkpoint with sha256 .* 'tiny_deploy' again"):
                    check_lineage(ctx, [artifact])


class _HoldsLeft:
    """A runtime whose Q-values always pick LEFT: it never serves by itself."""

    def infer(self, obs):
        return np.tile(np.array([[0.0, 0.1, 0.2, 0.3]], dtype=np.float32), (len(obs), 1))


def test_closed_loop_plays_the_contracts_serve_after_each_lost_life():
    from breakout_core.game.contract import Contract
    from runner.kinds.closed_loop import play

    stalled = play(_HoldsLeft(), Contract(), seed=0, steps=400)
    assert (stalled["action"] == 1).sum() == 0 and stalled["lives"][-1] == 4
    served = play(_HoldsLeft(), Contract().replace(serve_after_life_loss=True), seed=0, steps=400)
    fires = np.flatnonzero(served["action"] == 1)
    assert len(fires) >= 4 and served["forced_noop"][fires].all() and np.isnan(served["q"][fires]).all()
    # each serve follows a step that lost a life without ending the game
    assert all(served["lives"][i - 1] < served["lives"][i - 2] and not served["game_over"][i - 1] for i in fires)
