"""The learner's arithmetic: fp32, or bf16 autocast where the CPU has bf16 instructions.

`bf16` runs where the CPU computes bf16 natively (AMX, or AVX512_BF16's dot products), and the
choice records which; it is refused where it would be emulated (12x slower). `auto` decides by
timing: where bf16 is native it times a burst of the trainer's own gradient step in each
precision (learning.trainer.precision_timings) and takes bf16 only where it is faster by more than
AUTO_MARGIN, fp32 on a tie; where bf16 would be emulated there is nothing to time. A rule over
CPU flags guessed right on one machine and wrong on another: AVX512_BF16 alone ran x0.94 on an
Intel machine and x1.19 on an AMD EPYC (docs/learner_speed.md). The timings, the margin and
the choice are stored with the training attempt.

What bf16 changes is the online network's forward with autograd and its backward: the
gradient step's heaviest part. The weights, their gradients and Adam's moments stay fp32
(autocast casts the weights on the way in), and so do the replay, the gradient-free forwards
that make the TD targets, and the acting network's decisions.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from breakout_core.common.cpu_flags import cpu_flags

LearnerPrecision = Literal["fp32", "bf16", "auto"]
LEARNER_PRECISIONS = get_args(LearnerPrecision)
AMX_BF16_FLAGS = ("amx_tile", "amx_bf16")  # both: the tile unit and its bf16 instructions
NATIVE_BF16_FLAG = "avx512_bf16"  # bf16 dot products without tiles: native arithmetic, fp32's speed
# the flags recorded with a choice: those that decide how fast bf16 and fp32 run here
RECORDED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
AUTO_MARGIN = 0.05  # auto takes bf16 only where its step is faster than fp32's by more than this share


class PrecisionUnavailable(ValueError):
    """A precision this learner's hardware lacks: one line naming what is missing."""


@dataclass(frozen=True)
class PrecisionChoice:
    requested: str  # fp32, bf16 or auto
    chosen: str  # fp32 or bf16
    reason: str
    cpu_flags: tuple[str, ...]  # of RECORDED_FLAGS, those this CPU has
    timings: dict[str, float] | None = None  # auto's measurement: ms a gradient step in each, and the margin

    @property
    def autocast(self) -> bool:
        return self.chosen == "bf16"


def auto_by_timings(fp32_ms: float, bf16_ms: float, margin: float = AUTO_MARGIN) -> tuple[str, str]:
    """(chosen, reason) of auto from the ms a gradient step took in each precision: bf16 only
    where it is faster by more than `margin`, fp32 on a tie or where bf16 is slower."""
    speedup = fp32_ms / bf16_ms
    timed = f"a gradient step took {fp32_ms:.2f} ms in fp32 and {bf16_ms:.2f} ms in bf16 here (x{speedup:.2f})"
    if speedup > 1 + margin:
        return "bf16", f"{timed}: bf16 is faster by more than {margin:.0%}"
    return "fp32", f"{timed}: bf16 is not faster by more than {margin:.0%}"


def choose_learner_precision(requested: str, learner_device: str = "cpu", flags: Iterable[str] | None = None,
                             timings: Callable[[], dict[str, float]] | None = None) -> PrecisionChoice:
    """What the learner computes in, for `requested` on a learner at `learner_device` whose CPU
    has `flags` (this CPU's when None). Raises PrecisionUnavailable for bf16 where the CPU would
    emulate it (neither AMX nor AVX512_BF16) or on a CUDA learner. `auto` where bf16 is native
    calls `timings` for {"fp32_ms", "bf16_ms"} and decides by them; without it (a spec being
    validated, before any training) it says fp32 until timed."""
    if requested not in LEARNER_PRECISIONS:
        raise PrecisionUnavailable(f"unknown learner_precision {requested!r}; known: {', '.join(LEARNER_PRECISIONS)}")
    have = frozenset(cpu_flags() if flags is None else flags)
    recorded = tuple(f for f in RECORDED_FLAGS if f in have)
    missing = [f for f in AMX_BF16_FLAGS if f not in have]
    on_cpu = learner_device == "cpu"
    if requested == "fp32":
        return PrecisionChoice(requested, "fp32", "requested", recorded)
    if requested == "bf16":
        if not on_cpu:
            raise PrecisionUnavailable(f"learner_precision bf16 is for a CPU learner, not learner_device "
                                       f"{learner_device}: use fp32")
        if not missing:
            return PrecisionChoice(requested, "bf16", "requested; this CPU has AMX", recorded)
        if NATIVE_BF16_FLAG in have:
            return PrecisionChoice(requested, "bf16", f"requested; this CPU has {NATIVE_BF16_FLAG} but lacks "
                                                      f"{', '.join(missing)}: native bf16 arithmetic at about "
                                                      "fp32's speed, not AMX's", recorded)
        raise PrecisionUnavailable(f"learner_precision bf16 needs a CPU with AMX or {NATIVE_BF16_FLAG}; this CPU "
                                   f"lacks {', '.join(missing)} and {NATIVE_BF16_FLAG} (emulated bf16 ran 12x "
                                   "slower than fp32): use fp32 or auto")
    if not on_cpu:
        return PrecisionChoice(requested, "fp32", f"a {learner_device} learner: auto times bf16 only on a CPU "
                                                  "learner", recorded)
    if missing and NATIVE_BF16_FLAG not in have:
        return PrecisionChoice(requested, "fp32", f"this CPU lacks {', '.join(missing)} and {NATIVE_BF16_FLAG}: "
                                                  "bf16 would be emulated (12x slower), nothing to time", recorded)
    if timings is None:
        return PrecisionChoice(requested, "fp32", "bf16 is native here: auto times both as training starts",
                               recorded)
    measured = timings()
    chosen, reason = auto_by_timings(measured["fp32_ms"], measured["bf16_ms"])
    return PrecisionChoice(requested, chosen, reason, recorded, {**measured, "margin": AUTO_MARGIN})
