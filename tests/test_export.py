"""ONNX export: I/O contract, preprocessing inside the graph, FP16 variant keeping uint8/float32 I/O."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from breakout_core.conversion.export import ExportError, _check_model, export_onnx, inspect_onnx
from breakout_core.diagnosis.parity import compare_q
from breakout_core.learning.qnetwork import QNetwork
from breakout_core.runtimes.registry import make_runtime


def _graph_io(path):
    model = onnx.load(path)
    (inp,), (out,) = model.graph.input, model.graph.output
    return model, inp, out


@pytest.mark.parametrize("which", ["fp32", "fp16"])
def test_graph_io_types_and_dynamic_batch(artifacts, which):
    path = artifacts.export.onnx_path if which == "fp32" else artifacts.export.fp16_path
    model, inp, out = _graph_io(path)
    assert inp.name == "obs" and inp.type.tensor_type.elem_type == onnx.TensorProto.UINT8
    assert out.name == "q_values" and out.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    in_dims = [d.dim_param or d.dim_value for d in inp.type.tensor_type.shape.dim]
    out_dims = [d.dim_param or d.dim_value for d in out.type.tensor_type.shape.dim]
    assert in_dims == ["batch", 4, 84, 84] and out_dims == ["batch", 4]
    onnx.checker.check_model(model, full_check=True)
    weights = {i.data_type for i in model.graph.initializer if i.dims and np.prod(i.dims) > 1000}
    assert weights == ({onnx.TensorProto.FLOAT} if which == "fp32" else {onnx.TensorProto.FLOAT16})
    # the uint8 -> float cast and the /255 are inside the graph
    ops = [n.op_type for n in model.graph.node]
    assert ops[0] == "Cast" and "Div" in ops[:3]
    assert model.graph.node[0].input[0] == "obs"


def test_export_result_records_paths_sizes_opset_and_checks(artifacts):
    result = artifacts.export
    assert result.exporter == "dynamo" and result.opset == 18
    assert result.onnx_bytes == result.onnx_path.stat().st_size
    assert result.fp16_bytes == result.fp16_path.stat().st_size
    assert 0.45 < result.fp16_bytes / result.onnx_bytes < 0.55  # half the bytes for the weights
    checks = " | ".join(result.checks)
    for expected in ("onnx.checker.check_model", "io: obs uint8", "dynamic batch axis",
                     "preprocessing in graph: Cast uint8 -> float32, Div by 255",
                     "fp16: preprocessing in graph: Cast uint8 -> float32 -> float16, Div by 255",
                     "onnxruntime CPU vs torch"):
        assert expected in checks
    assert result.verify_max_abs_diff < 1e-5
    assert result.contract_hash == artifacts.states.contract_hash
    info = inspect_onnx(result.fp16_path)
    assert info.precision == "fp16" and info.metadata["breakout.precision"] == "fp16"
    assert info.metadata["breakout.contract_hash"] == result.contract_hash
    assert info.metadata["breakout.checkpoint_sha256"] == result.checkpoint_sha256


def test_fp16_q_values_agree_with_torch(artifacts):
    obs = artifacts.states.obs
    with make_runtime("torch") as base, make_runtime("onnxruntime", intra_op_threads=1) as fp16:
        base.load(artifacts.checkpoint)
        fp16.load(artifacts.export.fp16_path)
        parity = compare_q(base.infer(obs), fp16.infer(obs), precision="fp16")
    assert parity.max_abs_diff < 1e-2
    assert parity.candidate_nonfinite == 0
    # on the FP16 weights actions may flip only where the baseline is a near tie
    assert set(parity.disagreeing_states) <= set(parity.near_tie_states)
    print(f"fp16 vs torch: max |dQ| {parity.max_abs_diff:.3g}, agreement "
          f"{parity.action_agreement}/{parity.n_states}, allclose(1e-3) {parity.elements_pass}/{parity.n_states * 4}")


def test_torchscript_exporter_and_dueling_head(tmp_path, one_torch_thread):
    import torch

    torch.manual_seed(1)
    result = export_onnx(QNetwork("dueling"), tmp_path / "dueling.onnx", exporter="torchscript",
                         fp16_path=tmp_path / "dueling.fp16.onnx")
    assert result.exporter == "torchscript" and result.verify_max_abs_diff < 1e-5
    assert inspect_onnx(result.fp16_path).inputs[0].dtype == "uint8"
    assert inspect_onnx(result.fp16_path).outputs[0].dtype == "float32"


def test_a_model_without_the_uint8_contract_is_refused(artifacts):
    model = onnx.load(artifacts.export.onnx_path)
    model.graph.input[0].type.tensor_type.elem_type = onnx.TensorProto.FLOAT
    with pytest.raises(ExportError):
        _check_model(model, "fp32")
    with pytest.raises(ValueError, match="unknown exporter"):
        export_onnx(QNetwork(), "unused.onnx", exporter="tf2onnx")
