"""The learner's arithmetic: fp32, or bf16 autocast where the CPU has bf16 instructions.

On a CPU with AMX (`amx_tile` and `amx_bf16`), oneDNN runs bf16 convolutions and matrix
products on its tile units, several times the fp32 rate. With AVX512_BF16 alone it uses
native bf16 dot products: the same arithmetic (bf16 products summed in fp32), at about
fp32's speed (x0.94 on one Intel machine, x1.19 on an AMD EPYC: docs/learner_speed.md,
sections 5 and 9). Without either it emulates them, 12x slower. So `bf16` runs where the
CPU has AMX or AVX512_BF16, and the choice records which (a run on AVX512_BF16 answers
whether bf16 learns as well, not whether it is faster); it is refused where it would be
emulated; and `auto` chooses bf16 only where AMX is present.

What bf16 changes is the online network's forward with autograd and its backward: the
gradient step's heaviest part. The weights, their gradients and Adam's moments stay fp32
(autocast casts the weights on the way in), and so do the replay, the gradient-free forwards
that make the TD targets, and the acting network's decisions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal, get_args

from breakout_core.common.cpu_flags import cpu_flags

LearnerPrecision = Literal["fp32", "bf16", "auto"]
LEARNER_PRECISIONS = get_args(LearnerPrecision)
AMX_BF16_FLAGS = ("amx_tile", "amx_bf16")  # both: the tile unit and its bf16 instructions
NATIVE_BF16_FLAG = "avx512_bf16"  # bf16 dot products without tiles: native arithmetic, fp32's speed
# the flags recorded with a choice: those that decide how fast bf16 and fp32 run here
RECORDED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")


class PrecisionUnavailable(ValueError):
    """A precision this learner's hardware lacks: one line naming what is missing."""


@dataclass(frozen=True)
class PrecisionChoice:
    requested: str  # fp32, bf16 or auto
    chosen: str  # fp32 or bf16
    reason: str
    cpu_flags: tuple[str, ...]  # of RECORDED_FLAGS, those this CPU has

    @property
    def autocast(self) -> bool:
        return self.chosen == "bf16"


def choose_learner_precision(requested: str, learner_device: str = "cpu",
                             flags: Iterable[str] | None = None) -> PrecisionChoice:
    """What the learner computes in, for `requested` on a learner at `learner_device` whose CPU
    has `flags` (this CPU's when None). Raises PrecisionUnavailable for bf16 where the CPU would
    emulate it (neither AMX nor AVX512_BF16) or on a CUDA learner."""
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
        return PrecisionChoice(requested, "fp32", f"a {learner_device} learner: auto chooses bf16 only on a CPU "
                                                  "with AMX", recorded)
    if missing:
        return PrecisionChoice(requested, "fp32", f"this CPU lacks {', '.join(missing)}: without AMX bf16 is "
                                                  "emulated or, with avx512_bf16, no reliable gain", recorded)
    return PrecisionChoice(requested, "bf16", "this CPU has AMX (amx_tile, amx_bf16)", recorded)
