"""A small Q-network in ONNX (built with onnx.helper) for the quantization, FP16, localisation and
repair tests: the shipped model's shape of graph, uint8 input (B, 4, 12, 12) cast to float and
divided by 255, two convolutions and two fully connected layers, four Q-values out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

INPUT_SHAPE = (4, 12, 12)
# node name -> (its weight initializer, the tensor it writes)
LAYERS = {"conv_a": ("wa", "ca"), "conv_b": ("wb", "cb"), "fc_a": ("wc", "fa"), "fc_b": ("wd", "q")}
GIANT = 1000.0
FP16_GIANT = 3000.0  # float16 values between 2048 and 4096 are 2 apart


def tiny_weights(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def he(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32)

    return {
        "wa": he((8, 4, 4, 4), 64), "ba": np.full(8, 0.05, np.float32),
        "wb": he((8, 8, 3, 3), 72), "bb": np.full(8, 0.05, np.float32),
        "wc": he((16, 72), 72), "bc": np.full(16, 0.05, np.float32),
        "wd": he((4, 16), 16) * 4, "bd": np.zeros(4, np.float32),
    }


def tiny_model(path: Path, weights: dict[str, np.ndarray] | None = None) -> Path:
    """Write the network with these weights (default tiny_weights()) to `path`."""
    w = tiny_weights() if weights is None else weights
    nodes = [
        helper.make_node("Cast", ["obs"], ["x"], to=TensorProto.FLOAT, name="to_float"),
        helper.make_node("Div", ["x", "k255"], ["x01"], name="scale"),
        helper.make_node("Conv", ["x01", "wa", "ba"], ["ca"], strides=[2, 2], name="conv_a"),
        helper.make_node("Relu", ["ca"], ["ra"], name="relu_a"),
        helper.make_node("Conv", ["ra", "wb", "bb"], ["cb"], name="conv_b"),
        helper.make_node("Relu", ["cb"], ["rb"], name="relu_b"),
        helper.make_node("Reshape", ["rb", "flat_shape"], ["flat"], name="flatten"),
        helper.make_node("Gemm", ["flat", "wc", "bc"], ["fa"], transB=1, name="fc_a"),
        helper.make_node("Relu", ["fa"], ["rf"], name="relu_f"),
        helper.make_node("Gemm", ["rf", "wd", "bd"], ["q"], transB=1, name="fc_b"),
    ]
    constants = {"k255": np.array(255.0, np.float32), "flat_shape": np.array([-1, 72], np.int64), **w}
    graph = helper.make_graph(
        nodes, "tiny_qnet",
        [helper.make_tensor_value_info("obs", TensorProto.UINT8, ["batch", *INPUT_SHAPE])],
        [helper.make_tensor_value_info("q", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(v, k) for k, v in constants.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.checker.check_model(model, full_check=True)
    onnx.save_model(model, path)
    return path


def fragile_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """fc_b made fragile for INT8: unit 15 of fc_a is dead (zero weights, negative bias, so zero
    after the Relu) and fc_b reads it with a giant weight. In float the giant weight multiplies
    zeros and changes nothing; quantized, each of fc_b's weight rows gets a scale of
    GIANT / 127 and every other weight rounds to zero."""
    w = tiny_weights(seed)
    w["wc"][15] = 0.0
    w["bc"][15] = -1.0
    w["wd"][:, 15] = GIANT
    return w


def fp16_fragile_weights(seed: int = 0) -> dict[str, np.ndarray]:
    """fc_b made fragile for FP16: unit 15 of fc_a is constant (zero weights, bias 1, so 1 after
    the Relu, exact in float16 too) and fc_b reads it with weights FP16_GIANT + 0, 0.3, 0.6 and
    0.9, one per action. In float32 they add those steps to the Q-values; in float16 all four
    round to FP16_GIANT and the steps are lost, which flips the closer decisions."""
    w = tiny_weights(seed)
    w["wc"][15] = 0.0
    w["bc"][15] = 1.0
    w["wd"][:, 15] = FP16_GIANT + np.array([0.0, 0.3, 0.6, 0.9], np.float32)
    return w


def tiny_states(n: int, seed: int = 1) -> np.ndarray:
    """uint8 states with some structure: a dark background and a few bright blocks."""
    rng = np.random.default_rng(seed)
    states = rng.integers(0, 40, size=(n, *INPUT_SHAPE), dtype=np.uint8)
    for s in states:
        for _ in range(3):
            r, c = rng.integers(0, 9, size=2)
            s[:, r:r + 3, c:c + 3] = rng.integers(120, 256)
    return states


def no_float_ops_model(path: Path) -> Path:
    """A model whose only ops are the input's Cast, its scaling and a ReduceMean: nothing a quantizer
    of onnxruntime quantizes."""
    nodes = [helper.make_node("Cast", ["obs"], ["f"], to=TensorProto.FLOAT, name="cast"),
             helper.make_node("Div", ["f", "k"], ["x"], name="div"),
             helper.make_node("ReduceMean", ["x"], ["m"], keepdims=0, name="mean")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs", TensorProto.UINT8, ["b", 4, 84, 84])],
                              [helper.make_tensor_value_info("m", TensorProto.FLOAT, [])],
                              [helper.make_tensor("k", TensorProto.FLOAT, [], [255.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 9
    onnx.save_model(model, path)
    return path
