"""A deployment check that takes seconds: ONNX Runtime on a candidate ONNX file against the
shipped reference ONNX on the 60 fixed states at batch size 1, with a verdict that the two
decide the same. The shipped file itself is deployment-worthy; a copy whose weights are
perturbed is rejected."""

from __future__ import annotations

from pathlib import Path

import numpy as np

MODELS = Path(__file__).resolve().parent.parent / "models" / "reference"
REFERENCE_ONNX = MODELS / "dqn_breakout.onnx"
STATES = MODELS / "fixed_states_60.npz"

PARITY_GATE = """\
name: {name}
description: does the candidate ONNX decide as the reference does on the fixed states?
artifacts:
  states: {{path: {states}}}
  candidate: {{path: {candidate}}}
  reference: {{path: {reference}}}
runtimes:
  candidate: {{runtime: onnxruntime, artifact: candidate, intra_op_threads: 1}}
  reference: {{runtime: onnxruntime, artifact: reference, intra_op_threads: 1}}
measurements:
  - kind: parity
    name: fixed_states
    fixed_states: states
    baseline: reference
    runtimes: [reference, candidate]
    batch_sizes: [1]
verdicts:
  - name: same_decisions
    measurement: fixed_states
    candidate: candidate
    baseline: reference
    deployment_worthy_when:
      action_agreement: ">= 1.0"
"""


def perturbed_onnx(path: Path, scale: float = 1.0) -> Path:
    """The reference ONNX with Gaussian noise of `scale` times each weight tensor's spread added
    to every weight tensor (seeded): a model that no longer decides as the reference does."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(REFERENCE_ONNX)
    rng = np.random.default_rng(0)
    for tensor in model.graph.initializer:
        weights = numpy_helper.to_array(tensor)
        if weights.dtype == np.float32 and weights.size > 100:
            noisy = weights + rng.standard_normal(weights.shape).astype(np.float32) * weights.std() * scale
            tensor.CopyFrom(numpy_helper.from_array(noisy.astype(np.float32), tensor.name))
    onnx.save(model, path)
    return path


def parity_gate(folder: Path, candidate: Path, name: str = "my_model_parity") -> Path:
    """A spec file in `folder` that checks `candidate` against the reference ONNX."""
    path = folder / f"{name}.yaml"
    path.write_text(PARITY_GATE.format(name=name, states=STATES, candidate=candidate, reference=REFERENCE_ONNX),
                    encoding="utf-8")
    return path


def gate_runs(folder: Path) -> tuple[Path, str, str]:
    """A results database in `folder` holding two finished runs of the gate, made through the CLI:
    (database, id of the run that rejected a perturbed model, id of the run that passed the shipped one)."""
    import json

    from click.testing import CliRunner

    from runner.cli.commands import main

    db = folder / "gate.duckdb"
    ids = []
    for name, candidate in (("perturbed_gate", perturbed_onnx(folder / "perturbed.onnx")),
                            ("reference_gate", REFERENCE_ONNX)):
        result = CliRunner().invoke(main, ["run", str(parity_gate(folder, candidate, name)), "--db", str(db),
                                           "--reports", str(folder / "reports"), "--json"])
        assert result.exit_code == 0, result.output
        ids.append(json.loads(result.stdout)["run_id"])
    return db, ids[0], ids[1]
