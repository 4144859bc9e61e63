"""A/A latency: the same FP32 file timed against itself, and how often the latency rules call it
slower.

    python benchmarks/latency_aa.py record [--rounds 1200] [--calls 100] [--out tests/data/latency_aa_rounds.csv]
    python benchmarks/latency_aa.py [--data tests/data/latency_aa_rounds.csv] [--slowdown 1.25]

`record` loads models/reference/dqn_breakout.onnx twice on ONNX Runtime's CPU provider (one
intra-op thread each, as specs/check_onnx.yaml runs it) as runtimes `a` and `b`, and times
them in interleaved rounds through the latency kind's own path (Runtime.timed_runs: wall time
and thread CPU time of every batch-1 call, on day22's first fixed state), their order in each
round drawn by breakout_core.latency_rounds.round_order. It writes each round's P50, P95,
P99 and mean of both clocks per runtime, with the machine and its load in the header.

Without `record`, the recorded rounds are cut into consecutive windows of the size
specs/check_onnx.yaml measures (its rounds and calls per round) and every window is judged:
- by check_onnx's latency verdict (its rules, decided as `runner run` decides them) on `b`
  against `a`, unchanged and with `b` slowed by --slowdown (every call of the round times it);
- by `runner compare`'s latency rows on two unchanged runs (consecutive windows, each runtime
  against itself): how often a row is marked significant, and how often
  `--fail-on-regression 1.1` would fail.
It prints the rates; tests/test_latency_operating.py asserts them on the shipped recording.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "latency_aa_rounds.csv"
ONNX = REPO / "models" / "reference" / "dqn_breakout.onnx"
STATES = REPO / "models" / "reference" / "fixed_states_60.npz"
CLOCKS = ("wall", "cpu")


def _cpu_flags() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown"
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    return f"{model}; {os.cpu_count()} cores; " + " ".join(f for f in wanted if f in flags)


def record(rounds: int, calls: int, warmup: int, out: Path, seed: int) -> None:
    from breakout_core.latency_rounds import ROUND_STATISTICS, round_order, round_statistic
    from breakout_core.runtimes import make_runtime

    obs = np.ascontiguousarray(np.load(STATES)["obs"][:1])
    runtimes = {name: make_runtime("onnxruntime", provider="cpu", intra_op_threads=1).load(ONNX)
                for name in ("a", "b")}
    load_before, started = os.getloadavg(), time.time()
    lines = []
    for r in range(rounds):
        for turn, name in enumerate(round_order(list(runtimes), seed, r)):
            result = runtimes[name].timed_runs(obs, warmup, calls)
            values = [round_statistic(s, stat) for s in (result.samples_ms, result.cpu_ms)
                      for stat in ROUND_STATISTICS]
            lines.append(f"{r},{turn},{name},{calls}," + ",".join(f"{v:.5f}" for v in values))
    seconds, load_after = time.time() - started, os.getloadavg()
    for runtime in runtimes.values():
        runtime.close()
    header = ",".join(f"{clock}_{stat}_ms" for clock in CLOCKS for stat in ROUND_STATISTICS)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        f"# A/A latency: {ONNX.relative_to(REPO)} against itself, ONNX Runtime CPU, 1 intra-op thread, batch 1;\n"
        f"# {rounds} interleaved rounds of {calls} timed calls ({warmup} untimed first) per runtime, "
        f"order seed {seed};\n"
        f"# recorded by benchmarks/latency_aa.py record in {seconds:.0f} s on {_cpu_flags()};\n"
        f"# python {platform.python_version()}; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        "(a machine shared with other jobs)\n"
        f"round,turn,runtime,calls,{header}\n" + "\n".join(lines) + "\n")
    print(f"{out}: {rounds} rounds in {seconds:.0f} s, load {load_before[0]:.1f} -> {load_after[0]:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", nargs="?", choices=["record", "judge"], default="judge")
    parser.add_argument("--rounds", type=int, default=1200)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DATA)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--slowdown", type=float, default=1.25)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    if args.action == "record":
        record(args.rounds, args.calls, args.warmup, args.out, args.seed)
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
