"""The shipped A/A latency recording (tests/data/latency_aa_rounds.csv, written by
`benchmarks/latency_aa.py record`) cut into windows of a spec's size, and judged as `runner run`
and `runner compare` judge a measurement's rounds: the operating characteristics of the latency
rules, for tests/test_latency_operating.py and the benchmark."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from breakout_core.statistics.latency_rounds import ROUND_STATISTICS
from runner.kinds.shared.runtime_metrics import round_level_metrics, round_ratio_metrics

REPO = Path(__file__).resolve().parents[1]
RECORDING = REPO / "tests" / "data" / "latency_aa_rounds.csv"
CLOCKS = ("wall", "cpu")


@dataclass(frozen=True)
class Recording:
    calls: int  # timed calls per round and runtime
    rounds: dict[str, dict[tuple[str, str], np.ndarray]]  # runtime: {(clock, statistic): per-round values}

    @property
    def n_rounds(self) -> int:
        return len(self.rounds["a"][("wall", "p50")])

    def window(self, runtime: str, start: int, size: int, slowdown: float = 1.0) -> dict:
        """Rounds start..start+size of a runtime, in runtime_metrics.round_statistics' shape, every
        call `slowdown` times longer (so is every statistic of the round)."""
        found: dict = {("calls", None): self.calls}
        for key, values in self.rounds[runtime].items():
            found[key] = values[start:start + size] * slowdown
        return found


def read_recording(path: Path = RECORDING) -> Recording:
    import pandas as pd

    frame = pd.read_csv(path, comment="#")
    calls = set(frame["calls"])
    if len(calls) != 1:
        raise ValueError(f"{path}: rounds of different lengths {sorted(calls)}")
    rounds = {}
    for runtime, rows in frame.sort_values("round").groupby("runtime"):
        rounds[runtime] = {(clock, s): rows[f"{clock}_{s}_ms"].to_numpy(dtype=np.float64)
                           for clock in CLOCKS for s in ROUND_STATISTICS}
    return Recording(calls.pop(), rounds)


def window_outcomes(recording: Recording, verdict, size: int, slowdown: float = 1.0) -> list[str]:
    """The verdict's outcome, `b` (the candidate, `slowdown` times slower) against `a`, in each
    consecutive window of `size` rounds, decided as `runner run` decides it (its ratios to `a` and
    its own levels over the rounds)."""
    from runner.run.verdicts import decide

    outcomes = []
    for start in range(0, recording.n_rounds - size + 1, size):
        candidate = recording.window("b", start, size, slowdown)
        found = round_ratio_metrics(candidate, recording.window("a", start, size))
        found.update(round_level_metrics(candidate))
        outcomes.append(decide(verdict, found)[0])
    return outcomes


def compare_marks(recording: Recording, size: int, factor: float, slowdown: float = 1.0
                  ) -> list[dict[str, tuple[bool | None, str]]]:
    """`runner compare` of two runs: consecutive windows of `size` rounds, each a run of `b`
    against its baseline `a` (in the second, `b` `slowdown` times slower); per row metric
    (p50_ratio, cpu_p95_ratio, ...) whether it is significant (None where it cannot be judged:
    a P99 from rounds of 100 calls)
    and its mark ("worse", "better" beyond `factor`, or "")."""
    from runner.kinds.shared.latency_compare import STATISTICS, ratio_row

    marks = []
    for start in range(0, recording.n_rounds - 2 * size + 1, size):
        run_a = (recording.window("b", start, size), recording.window("a", start, size))
        run_b = (recording.window("b", start + size, size, slowdown), recording.window("a", start + size, size))
        rows = {}
        for metric, key in STATISTICS.items():
            row = ratio_row("latency", "b ÷ a", f"{metric}_ratio", *run_a, *run_b, key)
            mark = "worse" if row.changed_for_the_worse(factor) else "better" if row.changed_for_the_better(
                factor) else ""
            rows[row.metric] = (row.significant, mark)
        marks.append(rows)
    return marks
