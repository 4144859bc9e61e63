"""`--fail-fast`: a run that stops at the first rejected gating verdict.

The measurements that gating verdicts read run first (in the spec's order, which its author
keeps cheapest first; a spec that writes files keeps its whole order, since a later
measurement may read them). After each, the verdicts on the measurements done so far are
decided; once a gating one is rejected the run ends there, stores the verdicts it reached, and
the rest are not reached. The exit status is the one the whole run would give: a rejected
gating verdict stays rejected however many games the others would have played.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FailFast:
    gating: frozenset[str]  # the verdicts whose rejection stops the run

    def order(self, spec, writes_files: bool) -> list:
        """The measurements in the order they run."""
        if writes_files:
            return list(spec.measurements)
        read = {v.measurement for v in spec.verdicts if v.name in self.gating}
        return sorted(spec.measurements, key=lambda m: m.name not in read)  # stable: the spec's order within

    def stopped_by(self, store, run_id: str, spec, measurement: str) -> str | None:
        """The first gating verdict on `measurement`, just done, that is rejected, if any."""
        from runner.run.verdicts import decide_verdicts

        return next((v["verdict"] for v in decide_verdicts(store, run_id, spec, {measurement})
                     if v["verdict"] in self.gating and v["outcome"] == "rejected"), None)


def not_reached(spec, verdicts: list[dict]) -> list[str]:
    """The spec's verdicts a stopped run did not decide."""
    decided = {v["verdict"] for v in verdicts}
    return [v.name for v in spec.verdicts if v.name not in decided]
