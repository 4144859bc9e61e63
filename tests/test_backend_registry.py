"""A backend defined in tests/ (reference_runtime.py) and registered with one line: specs
accept its options, `runner schema` describes them, and parity, latency and a closed loop on
the shipped model store it like any other runtime, with no other edit."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

REPO = Path(__file__).parents[1]
REFERENCE = REPO / "models" / "reference"

SPEC = f"""\
name: registry_parity
contract: {{name: breakout-v3, other_contracts: deliberate}}
artifacts:
  checkpoint: {{path: {REFERENCE / "dqn_breakout.pt"}}}
  onnx_fp32: {{path: {REFERENCE / "dqn_breakout.onnx"}}}
  fixed_states: {{path: {REFERENCE / "fixed_states_60.npz"}}}
runtimes:
  torch_fp32: {{runtime: torch, threads: 1, artifact: checkpoint}}
  reference: {{runtime: onnx_reference, max_batch: 16, check_shapes: true, artifact: onnx_fp32}}
measurements:
  - kind: parity
    name: parity
    fixed_states: fixed_states
    runtimes: [torch_fp32, reference]
    batch_sizes: [1, 16]
  - kind: latency
    name: latency
    fixed_states: fixed_states
    runtimes: [torch_fp32, reference]
    warmup: 2
    iterations: 64
  - kind: closed_loop
    name: closed_loop
    runtimes: [torch_fp32, reference]
    steps: 24
verdicts:
  - name: same_decisions
    measurement: parity
    candidate: reference
    baseline: torch_fp32
    deployment_worthy_when: {{action_agreement: ">= 1.0", max_abs_dq: "<= 1e-4"}}
"""

REGISTER = """
import sys
sys.path.insert(0, {tests!r})
from breakout_core.runtimes.registry import RUNTIMES
from reference_runtime import ReferenceRuntime
RUNTIMES[ReferenceRuntime.name] = ReferenceRuntime  # the registry line a new backend adds
from runner.cli.commands import main
main(sys.argv[1:])
"""


def _runner(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    code = REGISTER.format(tests=str(Path(__file__).parent))
    return subprocess.run([sys.executable, "-c", code, *args], cwd=cwd, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_backend_registered_from_tests_validates_describes_and_runs(tmp_path):
    (tmp_path / "spec.yaml").write_text(SPEC)
    bad = SPEC.replace("max_batch: 16", "max_batch: 0")
    (tmp_path / "bad.yaml").write_text(bad)
    refused = _runner("validate", "bad.yaml", cwd=tmp_path)
    assert refused.returncode == 2 and "max_batch" in refused.stdout + refused.stderr
    assert "greater than or equal to 1" in refused.stdout + refused.stderr and "Traceback" not in refused.stderr

    schema = _runner("schema", cwd=tmp_path)
    assert schema.returncode == 0, schema.stderr[-2000:]
    models = json.loads(schema.stdout)["$defs"]
    config = next(m for m in models.values()
                  if m.get("properties", {}).get("runtime", {}).get("const") == "onnx_reference")
    assert config["properties"]["max_batch"]["description"] == "the largest batch infer() accepts"

    done = _runner("run", "spec.yaml", "--db", "r.duckdb", "--no-report", "--runs-dir", "runs", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    with duckdb.connect(str(tmp_path / "r.duckdb"), read_only=True) as con:
        status = con.execute("SELECT backend, available, runtime_describe->>'$.actual.evaluator' FROM runtime_status "
                             "WHERE runtime = 'reference'").fetchall()
        counts = dict(con.execute("SELECT runtime, count(*) FROM parity_q GROUP BY runtime").fetchall())
        verdict = con.execute("SELECT outcome FROM verdicts WHERE verdict = 'same_decisions'").fetchone()[0]
        timed = dict(con.execute("SELECT runtime, n FROM latency_summary WHERE batch_size = 1").fetchall())
        played = con.execute("SELECT a.step, a.action, b.action FROM closed_loop_steps a JOIN closed_loop_steps b "
                             "USING (step) WHERE a.runtime = 'torch_fp32' AND b.runtime = 'reference' "
                             "ORDER BY step").fetchall()
    assert status == [("onnx_reference", True, "onnx.reference.ReferenceEvaluator")] * 3  # one per measurement
    assert timed == {"torch_fp32": 64, "reference": 64}
    assert len(played) == 24 and all(ours == theirs for _, ours, theirs in played)
    assert counts == {"torch_fp32": 120, "reference": 120}  # 60 states at batch sizes 1 and 16
    assert verdict == "deployment-worthy"
