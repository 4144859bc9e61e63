"""What a check of one file against another asks, and which verdicts answer it.

A file that claims to be the same model on the same precision and runtime (an FP32
re-export) is asked whether it is identical: every verdict gates. A converted file or
another runtime (FP16, INT8, TensorRT, OpenVINO) cannot be expected to decide alike on
every near-tie, so it is asked whether it is as good and not slower: the verdicts a spec
marks `diagnostic_for: [as-good]` (decisions on fixed states, a short closed loop) are shown
beside the gating ones and decide nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.spec.fields import Question

QUESTION_WORDS: dict[str, str] = {
    "identical": "is it identical? (the same decisions, the same 256 steps, as good and not slower)",
    "as-good": "is it as good and not slower? (games, stalls and latency gate; decisions and the 256 steps are "
               "shown, not gating)",
}


@dataclass(frozen=True)
class AskedQuestion:
    question: Question
    why: str

    def gating(self, spec) -> list[str]:
        """The names of the spec's verdicts that gate under this question, in the spec's order."""
        return [v.name for v in spec.verdicts if self.question not in v.diagnostic_for]


def question_for(spec, candidate: str = "candidate", baseline: str = "baseline",
                 asked: Question | None = None) -> AskedQuestion:
    """The question a check of runtime `candidate` against `baseline` asks: `asked` where the
    user names one, else identical exactly where both compute in one precision on one backend
    with the same options."""
    from runner.spec.runtimes import runtime_precision

    ours, theirs = spec.runtimes[candidate], spec.runtimes[baseline]
    precisions = runtime_precision(spec, candidate), runtime_precision(spec, baseline)
    if precisions[0] != precisions[1]:
        found = "as-good", f"the file computes in {precisions[0]}, its baseline in {precisions[1]}"
    elif (ours.runtime, ours.options()) != (theirs.runtime, theirs.options()):
        found = "as-good", (f"the file runs on {ours.runtime} {ours.options()}, its baseline on {theirs.runtime} "
                            f"{theirs.options()}")
    else:
        found = "identical", f"both compute in {precisions[0]} on {ours.runtime} with the same options"
    if asked is not None and asked != found[0]:
        return AskedQuestion(asked, f"--question {asked} (the files alone would ask {found[0]}: {found[1]})")
    return AskedQuestion(*found)
