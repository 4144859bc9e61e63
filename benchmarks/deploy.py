"""Deployment benchmarks, measured side by side in one process and printed as ratios.

    python benchmarks/deploy.py [--onnx models/reference/dqn_breakout.onnx] [--episodes 30]
                                [--batch 10] [--max-episode-frames N] [--calls 1000] [--repeats 15]

1. Latency harness overhead: ONNX Runtime CPU, batch 1, P50 of runtime.infer timed by
   breakout_core.diagnosis.latency.measure_latency (what the `latency` kind calls) against a bare
   `perf_counter_ns` loop around the same call, and against a bare loop around ONNX
   Runtime's own session.run (what the runtime wrapper adds: checks and an output copy).
   The three alternate in blocks, in rotating order, `--repeats` times; the median of each
   one's P50s is kept.
2. Episodes through a runtime: `--episodes` fixed seeds at epsilon 0 played by one runtime,
   batched (`--batch` games side by side, one inference per vector step, as the `episodes`
   kind plays them) against one episode at a time; episodes/minute and the ratio, and a
   check that both give the same scores.

Without --onnx and without models/reference/dqn_breakout.onnx, an untrained network is
exported to a temporary file (its episodes are then short capped games: pass
--max-episode-frames, default 4000 in that case).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
REFERENCE_ONNX = REPO / "models" / "reference" / "dqn_breakout.onnx"


def bare_loop(fn, arg, warmup: int, calls: int) -> np.ndarray:
    for _ in range(warmup):
        fn(arg)
    clock = time.perf_counter_ns
    out = np.empty(calls, dtype=np.int64)
    for i in range(calls):
        start = clock()
        fn(arg)
        out[i] = clock() - start
    return out / 1e6


def latency_overhead(onnx_path: Path, obs: np.ndarray, calls: int, repeats: int) -> None:
    from breakout_core.diagnosis.latency import measure_latency
    from breakout_core.runtimes.registry import make_runtime

    runtime = make_runtime("onnxruntime", provider="cpu", intra_op_threads=1, node_placement=False).load(onnx_path)
    session = runtime._session_obj  # ONNX Runtime's own session, for the bare-session loop
    feed_name = session.get_inputs()[0].name
    bare_session = lambda x: session.run(None, {feed_name: x})  # noqa: E731
    methods = {
        "harness (measure_latency)": lambda: measure_latency(runtime.infer, obs, warmup=50, iterations=calls).p50_ms,
        "bare loop, runtime.infer": lambda: float(np.median(bare_loop(runtime.infer, obs, 50, calls))),
        "bare loop, session.run": lambda: float(np.median(bare_loop(bare_session, obs, 50, calls))),
    }
    p50 = {k: [] for k in methods}
    names = list(methods)
    for r in range(repeats):  # the order rotates, so no method always runs first
        for key in names[r % 3:] + names[:r % 3]:
            p50[key].append(methods[key]())
    runtime.close()
    medians = {k: statistics.median(v) for k, v in p50.items()}
    print(f"\n1. ONNX Runtime CPU batch-1 latency, P50 (median of {repeats} blocks of {calls} timed calls, 1 thread)")
    for key, value in medians.items():
        print(f"   {key:28s} {value * 1000:8.1f} µs   (blocks: {', '.join(f'{v * 1000:.0f}' for v in p50[key])})")
    # blocks of one round ran back to back: their ratio is the least disturbed by a busy machine
    harness_ratio = statistics.median(
        h / b for h, b in zip(p50["harness (measure_latency)"], p50["bare loop, runtime.infer"]))
    wrapper_ratio = statistics.median(
        b / s for b, s in zip(p50["bare loop, runtime.infer"], p50["bare loop, session.run"]))
    print(f"   harness / bare loop of the same call (median of per-round ratios): {harness_ratio:.3f} "
          f"({(harness_ratio - 1) * 100:+.1f}% overhead; target < 5%)")
    print(f"   runtime.infer / bare session.run (median of per-round ratios): {wrapper_ratio:.3f} "
          "(the wrapper's input check and output copy)")


def episodes_batched_vs_sequential(onnx_path: Path, contract, episodes: int, batch: int) -> None:
    from breakout_core.evaluation.evaluator import evaluate
    from breakout_core.runtimes.registry import make_runtime
    from runner.kinds.shared.runtime_lifecycle import RuntimePolicy

    seeds = list(range(2600, 2600 + episodes))
    runtime = make_runtime("onnxruntime", provider="cpu", intra_op_threads=1, node_placement=False).load(onnx_path)
    results = {}
    for label, size in ((f"batched ({batch} games side by side)", batch), ("one episode at a time", 1)):
        policy = RuntimePolicy(runtime, "ort_cpu")
        started = time.perf_counter()
        result = evaluate(policy, seeds, contract, batch_size=size)
        wall = time.perf_counter() - started
        results[label] = (wall, result, policy)
    runtime.close()
    print(f"\n2. {episodes} episodes (seeds {seeds[0]}..{seeds[-1]}, epsilon 0, "
          f"max {contract.max_episode_frames} frames) played through ONNX Runtime CPU")
    for label, (wall, result, policy) in results.items():
        print(f"   {label:32s} {60 * episodes / wall:8.1f} episodes/min  "
              f"{result.transitions / wall:8.0f} transitions/s  "
              f"{policy.calls} inference calls for {result.transitions} transitions ({wall:.1f} s)")
    (wall_b, res_b, _), (wall_s, res_s, _) = results.values()
    same = [e.score for e in res_b.episodes] == [e.score for e in res_s.episodes]
    scores = [e.score for e in res_b.episodes]
    print(f"   batched / one at a time: {wall_s / wall_b:.2f}x episodes/minute; same scores in both: {same} "
          f"(mean {np.mean(scores):.2f}, steps {sum(e.steps for e in res_b.episodes)})")
    from breakout_core.game.driver import bare_stepping_rate

    env_b = bare_stepping_rate(contract, batch, 500)
    env_1 = bare_stepping_rate(contract, 1, 2000)
    print(f"   the env alone (random actions, no inference): {env_b:.0f} transitions/s with {batch} slots, "
          f"{env_1:.0f} with 1: the ceiling for either loop")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--onnx", type=Path, default=None, help="FP32 ONNX file (default: the reference one)")
    parser.add_argument("--episodes", type=int, default=30)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--max-episode-frames", type=int, default=None)
    parser.add_argument("--calls", type=int, default=1000, help="timed calls per latency block")
    parser.add_argument("--repeats", type=int, default=15, help="latency blocks per method")
    args = parser.parse_args()

    import torch

    from breakout_core.evaluation.fixed_states import load_fixed_states
    from breakout_core.game.contract import CONTRACTS

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        onnx_path = args.onnx or (REFERENCE_ONNX if REFERENCE_ONNX.is_file() else None)
        frames = args.max_episode_frames
        if onnx_path is None:
            from breakout_core.conversion.export import export_onnx
            from breakout_core.learning.qnetwork import QNetwork

            torch.manual_seed(0)
            onnx_path = export_onnx(QNetwork(), Path(tmp) / "untrained.onnx").onnx_path
            frames = frames or 4000
            print(f"no reference ONNX file: using an untrained network, episodes capped at {frames} frames")
        contract = CONTRACTS["breakout-v3"]
        contract = contract if frames is None else contract.replace(max_episode_frames=frames)
        states_file = onnx_path.parent / "fixed_states_60.npz"
        if states_file.is_file():
            obs = load_fixed_states(states_file).obs[:1].copy()
        else:
            obs = np.random.default_rng(0).integers(0, 256, (1, 4, 84, 84), dtype=np.uint8)
        print(f"model {onnx_path}; input: {'a fixed state' if states_file.is_file() else 'random uint8'}")
        latency_overhead(onnx_path, obs, args.calls, args.repeats)
        episodes_batched_vs_sequential(onnx_path, contract, args.episodes, args.batch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
