"""A model whose batch dimension is fixed in its file (torch.onnx.export's default without
dynamic_axes is 1) takes calls of exactly that batch. Everything that runs a model feeds it
through `in_calls`: the runtimes, the pre-checks, the input adapter's check, the repair search,
localisation and calibration.

A fixed batch above MAX_FIXED_BATCH is refused before anything is allocated: every call holds
that many states, and ONNX Runtime takes about STATE_BYTES of memory per state of a call to run
the agent's network (a batch fixed at 16384 took 4.1 GB).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

MAX_FIXED_BATCH = 1024
STATE_BYTES = 256 * 1024  # about what one state of a call takes in ONNX Runtime (input, activations)


def fixed_batch(shape: Sequence[object] | None) -> int | None:
    """The batch a model input's shape fixes (its first dimension, a positive integer); None when
    the batch is free (a named or unset dimension)."""
    first = shape[0] if shape else None
    return first if isinstance(first, int) and not isinstance(first, bool) and first > 0 else None


def fixed_batch_problem(batch: int | None) -> str | None:
    """Why a model whose batch is fixed at `batch` cannot be run here (None: it can)."""
    if batch is None or batch <= MAX_FIXED_BATCH:
        return None
    return (f"its batch dimension is fixed at {batch}: every call would hold {batch} states, about "
            f"{batch * STATE_BYTES / 2**30:.3g} GiB at ~{STATE_BYTES // 1024} KiB per state; the largest fixed batch "
            f"run is {MAX_FIXED_BATCH}: export it with a dynamic batch (dynamic_axes) or a smaller fixed one")


def in_calls(run: Callable[[np.ndarray], np.ndarray], states: np.ndarray, batch: int | None, *,
             repeat_states: bool = False) -> np.ndarray:
    """`run` on `states` in calls of exactly `batch` states (None: one call of all), the results
    concatenated along the batch. The last call is filled up with zeros, whose rows are dropped,
    or with `states` from the first again where `repeat_states` (calibration: every call then
    holds only real states)."""
    if batch is None or len(states) == batch:
        return run(states)
    return np.concatenate([run(call) for call in calls(states, batch, repeat_states=repeat_states)])[: len(states)]


def calls(states: np.ndarray, batch: int, *, repeat_states: bool = False) -> list[np.ndarray]:
    """`states` cut into calls of exactly `batch`, the last one filled as `in_calls` says."""
    short = -len(states) % batch
    if short:
        fill = np.resize(states, (short, *states.shape[1:])) if repeat_states \
            else np.zeros((short, *states.shape[1:]), dtype=states.dtype)
        states = np.concatenate([states, fill])
    return [states[i:i + batch] for i in range(0, len(states), batch)]


def session_q(session, states: np.ndarray) -> np.ndarray:
    """An ONNX Runtime session's first output on `states`, a call per state (batch 1, as a game
    decides), or in calls of the file's fixed batch where it has one."""
    feed = session.get_inputs()[0]
    batch = fixed_batch(feed.shape) or 1
    return in_calls(lambda call: session.run(None, {feed.name: call})[0], states, batch)
