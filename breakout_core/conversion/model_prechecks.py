"""What a user's model file must pass before anything is measured: ONNX Runtime opens it, and it runs
at every batch size a spec will feed it, giving one Q-value per action of the contract it plays (Breakout's
minimal 4, or ALE's 18 under the contract option full_action_space).

A failure is one line (`ModelRefused`) that says what to change, never ONNX Runtime's raw text
alone. A batch dimension fixed in the file (torch.onnx.export's default without `dynamic_axes`
is 1) is not a failure: everything that runs the model then feeds it in calls of that batch
(`common/batch_calls.py`), and the pre-check says so; a fixed batch too large to run is refused.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from breakout_core.common.batch_calls import fixed_batch, fixed_batch_problem, in_calls
from breakout_core.conversion.onnx_checks import one_line
from breakout_core.game.contract import (
    DEFAULT_CONTRACT,
    FULL_ACTION_NAMES,
    MINIMAL_ACTION_NAMES,
    Contract,
    contract_by_name,
)

FULL_ACTION_OPTION = "full_action_space (--set contract.full_action_space=true; in a spec, under contract:)"


class ModelRefused(ValueError):
    """A model file that cannot be measured as it is; the message says why and what to change."""


@dataclass(frozen=True)
class Precheck:
    """What the pre-check found: the batch fixed in the file (None: any) and the sizes it ran."""

    static_batch: int | None
    batch_sizes: tuple[int, ...]

    def note(self) -> str | None:
        """The line that says how a fixed batch is fed, or None when the batch is free."""
        if self.static_batch is None:
            return None
        return (f"its batch dimension is fixed at {self.static_batch} (torch.onnx.export's default without "
                f"dynamic_axes): every batch runs as calls of {self.static_batch}")


def session(path: str | Path):
    """A one-thread CPU session of `path`; ModelRefused with the reason (and, for a known converter
    failure, the fix) when ONNX Runtime cannot load it."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    try:
        return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # noqa: BLE001 -- onnxruntime raises its own Fail, InvalidGraph, ...
        reason = f"ONNX Runtime cannot load it ({one_line(exc)})"
        raise ModelRefused(reason + (fp16_cast_fix(path) or "")) from None


def file_fixed_batch(path: str | Path) -> int | None:
    """The batch fixed in an ONNX file, read from its graph before a runtime allocates a call of it;
    ValueError where it is too large to run."""
    from breakout_core.conversion.export import inspect_onnx

    inputs = inspect_onnx(path).inputs
    batch = fixed_batch(inputs[0].shape) if inputs else None
    problem = fixed_batch_problem(batch)
    if problem:
        raise ValueError(f"{path}: {problem}")
    return batch


def fp16_cast_fix(path: str | Path) -> str | None:
    """The fix, when `path` is onnxconverter-common's FP16 conversion of a uint8-input model: the
    converter never rewrites a Cast's target type, so the Cast reading the uint8 input still makes
    float32 while the file declares its output float16 (breakout_core/conversion/fp16.py keeps that Cast in
    float32 for this reason)."""
    import onnx

    from breakout_core.conversion.onnx_checks import ModelCheckError, load_graph

    try:
        graph = load_graph(path).graph  # the graph alone: the weights' bytes are not needed to name the fix
    except ModelCheckError:
        return None
    if not graph.input or graph.input[0].type.tensor_type.elem_type != onnx.TensorProto.UINT8:
        return None
    if not any(i.data_type == onnx.TensorProto.FLOAT16 for i in graph.initializer):
        return None
    casts = [n for n in graph.node if n.op_type == "Cast" and graph.input[0].name in n.input
             and any(a.name == "to" and a.i == onnx.TensorProto.FLOAT for a in n.attribute)]
    if not casts:
        return None
    return (f"; this is onnxconverter-common's FP16 converter on a uint8-input model: it leaves the Cast "
            f"{casts[0].name!r} making float32 but declares its output float16. Convert the FP32 file again with "
            f"float16.convert_float_to_float16(model, keep_io_types=True, node_block_list=[{casts[0].name!r}])")


def output_problem(actions: int, contract: Contract, option: str | None = None) -> str | None:
    """Why a model giving `actions` Q-values cannot play `contract`'s game: it needs one per action of
    the contract's set. `option`: how the command asking turns full_action_space on (default: the
    contract option, as a spec and --set name it)."""
    wanted = contract.num_actions
    if actions == wanted:
        return None
    played = (f"{contract.name} with full_action_space plays ALE's {wanted} actions" if contract.full_action_space
              else f"{contract.name} plays Breakout's minimal {wanted} actions")
    if actions == len(FULL_ACTION_NAMES):
        return (f"it gives {actions} Q-values, ALE's full action space (full_action_space=True), and {played}; "
                f"judge it under {option or f'the contract option {FULL_ACTION_OPTION}'}")
    if actions == len(MINIMAL_ACTION_NAMES):
        return (f"it gives {actions} Q-values, Breakout's minimal action set, and {played}; leave out "
                f"{option or 'the contract option full_action_space'}")
    return f"it gives {actions} Q-values, and {played}"


def precheck(path: str | Path, batch_sizes: Iterable[int], contract: Contract | None = None,
             states: np.ndarray | None = None) -> Precheck:
    """Open `path` (uint8 (B, 4, 84, 84) in, as adapted) in ONNX Runtime and run it at each batch size,
    in calls of its fixed batch where it has one, each giving one Q-value per action of `contract`
    (default: the default contract's), and on `states` (the fixed states), giving finite Q-values
    on every one: a model with NaN or inf has no greedy action to measure. ModelRefused naming what
    is wrong."""
    from breakout_core.game.greedy import NonFiniteQ, finite_q
    contract = contract or contract_by_name(DEFAULT_CONTRACT)
    sess = session(path)
    inputs, outputs = sess.get_inputs(), sess.get_outputs()
    if len(inputs) != 1 or len(outputs) != 1:
        raise ModelRefused(f"it has {len(inputs)} inputs and {len(outputs)} outputs; the agent's model has one of each")
    static = fixed_batch(inputs[0].shape)
    problem = fixed_batch_problem(static)
    if problem:
        raise ModelRefused(problem)

    def run(obs: np.ndarray) -> np.ndarray:
        try:
            q = sess.run(None, {inputs[0].name: obs})[0]
        except Exception as exc:  # noqa: BLE001 -- the run's own error, on one line
            raise ModelRefused(f"ONNX Runtime could not run it at batch {len(obs)} ({one_line(exc)})") from None
        if q.ndim != 2 or q.shape[0] != len(obs):
            raise ModelRefused(f"its output has shape {tuple(q.shape)} for a batch of {len(obs)}; expected "
                               f"({len(obs)}, {contract.num_actions})")
        problem = output_problem(q.shape[1], contract)
        if problem:
            raise ModelRefused(problem)
        return q

    sizes = tuple(sorted({int(b) for b in batch_sizes}))
    for size in sizes:
        in_calls(run, np.zeros((size, 4, 84, 84), dtype=np.uint8), static)
    if states is not None and len(states):
        try:
            finite_q(in_calls(run, states, static), f"fixed state {{row}} of {len(states)}")
        except NonFiniteQ as exc:
            raise ModelRefused(str(exc)) from None
    return Precheck(static_batch=static, batch_sizes=sizes)


def spec_batch_sizes(measurements: Iterable[object]) -> set[int]:
    """Every batch size a spec's measurements (models or their mappings) feed a model
    (`batch_sizes`, `batch_size`), and 1."""
    sizes = {1}
    for m in measurements:
        def field(key: str, m=m):
            return m.get(key) if isinstance(m, dict) else getattr(m, key, None)

        listed, single = field("batch_sizes"), field("batch_size")
        sizes.update(b for b in (listed if isinstance(listed, list) else ()) if isinstance(b, int) and b > 0)
        if isinstance(single, int) and single > 0:
            sizes.add(single)
    return sizes
