"""Parity of Q-values between two runtimes on the same inputs: pure numpy, no runtime code.

The question of Day 23 and Day 26 is not only "how far apart are the numbers" but "does
the agent choose the same action". Both are answered here from two (N, 4) arrays computed
on the same fixed states, baseline first (e.g. PyTorch FP32), candidate second (e.g.
ONNX Runtime, TensorRT FP16).

Closeness follows Polygraphy's element-wise convention, with the baseline as reference:

    |candidate - baseline| <= atol + rtol * |baseline|

A non-finite candidate value never passes and makes the max |dQ| NaN or inf (it is never
hidden). Greedy actions break ties by the lowest action index, as numpy's and torch's
argmax do.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

FP32_TOLERANCE = (1e-5, 1e-5)  # (atol, rtol)
FP16_TOLERANCE = (1e-3, 1e-3)
# Polygraphy sets no INT8 default. Each quantized layer rounds its activations to 1/255 of their
# range, and the error adds up over the layers (about 0.1 to 0.3 in the shipped agent's Q-values,
# on states whose Q-values are about 1 to 3): 5e-2 says only that no Q-value moved far. The
# decisions are judged by agreement, and an INT8 file's worth by the games it plays.
INT8_TOLERANCE = (5e-2, 5e-2)
# bf16 keeps 8 bits of significand to fp16's 11: each rounding is 8 times coarser, and so is this.
BF16_TOLERANCE = (8e-3, 8e-3)
TOLERANCES = {"fp32": FP32_TOLERANCE, "fp16": FP16_TOLERANCE, "bf16": BF16_TOLERANCE, "int8": INT8_TOLERANCE}


def default_tolerance(precision: str) -> tuple[float, float]:
    """(atol, rtol) for a candidate's precision: 'fp32' 1e-5/1e-5, 'fp16' 1e-3/1e-3, 'bf16' 8e-3/8e-3,
    'int8' 5e-2/5e-2."""
    try:
        return TOLERANCES[precision]
    except KeyError:
        raise ValueError(f"unknown precision {precision!r}; known: {', '.join(TOLERANCES)}") from None


@dataclass(frozen=True)
class ParityResult:
    """How a candidate's Q-values compare with a baseline's on the same N states."""

    n_states: int
    n_actions: int
    atol: float
    rtol: float
    max_abs_diff: float  # over every element; NaN/inf when the candidate is not finite
    mean_abs_diff: float  # over every element
    per_state_max_abs_diff: np.ndarray  # float64 (N,)
    elements_pass: int  # elements with |a - b| <= atol + rtol * |b|
    elements_fail: int
    states_pass: int  # states whose 4 elements all pass
    states_fail: int
    candidate_nonfinite: int  # NaN or inf elements in the candidate
    baseline_actions: np.ndarray  # int64 (N,), greedy
    candidate_actions: np.ndarray  # int64 (N,), greedy
    action_agreement: int  # states whose greedy actions are equal
    action_agreement_fraction: float
    disagreeing_states: tuple[int, ...]  # state indices whose greedy actions differ
    baseline_top2_margin: np.ndarray  # float64 (N,), best minus second best baseline Q
    near_tie_states: tuple[int, ...]  # states whose baseline top-2 margin < their max |dQ|

    @property
    def allclose(self) -> bool:
        """Every element within tolerance (Polygraphy's pass/fail for one output)."""
        return self.elements_fail == 0

    def summary(self) -> dict[str, float | int | bool]:
        """The scalar fields, for a table row or a log line."""
        return {
            "n_states": self.n_states,
            "atol": self.atol,
            "rtol": self.rtol,
            "max_abs_diff": self.max_abs_diff,
            "mean_abs_diff": self.mean_abs_diff,
            "elements_pass": self.elements_pass,
            "elements_fail": self.elements_fail,
            "states_pass": self.states_pass,
            "states_fail": self.states_fail,
            "allclose": self.allclose,
            "candidate_nonfinite": self.candidate_nonfinite,
            "action_agreement": self.action_agreement,
            "action_agreement_fraction": self.action_agreement_fraction,
            "near_ties": len(self.near_tie_states),
        }


def greedy_actions(q_values: np.ndarray) -> np.ndarray:
    """argmax over actions, ties to the lowest index: int64 (N,)."""
    q_values = _as_q(q_values, "q_values")
    return np.argmax(q_values, axis=1).astype(np.int64)


def top2_margin(q_values: np.ndarray) -> np.ndarray:
    """Best minus second-best Q of each state (0 for a tie): float64 (N,). Needs >= 2 actions."""
    q_values = _as_q(q_values, "q_values").astype(np.float64)
    if q_values.shape[1] < 2:
        raise ValueError("a top-2 margin needs at least 2 actions")
    top2 = np.sort(q_values, axis=1)[:, -2:]
    return top2[:, 1] - top2[:, 0]


def compare_q(
    baseline: np.ndarray,
    candidate: np.ndarray,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    precision: str = "fp32",
) -> ParityResult:
    """Compare candidate Q-values with the baseline's, state by state.

    `atol`/`rtol` default to the tolerance of `precision` (see default_tolerance). The
    baseline must be finite: it is the reference.
    """
    baseline = _as_q(baseline, "baseline")
    candidate = _as_q(candidate, "candidate")
    if baseline.shape != candidate.shape:
        raise ValueError(f"baseline {baseline.shape} and candidate {candidate.shape} differ in shape")
    if not np.all(np.isfinite(baseline)):
        raise ValueError("baseline Q-values are not all finite; a reference must be")
    default_atol, default_rtol = default_tolerance(precision)
    atol = default_atol if atol is None else float(atol)
    rtol = default_rtol if rtol is None else float(rtol)
    if atol < 0 or rtol < 0:
        raise ValueError(f"atol and rtol must be >= 0, got {atol}, {rtol}")

    b = baseline.astype(np.float64)
    c = candidate.astype(np.float64)
    diff = np.abs(c - b)
    nonfinite = ~np.isfinite(c)
    diff_for_stats = np.where(nonfinite, np.inf, diff)  # NaN candidate counts as infinitely far
    close = (diff <= atol + rtol * np.abs(b)) & ~nonfinite
    per_state = diff_for_stats.max(axis=1)
    b_actions = greedy_actions(baseline)
    c_actions = np.where(nonfinite.any(axis=1), -1, greedy_actions(np.where(nonfinite, -np.inf, c)))
    agree = b_actions == c_actions
    margin = top2_margin(baseline)
    n = baseline.shape[0]
    return ParityResult(
        n_states=n,
        n_actions=baseline.shape[1],
        atol=atol,
        rtol=rtol,
        max_abs_diff=float(diff_for_stats.max()),
        mean_abs_diff=float(diff_for_stats.mean()),
        per_state_max_abs_diff=per_state,
        elements_pass=int(close.sum()),
        elements_fail=int(close.size - close.sum()),
        states_pass=int(close.all(axis=1).sum()),
        states_fail=int(n - close.all(axis=1).sum()),
        candidate_nonfinite=int(nonfinite.sum()),
        baseline_actions=b_actions,
        candidate_actions=c_actions.astype(np.int64),
        action_agreement=int(agree.sum()),
        action_agreement_fraction=float(agree.mean()),
        disagreeing_states=tuple(int(i) for i in np.flatnonzero(~agree)),
        baseline_top2_margin=margin,
        near_tie_states=tuple(int(i) for i in np.flatnonzero(margin < per_state)),
    )


def first_divergence(actions_a: Sequence[int] | np.ndarray, actions_b: Sequence[int] | np.ndarray) -> int | None:
    """Index of the first step where two action sequences differ; None when they never do.

    Sequences of different lengths that agree on the shorter one diverge at its length
    (one trajectory went on where the other stopped).
    """
    a = np.asarray(actions_a).reshape(-1)
    b = np.asarray(actions_b).reshape(-1)
    common = min(a.size, b.size)
    differs = np.flatnonzero(a[:common] != b[:common])
    if differs.size:
        return int(differs[0])
    return None if a.size == b.size else int(common)


def _as_q(array: np.ndarray, what: str) -> np.ndarray:
    array = np.asarray(array)
    if array.ndim != 2 or array.shape[0] == 0 or array.shape[1] == 0:
        raise ValueError(f"{what} must be a non-empty (N, actions) array, got shape {array.shape}")
    if not np.issubdtype(array.dtype, np.floating):
        raise ValueError(f"{what} must be floating point, got {array.dtype}")
    return array
