"""An ONNX model whose decisions differ from the reference's: Gaussian noise on the weights of
its last Gemm (the Q head), as a careless quantization or a bad export might leave it."""

from __future__ import annotations

from pathlib import Path

REFERENCE_ONNX = Path(__file__).resolve().parents[1] / "models" / "reference" / "dqn_breakout.onnx"


def perturbed_onnx(out: Path, relative_noise: float = 0.01, seed: int = 0, source: Path = REFERENCE_ONNX) -> Path:
    """`source` with noise of `relative_noise` times their standard deviation added to the last
    Gemm's weights, written to `out`. At 0.01 the reference's Q-values move by up to 0.03 and
    24 of the 60 fixed states change their action (their best two Q-values lie that close)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(source))
    gemm = [node for node in model.graph.node if node.op_type == "Gemm"][-1]
    weights = next(init for init in model.graph.initializer if init.name == gemm.input[1])
    w = numpy_helper.to_array(weights)
    noise = np.random.default_rng(seed).normal(0.0, relative_noise * float(w.std()), w.shape)
    weights.CopyFrom(numpy_helper.from_array((w + noise).astype(w.dtype), weights.name))
    onnx.save(model, str(out))
    return out
