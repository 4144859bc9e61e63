"""ONNX files a user might hand `runner check` or `runner convert` by mistake or by design, each
made from the reference export with onnx alone: a fixed batch, damaged or foreign bytes, a graph
without outputs, a tensor whose declared shape is not its data, NaN weights."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

REFERENCE_ONNX = Path(__file__).resolve().parents[1] / "models" / "reference" / "dqn_breakout.onnx"


def fixed_batch_onnx(path: Path, batch: int) -> Path:
    """The reference (uint8 input) with its batch dimension fixed at `batch`, as torch.onnx.export
    writes it without dynamic_axes."""
    model = onnx.load(REFERENCE_ONNX)
    for value in (*model.graph.input, *model.graph.output):
        dim = value.type.tensor_type.shape.dim[0]
        dim.ClearField("dim_param")
        dim.dim_value = batch
    del model.graph.value_info[:]
    onnx.save(model, path)
    return path


def truncated_onnx(path: Path) -> Path:
    data = REFERENCE_ONNX.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def text_onnx(path: Path) -> Path:
    path.write_text("not a model, a note saved with the wrong name\n" * 4)
    return path


def empty_onnx(path: Path) -> Path:
    path.write_bytes(b"")
    return path


def no_outputs_onnx(path: Path) -> Path:
    model = onnx.load(REFERENCE_ONNX)
    del model.graph.output[:]
    onnx.save(model, path)
    return path


def sequence_input_onnx(path: Path) -> Path:
    """A graph whose input is declared a sequence of tensors rather than a tensor."""
    model = onnx.load(REFERENCE_ONNX)
    name = model.graph.input[0].name
    model.graph.input[0].CopyFrom(onnx.helper.make_tensor_sequence_value_info(name, onnx.TensorProto.UINT8, None))
    onnx.save(model, path)
    return path


def declared_2gib_onnx(path: Path) -> Path:
    """The largest weight's first dimension raised until its shape declares 2 GiB, its data left as
    it was (6 MiB)."""
    model = onnx.load(REFERENCE_ONNX)
    weight = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))
    weight.dims[0] *= 2**31 // (int(np.prod(weight.dims)) * 4) + 1
    onnx.save(model, path)
    return path


def nan_onnx(path: Path) -> Path:
    """The reference with its last layer's bias NaN: every Q-value is NaN."""
    model = onnx.load(REFERENCE_ONNX)
    bias = next(t for t in reversed(model.graph.initializer) if t.data_type == onnx.TensorProto.FLOAT and len(t.dims))
    bias.CopyFrom(numpy_helper.from_array(np.full(tuple(bias.dims), np.nan, dtype=np.float32), bias.name))
    onnx.save(model, path)
    return path
