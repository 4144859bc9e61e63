"""Repair search: the fewest nodes to keep in float so an INT8 or FP16 model is close enough to FP32.

One search for both precisions; a converter makes each candidate file: `Int8Converter`
(onnxruntime's static quantizer, `nodes_to_exclude`, breakout_core.conversion.quantize) or
`Fp16Converter` (onnxconverter-common's float16 converter, `node_block_list`, with the
post-pass that keeps a blocked node's weights and graph output float32, breakout_core.conversion.fp16).
The nodes the full conversion converts (INT8: quantizes; FP16: makes write float16) are
ranked by the effect of converting each one alone (every other node kept in float): the
mean |dQ| that this alone causes on the check states, worst first (0 for a node that is not
quantized at all on its own, such as a Reshape that runs quantized only between quantized
neighbours). Then the search converts with the k worst kept in float, k = 0, 1, 2, ...,
measures each candidate on the check states (for INT8, states disjoint from the calibration
states, so a candidate is not judged on the data that set its ranges; FP16 has no
calibration) and stops at the first that meets the target, or when the nodes left would no
longer be converted. Ranking once, by each node's own effect, costs one conversion per node;
re-ranking after each step would cost that at every step.

Each step records its greedy-action agreement and max |dQ| with FP32 on the check states
(batch 1, as the agent plays), and its batch-1 latency P50 on ONNX Runtime's CPU provider
with one thread, timed in turns with the FP32 model's (one call of each in every round), so
drift on a shared machine falls on both alike. Every figure is of what ONNX Runtime runs
with its default (all) graph optimisations, as the onnxruntime runtime loads a model: a Conv
or Gemm kept in float between quantized neighbours gets int8 weights from ONNX Runtime
itself when the session is made, and the step records which (`excluded_quantized_at_load`);
the search then goes on to the next node (an FP16 node kept in float32 has nothing of the
kind). The CPU's INT8 instruction sets are recorded with the figures (`quantize.cpu_isa`).

Between searches (one per calibration method) `choose_step` picks the file to ship from what
the check states say alone: latency moves with a shared machine's load, so a tie broken by
it would ship a different file from one run to the next.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Protocol

import numpy as np

from breakout_core.common.batch_calls import calls, fixed_batch, session_q
from breakout_core.conversion.fp16 import convert_fp16
from breakout_core.conversion.nncf_quantize import quantize_nncf
from breakout_core.conversion.quantize import NothingToQuantize, cpu_isa, quantize_int8
from breakout_core.diagnosis.latency import MIN_TIMED_CALLS, latency_result
from breakout_core.diagnosis.parity import ParityResult, compare_q


@dataclass(frozen=True)
class Candidate:
    """A converted file the search measures."""

    path: Path
    sha256: str
    nodes_converted: tuple[str, ...]  # FP32 node names that run converted: INT8 quantized, FP16 writing float16
    excluded_quantized_at_load: tuple[str, ...]  # INT8: kept-in-float nodes onnxruntime quantizes anyway; FP16: ()


class Converter(Protocol):
    """Writes a converted model of `fp32_path` at `out_path` with the named nodes kept in float."""

    precision: str  # "int8" or "fp16"
    calibration: np.ndarray | None  # the states the conversion is fitted on (INT8); None where none (FP16)

    def __call__(self, fp32_path: Path, out_path: Path, nodes_to_exclude: Sequence[str]) -> Candidate: ...


NNCF_METHOD = "nncf"  # the repair's name for NNCF's quantizer among the calibration methods


@dataclass(frozen=True, eq=False)
class Int8Converter:
    """Static QDQ INT8 calibrated on `calibration`, by onnxruntime's quantizer (quantize.quantize_int8)
    with `calibrate_method` minmax, entropy or percentile, or by NNCF's (nncf_quantize.quantize_nncf,
    its own ranges) with `calibrate_method` nncf; `keep_float` always in float."""

    calibration: np.ndarray
    calibrate_method: str = "minmax"
    per_channel: bool = True
    keep_float: tuple[str, ...] = ()
    precision: ClassVar[str] = "int8"

    def __call__(self, fp32_path: Path, out_path: Path, nodes_to_exclude: Sequence[str]) -> Candidate:
        excluded = [*self.keep_float, *nodes_to_exclude]
        if self.calibrate_method == NNCF_METHOD:
            artifact = quantize_nncf(fp32_path, out_path, calibration=self.calibration, nodes_to_exclude=excluded)
        else:
            artifact = quantize_int8(fp32_path, out_path, calibration=self.calibration,
                                     calibrate_method=self.calibrate_method, per_channel=self.per_channel,
                                     nodes_to_exclude=excluded)
        return Candidate(artifact.path, artifact.sha256, artifact.nodes_quantized,
                         artifact.excluded_quantized_at_load)


@dataclass(frozen=True)
class Fp16Converter:
    """FP16 (fp16.convert_fp16), the nodes kept in float32 with the FP32 file's weights;
    `keep_float` always in float32."""

    keep_float: tuple[str, ...] = ()
    precision: ClassVar[str] = "fp16"
    calibration: ClassVar[None] = None

    def __call__(self, fp32_path: Path, out_path: Path, nodes_to_exclude: Sequence[str]) -> Candidate:
        artifact = convert_fp16(fp32_path, out_path, keep_float=[*self.keep_float, *nodes_to_exclude])
        return Candidate(artifact.path, artifact.sha256, artifact.nodes_converted, ())


@dataclass(frozen=True)
class RepairTarget:
    """When a candidate is close enough: every bound that is set must hold on the check states."""

    min_agreement: float | None = 1.0  # fraction of check states whose greedy action is FP32's
    max_abs_dq: float | None = None  # largest |Q_converted - Q_fp32| over every state and action

    def __post_init__(self) -> None:
        if self.min_agreement is None and self.max_abs_dq is None:
            raise ValueError("a repair target needs min_agreement, max_abs_dq or both")
        if self.min_agreement is not None and not 0.0 <= self.min_agreement <= 1.0:
            raise ValueError(f"min_agreement must be in [0, 1], got {self.min_agreement}")
        if self.max_abs_dq is not None and not self.max_abs_dq >= 0:
            raise ValueError(f"max_abs_dq must be >= 0, got {self.max_abs_dq}")

    def passes(self, parity: ParityResult) -> bool:
        agree = self.min_agreement is None or parity.action_agreement_fraction >= self.min_agreement
        close = self.max_abs_dq is None or parity.max_abs_diff <= self.max_abs_dq
        return agree and close

    def describe(self) -> str:
        parts = []
        if self.min_agreement is not None:
            parts.append(f"greedy-action agreement >= {self.min_agreement:g}")
        if self.max_abs_dq is not None:
            parts.append(f"max |dQ| <= {self.max_abs_dq:g}")
        return " and ".join(parts)


@dataclass(frozen=True)
class RepairStep:
    excluded: tuple[str, ...]  # nodes kept in float by the search (a converter's own keep-list not counted)
    path: Path
    sha256: str
    nodes_converted: tuple[str, ...]  # see Candidate
    excluded_quantized_at_load: tuple[str, ...]  # INT8: kept-in-float nodes onnxruntime quantizes anyway (quantize)
    agreement: float  # greedy-action agreement with FP32 on the check states
    max_abs_dq: float
    mean_abs_dq: float
    p50_ms: float  # batch 1, one thread, timed in turns with FP32
    fp32_p50_ms: float
    passes: bool

    @property
    def latency_ratio(self) -> float:
        """Candidate P50 over FP32 P50, both from the same interleaved runs."""
        return self.p50_ms / self.fp32_p50_ms


@dataclass(frozen=True)
class RepairResult:
    precision: str  # the converter's: "int8" or "fp16"
    steps: tuple[RepairStep, ...]  # k = 0, 1, ... nodes kept in float
    order: tuple[tuple[str, float], ...]  # (node, mean |dQ| when quantized alone), worst first
    target: RepairTarget
    chosen: RepairStep | None  # the first step that meets the target; None when none did
    cpu: dict[str, bool | str | None]
    check_states: int  # those used: a check state equal to a calibration state (INT8) is left out
    check_states_dropped: int


def repair_search(
    fp32_path: str | Path,
    check_states: np.ndarray,
    out_dir: str | Path,
    *,
    convert: Converter,
    target: RepairTarget = RepairTarget(),
    latency_runs: int = 300,
) -> RepairResult:
    """Find the fewest nodes to keep in float so the converted model meets `target` on `check_states`.

    `convert` makes each candidate (e.g. `Int8Converter(calibration, calibrate_method="entropy")`
    or `Fp16Converter()`). A check state equal to one of the converter's calibration states (the
    same picture occurs in different games, e.g. before a serve) is left out and counted. Step
    files are written to `out_dir` as step_<k>.onnx; `latency_runs` timed calls per model and
    step (>= 64).
    """
    fp32_path, out_dir = Path(fp32_path), Path(out_dir)
    check_states = np.ascontiguousarray(check_states)
    if len(check_states) == 0:
        raise ValueError("repair needs check states; none were given")
    if latency_runs < MIN_TIMED_CALLS:
        raise ValueError(f"latency_runs must be >= {MIN_TIMED_CALLS}, got {latency_runs}")
    fitted = () if convert.calibration is None else np.ascontiguousarray(convert.calibration)
    calibrated = {s.tobytes() for s in fitted}
    fresh = np.array([s.tobytes() not in calibrated for s in check_states], dtype=bool)
    check_states = check_states[fresh]
    if len(check_states) == 0:
        raise ValueError("every check state is also a calibration state; check states must be others")
    out_dir.mkdir(parents=True, exist_ok=True)
    baseline = q_values(fp32_path, check_states)

    full = convert(fp32_path, out_dir / "step_0.onnx", [])
    candidates = full.nodes_converted
    scores = []
    with tempfile.TemporaryDirectory(prefix="repair-") as folder:
        for k, node in enumerate(candidates):
            others = [n for n in candidates if n != node]
            try:
                alone = convert(fp32_path, Path(folder) / f"alone_{k}.onnx", others)
            except NothingToQuantize:  # e.g. a Reshape: quantized only between quantized neighbours
                scores.append((node, 0.0))
                continue
            scores.append((node, compare_q(baseline, q_values(alone.path, check_states)).mean_abs_diff))
    order = tuple(sorted(scores, key=lambda item: -item[1]))

    steps = []
    chosen = None
    for k in range(len(order)):  # keeping every node in float would leave nothing converted
        excluded = [node for node, _ in order[:k]]
        try:
            artifact = full if k == 0 else convert(fp32_path, out_dir / f"step_{k}.onnx", excluded)
        except NothingToQuantize:  # what is left (a Reshape) is quantized only beside a quantized neighbour
            break
        parity = compare_q(baseline, q_values(artifact.path, check_states))
        p50, fp32_p50 = interleaved_p50_ms([artifact.path, fp32_path], check_states, runs=latency_runs)
        step = RepairStep(
            excluded=tuple(excluded),
            path=artifact.path,
            sha256=artifact.sha256,
            nodes_converted=artifact.nodes_converted,
            excluded_quantized_at_load=artifact.excluded_quantized_at_load,
            agreement=parity.action_agreement_fraction,
            max_abs_dq=parity.max_abs_diff,
            mean_abs_dq=parity.mean_abs_diff,
            p50_ms=p50,
            fp32_p50_ms=fp32_p50,
            passes=target.passes(parity),
        )
        steps.append(step)
        if step.passes:
            chosen = step
            break
    return RepairResult(precision=convert.precision, steps=tuple(steps), order=order, target=target, chosen=chosen,
                        cpu=cpu_isa(), check_states=len(check_states), check_states_dropped=int((~fresh).sum()))


def choose_step(results: Mapping[str | None, RepairResult]) -> tuple[str | None, RepairStep, bool]:
    """(search name, step, met the target) of the file to write: among passing steps of every
    search, the fewest nodes kept in float, then the lowest mean |dQ| on the check states; where
    none passes, the closest (highest agreement, then lowest max |dQ|, then lowest mean |dQ|).
    The search's name and the file's sha256 settle an exact tie, so the choice is the same in
    every run whose steps agree. Latency is never consulted: it is reported beside the choice."""
    steps = [(name, step) for name, result in results.items() for step in result.steps]
    if not steps:
        raise ValueError("no search made a step: nothing to choose from")

    def settled(item: tuple[str | None, RepairStep]) -> tuple[str, str]:
        return item[0] or "", item[1].sha256

    passing = [item for item in steps if item[1].passes]
    if passing:
        name, step = min(passing, key=lambda it: (len(it[1].excluded), it[1].mean_abs_dq, *settled(it)))
        return name, step, True
    name, step = min(steps, key=lambda it: (-it[1].agreement, it[1].max_abs_dq, it[1].mean_abs_dq, *settled(it)))
    return name, step, False


def q_values(path: str | Path, states: np.ndarray) -> np.ndarray:
    """A model's outputs on each state, run one state at a time, or in calls of the file's fixed batch
    (ONNX Runtime CPU, one thread)."""
    return session_q(_session(path), states)


def interleaved_p50_ms(paths: Sequence[str | Path], states: np.ndarray, *, runs: int = 300,
                       warmup: int = 20) -> tuple[float, ...]:
    """Batch-1 latency P50 (ms) of each model, ONNX Runtime CPU with one thread, timed in
    turns: each round runs every model once on the same state (states taken in rotation); a
    file with a fixed batch is timed on the one call of that batch that holds the state."""
    sessions = [_session(p) for p in paths]
    feeds = [(s.get_inputs()[0].name, fixed_batch(s.get_inputs()[0].shape) or 1) for s in sessions]
    samples = np.zeros((len(sessions), runs))
    clock = time.perf_counter_ns
    for r in range(-warmup, runs):
        state = states[r % len(states)][None]
        for m, (session, (name, batch)) in enumerate(zip(sessions, feeds)):
            call = calls(state, batch)[0]
            start = clock()
            session.run(None, {name: call})
            if r >= 0:
                samples[m, r] = (clock() - start) / 1e6
    return tuple(latency_result(s, warmup=warmup).p50_ms for s in samples)


def _session(path: str | Path):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
