"""Layer-wise localisation: where in the network a converted model (FP16, INT8) departs from
its FP32 baseline.

Every intermediate tensor of both graphs is made a graph output (in temporary copies; the
files are never changed) and both run on ONNX Runtime's CPU provider, one state at a time
(batch 1, as the agent plays; a dynamically quantized model's activation scales depend on
the whole batch). A baseline tensor is matched with the candidate tensor of the same name,
followed through the conversion nodes that the converters insert after it (Cast,
QuantizeLinear, DequantizeLinear) to the last float tensor of that chain: INT8 QDQ's
`X_DequantizeLinear_Output` for `X` (the value the next layer actually reads), FP16's
float16 `X` cast back to float32. A baseline tensor with no counterpart (a Relu that the QDQ
quantizer folded into the Conv before it) is listed as unmatched.

Exposing a tensor can change what ONNX Runtime runs: a QDQ group whose tensor is a graph
output is no longer fused into an integer kernel and runs as DequantizeLinear -> float op
-> QuantizeLinear. `exposure_max_abs_diff` says how much that moved the candidate's own
output on these states.

Per matched tensor, over all states: max abs error, relative L2 error ||c - b|| / ||b||,
cosine similarity and SQNR (10 log10 of signal over error power, dB), and its depth (the
index of its producing node in the baseline graph, which ONNX keeps in topological order).
Per state asked about (e.g. those whose greedy action flipped): the shallowest tensor whose
error for that state passes a tolerance.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from breakout_core.common.batch_calls import calls, fixed_batch
from breakout_core.common.files import write_whole

CONVERSION_OPS = frozenset({"Cast", "QuantizeLinear", "DequantizeLinear"})
STATE_METRICS = ("rel_l2", "max_abs")
DEFAULT_TOLERANCE = {"rel_l2": 0.01, "max_abs": 0.01}


class LocaliseError(ValueError):
    """Intermediate tensors of these models cannot be exposed or compared."""


@dataclass(frozen=True)
class LayerError:
    """How far one baseline tensor's counterpart in the candidate is from it, over all states."""

    tensor: str  # baseline tensor name
    candidate_tensor: str  # its counterpart in the candidate graph
    node: str  # the baseline node that produces it
    op_type: str
    depth: int  # index of that node in the baseline graph (topological order)
    max_abs: float
    rel_l2: float
    cosine: float
    sqnr_db: float  # inf when there is no error


@dataclass(frozen=True)
class Localisation:
    layers: tuple[LayerError, ...]  # by depth
    unmatched: tuple[str, ...]  # baseline tensors with no counterpart in the candidate
    state_errors: np.ndarray  # float64 (n_states, n_layers): each state's error per layer, `metric`
    metric: str  # "rel_l2" or "max_abs": the per-state error
    tolerance: float
    first_divergence: dict[int, str | None]  # per state asked about: first tensor past the tolerance, None if none
    exposure_max_abs_diff: float  # candidate output with every tensor exposed vs as written

    def first_layer(self, tolerance: float | None = None) -> LayerError | None:
        """The shallowest layer whose error over all states (`metric`) passes the tolerance."""
        tolerance = self.tolerance if tolerance is None else tolerance
        for layer in self.layers:
            if (layer.rel_l2 if self.metric == "rel_l2" else layer.max_abs) > tolerance:
                return layer
        return None

    def rows(self) -> list[dict[str, float | int | str]]:
        """One dict per layer, for a table."""
        return [vars(layer).copy() for layer in self.layers]


def localise(
    baseline_path: str | Path,
    candidate_path: str | Path,
    states: np.ndarray,
    *,
    flipped: Sequence[int] = (),
    metric: str = "rel_l2",
    tolerance: float | None = None,
) -> Localisation:
    """Compare every intermediate tensor of candidate and baseline on `states` (uint8 (N, 4, 84, 84)).

    `flipped`: indices into `states` whose first divergent layer is wanted. `metric` is the
    per-state error for that: "rel_l2" or "max_abs" (tolerance default 0.01 for either).
    """
    if metric not in STATE_METRICS:
        raise ValueError(f"unknown metric {metric!r}; known: {', '.join(STATE_METRICS)}")
    tolerance = DEFAULT_TOLERANCE[metric] if tolerance is None else float(tolerance)
    states = np.ascontiguousarray(states)
    if states.ndim < 2 or len(states) == 0:
        raise ValueError(f"states must be a non-empty batch, got shape {states.shape}")
    flipped = [int(i) for i in flipped]
    outside = [i for i in flipped if not 0 <= i < len(states)]
    if outside:
        raise ValueError(f"flipped state {outside[0]} is outside 0..{len(states) - 1}")
    baseline, candidate = _load(baseline_path), _load(candidate_path)
    tensors = _float_tensors(baseline)
    matches = _counterparts(candidate, tensors)
    matched = [t for t in tensors if matches[t] is not None]
    if not matched:
        raise LocaliseError(f"no tensor of {Path(baseline_path).name} has a counterpart in {Path(candidate_path).name}")
    candidate_output = candidate.graph.output[0].name
    with tempfile.TemporaryDirectory(prefix="localise-") as folder:
        base_session = _exposed_session(baseline, matched, Path(folder) / "baseline.onnx", baseline_path)
        cand_session = _exposed_session(candidate, [matches[t] for t in matched], Path(folder) / "candidate.onnx",
                                        candidate_path)
        plain_session = _exposed_session(candidate, [], Path(folder) / "plain.onnx", candidate_path)
    base_input, cand_input = base_session.get_inputs()[0], cand_session.get_inputs()[0]

    def outputs(session, feed, state: np.ndarray, names: list[str] | None = None) -> dict[str, np.ndarray]:
        """The session's outputs (all, or `names`) on one state, run in a call of the file's fixed batch."""
        found = session.run(names, {feed.name: calls(state, fixed_batch(feed.shape) or 1)[0]})
        return {name: value[:1] for name, value in zip(names or [o.name for o in session.get_outputs()], found)}

    sums = np.zeros((len(matched), 4))  # per layer: sum b^2, sum (c - b)^2, sum b * c, sum c^2
    max_abs = np.zeros(len(matched))
    state_errors = np.zeros((len(states), len(matched)))
    exposure = 0.0
    for i in range(len(states)):
        state = states[i:i + 1]
        base = outputs(base_session, base_input, state)
        cand = outputs(cand_session, cand_input, state)
        plain = outputs(plain_session, cand_input, state, [candidate_output])[candidate_output]
        exposure = max(exposure, float(np.max(np.abs(plain.astype(np.float64) - cand[candidate_output]))))
        for k, tensor in enumerate(matched):
            b = base[tensor].astype(np.float64).reshape(-1)
            c = cand[matches[tensor]].astype(np.float64).reshape(-1)
            if b.shape != c.shape:
                raise LocaliseError(f"{tensor}: shape {base[tensor].shape} in the baseline, "
                                    f"{cand[matches[tensor]].shape} in the candidate ({matches[tensor]})")
            d = c - b
            sums[k] += (b @ b, d @ d, b @ c, c @ c)
            err = float(np.max(np.abs(d))) if d.size else 0.0
            max_abs[k] = max(max_abs[k], err)
            state_errors[i, k] = _ratio(np.sqrt(d @ d), np.sqrt(b @ b)) if metric == "rel_l2" else err
    producers = {o: (n, depth) for depth, n in enumerate(baseline.graph.node) for o in n.output}
    layers = []
    for k, tensor in enumerate(matched):
        node, depth = producers[tensor]
        signal, noise, dot, cand_power = sums[k]
        layers.append(LayerError(
            tensor=tensor,
            candidate_tensor=matches[tensor],
            node=node.name,
            op_type=node.op_type,
            depth=depth,
            max_abs=float(max_abs[k]),
            rel_l2=_ratio(np.sqrt(noise), np.sqrt(signal)),
            cosine=1.0 if signal == 0 and cand_power == 0 else _ratio(dot, np.sqrt(signal * cand_power)),
            sqnr_db=float("inf") if noise == 0 else (float(10 * np.log10(signal / noise)) if signal else -float("inf")),
        ))
    first = {}
    for i in flipped:
        passed = np.flatnonzero(state_errors[i] > tolerance)
        first[i] = matched[passed[0]] if passed.size else None
    return Localisation(
        layers=tuple(layers),
        unmatched=tuple(t for t in tensors if matches[t] is None),
        state_errors=state_errors,
        metric=metric,
        tolerance=tolerance,
        first_divergence=first,
        exposure_max_abs_diff=exposure,
    )


def _load(path: str | Path):
    import onnx

    try:
        model = onnx.load(path)
    except Exception as exc:  # protobuf, OS and onnx errors alike: the file is not a model
        raise LocaliseError(f"{path}: not an ONNX model ({_one_line(exc)}); intermediate tensors can only be exposed "
                            "in an ONNX graph run by onnxruntime") from None
    if not model.graph.node:
        raise LocaliseError(f"{path}: an ONNX model without nodes")
    if len(model.graph.input) != 1 or len(model.graph.output) != 1:
        raise LocaliseError(f"{path}: expected one input and one output, got {len(model.graph.input)} and "
                            f"{len(model.graph.output)}")
    return model


def _float_tensors(model) -> list[str]:
    """The float outputs of every node of a model, in graph order (types from shape inference)."""
    types = _tensor_types(model)
    return [o for n in model.graph.node for o in n.output if o and types.get(o) in _float_types()]


def _counterparts(candidate, tensors: Sequence[str]) -> dict[str, str | None]:
    """Each tensor's counterpart in the candidate: the same name, followed through a chain of
    conversion nodes (each its tensor's only consumer) to its last float tensor; None when the
    candidate has no tensor of that name."""
    consumers: dict[str, list] = {}
    for node in candidate.graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    produced = {o for n in candidate.graph.node for o in n.output}
    types, floats = _tensor_types(candidate), _float_types()
    found: dict[str, str | None] = {}
    for tensor in tensors:
        best = tensor if tensor in produced and types.get(tensor) in floats else None
        current = tensor
        while tensor in produced and len(consumers.get(current, [])) == 1 \
                and consumers[current][0].op_type in CONVERSION_OPS:
            current = consumers[current][0].output[0]
            if types.get(current) in floats:
                best = current
        found[tensor] = best
    return found


def _tensor_types(model) -> dict[str, int]:
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception as exc:  # onnx's inference and validation errors
        raise LocaliseError(f"shape inference failed, so tensor types are unknown ({_one_line(exc)})") from None
    values = [*inferred.graph.value_info, *inferred.graph.output, *inferred.graph.input]
    return {v.name: v.type.tensor_type.elem_type for v in values if v.type.HasField("tensor_type")}


def _float_types() -> set[int]:
    import onnx

    return {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}


def _exposed_session(model, tensors: Sequence[str], path: Path, source: str | Path):
    """An ONNX Runtime CPU session (one thread) of a copy of `model` with `tensors` as extra outputs."""
    import onnx
    import onnxruntime as ort

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    present = {o.name for o in copy.graph.output}
    copy.graph.output.extend(onnx.ValueInfoProto(name=t) for t in tensors if t not in present)
    write_whole(path, copy.SerializeToString())
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own classes
        raise LocaliseError(f"{source}: onnxruntime cannot run it with its intermediate tensors exposed "
                            f"({_one_line(exc)})") from None


def _ratio(numerator: float, denominator: float) -> float:
    if denominator == 0:
        return 0.0 if numerator == 0 else float("inf")
    return float(numerator / denominator)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__
