"""A/A latency: the same FP32 file timed against itself, and how often the latency rules call it
slower.

    python benchmarks/latency_aa.py record [--rounds 1260] [--calls 100] [--session-rounds 60]
    python benchmarks/latency_aa.py [judge] [--data tests/data/latency_aa_rounds.csv] [--slowdown 1.25]
    python benchmarks/latency_aa.py live [--runs 21]

`record` loads models/reference/dqn_breakout.onnx twice on ONNX Runtime's CPU provider (one
intra-op thread each, as specs/check_onnx.yaml runs it) as runtimes `a` and `b` (both loaded
anew every --session-rounds rounds, as each run of a spec loads its own), and times
them in interleaved rounds through the latency kind's own path (Runtime.timed_runs: wall time
and thread CPU time of every batch-1 call, on day22's first fixed state), their order in each
round drawn by breakout_core.statistics.latency_rounds.round_order. It writes each round's P50, P95,
P99 and mean of both clocks per runtime, with the machine and its load in the header.

`judge` (the default) cuts the recorded rounds into consecutive windows of the size
specs/check_onnx.yaml measures (its rounds and calls per round) and judges every window:
- by check_onnx's latency verdict (its rules, decided as `runner run` decides them) on `b`
  against `a`, unchanged, slower by the verdict's margin (1.1) and by --slowdown;
- by `runner compare`'s latency rows on two unchanged runs (consecutive windows): how often a
  row is significant, and how often `--fail-on-regression 1.1` would fail.
tests/test_latency_operating.py asserts these rates on the shipped recording.

`live` does the same end to end: --runs real `runner run`s of check_onnx's latency measurement
and verdict (the reference FP32 file as both candidate and baseline) into a temporary database,
then `runner compare` of each run with the next; it prints the outcomes and the rates.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

from breakout_core.common.cpu_flags import cpu_flags, cpu_model

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "latency_aa_rounds.csv"
ONNX = REPO / "models" / "reference" / "dqn_breakout.onnx"
STATES = REPO / "models" / "reference" / "fixed_states_60.npz"
CLOCKS = ("wall", "cpu")


def _cpu_flags() -> str:
    wanted = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")
    return f"{cpu_model() or '?'}; {os.cpu_count()} cores; " + " ".join(f for f in wanted if f in cpu_flags())


def _sessions() -> dict:
    from breakout_core.runtimes.registry import make_runtime

    return {name: make_runtime("onnxruntime", provider="cpu", intra_op_threads=1).load(ONNX) for name in ("a", "b")}


def record(rounds: int, calls: int, warmup: int, out: Path, seed: int, session_rounds: int) -> None:
    """Both runtimes are loaded anew every `session_rounds` rounds, as each run loads its own: two
    sessions of one file differ in speed by a few percent, and that differs from load to load."""
    from breakout_core.statistics.latency_rounds import ROUND_STATISTICS, round_order, round_statistic

    obs = np.ascontiguousarray(np.load(STATES)["obs"][:1])
    runtimes: dict = {}
    load_before, started = os.getloadavg(), time.time()
    lines = []
    for r in range(rounds):
        if r % session_rounds == 0:
            for runtime in runtimes.values():
                runtime.close()
            runtimes = _sessions()
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
        f"order seed {seed}; both loaded anew every {session_rounds} rounds;\n"
        f"# recorded by benchmarks/latency_aa.py record in {seconds:.0f} s on {_cpu_flags()};\n"
        f"# python {platform.python_version()}; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        "(a machine shared with other jobs)\n"
        f"round,turn,runtime,calls,{header}\n" + "\n".join(lines) + "\n")
    print(f"{out}: {rounds} rounds in {seconds:.0f} s, load {load_before[0]:.1f} -> {load_after[0]:.1f}")


def _rate(flags: list[bool]) -> str:
    return f"{sum(flags)}/{len(flags)} ({sum(flags) / len(flags):.0%})"


def judge(data: Path, slowdown: float) -> None:
    from collections import Counter

    sys.path.insert(0, str(REPO / "tests"))
    from latency_recording import compare_marks, read_recording, window_outcomes

    from runner.spec.document import load_spec
    from runner.spec.fields import VerdictSpec

    recording = read_recording(data)
    spec = load_spec(REPO / "specs" / "check_onnx.yaml").spec
    verdict = next(v for v in spec.verdicts if v.measurement == "latency")
    measurement = next(m for m in spec.measurements if m.name == "latency")
    if measurement.iterations // measurement.rounds != recording.calls:
        raise SystemExit(f"check_onnx times rounds of {measurement.iterations // measurement.rounds} calls, "
                         f"{data} holds rounds of {recording.calls}: record again with --calls")
    print(f"{data}: {recording.n_rounds} rounds of {recording.calls} calls; windows of {measurement.rounds} rounds "
          f"(specs/check_onnx.yaml); verdict {verdict.name}: {dict(verdict.deployment_worthy_when)}")
    for factor in (1.0, 1.1, slowdown):
        outcomes = window_outcomes(recording, verdict, measurement.rounds, factor)
        counts = Counter(outcomes)
        print(f"  candidate x{factor:g}: {len(outcomes)} windows, " + ", ".join(
            f"{o} {counts[o]} ({counts[o] / len(outcomes):.0%})" for o in
            ("deployment-worthy", "inconclusive", "rejected") if counts[o]))
    former = VerdictSpec(name="former", measurement="latency", candidate="candidate", baseline="baseline",
                         deployment_worthy_when={"latency_p50_ratio": "<= 1.1", "latency_p95_ratio": "<= 1.1"})
    outcomes = window_outcomes(recording, former, 5)
    print(f"  the former rule (point estimates of P50 and wall-time P95 <= 1.1, windows of 5 rounds), candidate x1: "
          f"rejected {_rate([o == 'rejected' for o in outcomes])}")
    pairs = compare_marks(recording, measurement.rounds, 1.1)
    print(f"runner compare of two unchanged runs (consecutive windows), {len(pairs)} pairs, factor 1.1:")
    for metric in pairs[0]:
        marks = [pair[metric] for pair in pairs]
        if all(s is None for s, _ in marks):
            print(f"  {metric:>15}: not judged (rounds of {recording.calls} calls are too few for it)")
            continue
        print(f"  {metric:>15}: significant {_rate([bool(s) for s, _ in marks])}, worse or better beyond 1.1 "
              f"{_rate([m != '' for _, m in marks])}")
    slower = compare_marks(recording, measurement.rounds, 1.1, slowdown)
    for metric in ("p50_ratio", "cpu_p95_ratio"):
        print(f"  run B x{slowdown:g}, {metric}: worse beyond 1.1 {_rate([p[metric][1] == 'worse' for p in slower])}")


def live(runs: int) -> None:
    """`runner run` of check_onnx's latency measurement and verdict alone, the reference file as both
    candidate and baseline, `runs` times; then `runner compare` of each run with the next."""
    import tempfile
    from collections import Counter

    import yaml
    from click.testing import CliRunner

    from runner.cli.commands import main as runner_main
    from runner.compare.runs import compare_runs
    from runner.spec.yaml_source import read_spec_text
    from runner.store.database import Store

    check = read_spec_text((REPO / "specs" / "check_onnx.yaml").read_text())
    runtimes = {name: check["runtimes"][name] for name in ("baseline", "candidate")}
    spec = {"name": "latency_aa", "contract": {"name": "breakout-v3"},
            "artifacts": {"baseline": {"path": str(ONNX), "made_by": "day22_export"},
                          "candidate": {"path": str(ONNX), "made_by": "day22_export"},
                          "fixed_states": {"path": str(STATES), "made_by": "day22_export"}},
            "runtimes": runtimes,
            "measurements": [m for m in check["measurements"] if m["name"] == "latency"],
            "verdicts": [v for v in check["verdicts"] if v["measurement"] == "latency"]}
    with tempfile.TemporaryDirectory() as folder:
        path, db = Path(folder, "latency_aa.yaml"), Path(folder, "aa.duckdb")
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        started = time.time()
        for i in range(runs):
            result = CliRunner().invoke(runner_main, ["run", str(path), "--db", str(db), "--no-report"])
            if result.exit_code != 0:
                raise SystemExit(result.output)
        print(f"{runs} runs of check_onnx's latency measurement in {time.time() - started:.0f} s, "
              f"load average {os.getloadavg()[0]:.1f}; {_cpu_flags()}")
        store = Store(db)
        with store.reader() as con:
            outcomes = [o for (o,) in con.execute("SELECT outcome FROM verdicts ORDER BY decided_at").fetchall()]
            ids = [r for (r,) in con.execute("SELECT run_id FROM runs ORDER BY started_at").fetchall()]
        print(f"  verdict: {dict(Counter(outcomes))}; not deployment-worthy "
              f"{_rate([o != 'deployment-worthy' for o in outcomes])}")
        significant: dict[str, list[bool]] = {}
        marked, failed = [], []
        for a, b in zip(ids, ids[1:]):
            comparison = compare_runs(store, a, b, factor=1.1)
            for row in comparison.rows:
                if row.significant is not None:
                    significant.setdefault(row.metric, []).append(row.significant)
            marked.append(any(r.mark in ("worse", "better") for r in comparison.rows))
            failed.append(bool(comparison.regressions(1.1)))
        print(f"  runner compare of consecutive runs: worse or better beyond 1.1 {_rate(marked)}, "
              f"--fail-on-regression 1.1 fails {_rate(failed)}; significant (95% interval without 1): "
              + ", ".join(f"{metric} {_rate(flags)}" for metric, flags in significant.items()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", nargs="?", choices=["record", "judge", "live"], default="judge")
    parser.add_argument("--runs", type=int, default=21)
    parser.add_argument("--rounds", type=int, default=1260)
    parser.add_argument("--session-rounds", type=int, default=60)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=DATA)
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--slowdown", type=float, default=1.25)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    if args.action == "record":
        record(args.rounds, args.calls, args.warmup, args.out, args.seed, args.session_rounds)
    elif args.action == "live":
        live(args.runs)
    else:
        judge(args.data, args.slowdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
