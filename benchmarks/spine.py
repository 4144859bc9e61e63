"""Spine benchmarks, measured side by side in one process and printed as ratios.

    python benchmarks/spine.py [--seeds 16] [--batch 4] [--repeats 5] [--contract breakout-v3]

1. Evaluator vs bare vector env: the random policy on fixed seeds through the evaluator
   (the episode driver: the contract's rules, each seed's own game) against ale-py's
   native vector env stepping random actions with its own autoreset and the same sticky
   actions on its default threads, both made beforehand: the driver's games stepped in
   this process alone, and split with a worker process (what the evaluate and episodes kinds
   get); and the evaluator making its own driver. Then what it costs to start an episode:
   the first time a seed is played in a process (a seeded ROM load) and every later time
   (restoring that state).
2. Store: appending 1,000,000 episode rows; `runner report` over a database holding them.
3. `runner --help` wall time.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from breakout_core.evaluation.evaluator import evaluate
from breakout_core.evaluation.policies import RandomPolicy
from breakout_core.game.contract import CONTRACTS, Contract
from breakout_core.game.driver import EpisodeDriver, bare_stepping_rate


def evaluator_rate(contract: Contract, seeds: list[int], batch: int, driver=None) -> float:
    started = time.perf_counter()
    result = evaluate(RandomPolicy(), seeds, contract, batch_size=batch, driver=driver)
    return result.transitions / (time.perf_counter() - started)


def episode_start_ms(contract: Contract, seeds: list[int]) -> tuple[float, float]:
    """Milliseconds to start an episode: a seed new to this process, then the same seed again."""
    driver = EpisodeDriver(contract, 1)
    started = time.perf_counter()
    for seed in seeds:
        driver.start(0, seed)
    cold = (time.perf_counter() - started) * 1e3 / len(seeds)
    started = time.perf_counter()
    for seed in seeds:
        driver.start(0, seed)
    return cold, (time.perf_counter() - started) * 1e3 / len(seeds)


def store_benchmarks(rows: int) -> tuple[float, float]:
    import pyarrow as pa

    from runner.store.database import Store

    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.duckdb"
        spec = Path(tmp) / "bench.yaml"
        spec.write_text("name: bench\npolicies:\n  random: {type: random}\n  other: {type: random}\nmeasurements:\n"
                        "  - {kind: evaluate, name: big, policies: [random, other], seeds: {start: 0, count: 2}}\n")
        store = Store(db)
        store.begin_run({"run_id": "bench", "spec_name": "bench", "spec_hash": "x", "spec_text": spec.read_text(),
                         "host": "bench", "spec_path": str(spec)})
        rng = np.random.default_rng(0)
        half = rows // 2
        table = pa.table({
            "run_id": ["bench"] * rows, "measurement": ["big"] * rows,
            "policy": ["random"] * half + ["other"] * (rows - half),
            "seed": np.concatenate([np.arange(half), np.arange(rows - half)]),
            "score": rng.integers(0, 10, rows).astype(float), "steps": rng.integers(100, 300, rows).astype(np.int32),
            "frames": rng.integers(400, 1200, rows).astype(np.int32), "ended_by": ["game_over"] * rows,
            "action_noop": np.zeros(rows, np.int32), "action_fire": np.zeros(rows, np.int32),
            "action_right": np.zeros(rows, np.int32), "action_left": np.zeros(rows, np.int32),
            "wall_s": np.zeros(rows), "contract_hash": ["x"] * rows,
        })
        started = time.perf_counter()
        store.append_arrow("episodes", table)
        append_s = time.perf_counter() - started
        store.finish_run("bench", "done")
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "runner", "report", "bench", "--db", str(db), "--reports", tmp],
                       check=True)
        report_s = time.perf_counter() - started
    return append_s, report_s


def help_time(repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([sys.executable, "-m", "runner", "--help"], check=True, capture_output=True)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=16)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--contract", default="breakout-v3", choices=sorted(CONTRACTS))
    args = parser.parse_args()
    contract = CONTRACTS[args.contract]
    seeds = list(range(1000, 1000 + args.seeds))
    alone = EpisodeDriver(contract, args.batch)
    split = EpisodeDriver(contract, args.batch, processes=2)
    for driver in (alone, split):  # warm-up: imports, each seed's first ROM load in each process
        evaluator_rate(contract, seeds, args.batch, driver=driver)
    rates: dict[str, list[float]] = {"bare": [], "alone": [], "split": [], "cold": []}
    for _ in range(args.repeats):  # interleaved, so drift in the machine's load hits all four
        rates["bare"].append(bare_stepping_rate(contract, args.batch, 1500))
        rates["alone"].append(evaluator_rate(contract, seeds, args.batch, driver=alone))
        rates["split"].append(evaluator_rate(contract, seeds, args.batch, driver=split))
        rates["cold"].append(evaluator_rate(contract, seeds, args.batch))
    split.close()
    median = {name: statistics.median(values) for name, values in rates.items()}
    in_round = {name: [r / b for r, b in zip(values, rates["bare"])] for name, values in rates.items()}
    print(f"{contract.name} (sticky actions {contract.repeat_action_probability}): random policy, {args.seeds} seeds, "
          f"{args.batch} episodes side by side (transitions/s and ratio to the bare env within a round: "
          f"medians of {args.repeats} rounds, the rounds' range)")
    rows = [("bare vector env, random actions, same sticky", "bare", ""),
            ("evaluator, driver made beforehand, 1 process", "alone", ""),
            ("evaluator, driver made beforehand, 2 processes", "split", " (target >= 0.80)"),
            ("evaluator, making its own driver", "cold", "")]
    for label, name, note in rows:
        ratios = in_round[name]
        print(f"  {label:48s}: {median[name]:6.0f}   ratio {statistics.median(ratios):.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}){note}")
    first, again = episode_start_ms(contract, list(range(90_000, 90_020)))
    print(f"  episode start: {first:.1f} ms for a seed new to the process, {again:.1f} ms for one played before")
    append_s, report_s = store_benchmarks(args.rows)
    print(f"append {args.rows:,} episode rows: {append_s:.2f} s (target < 3 s)")
    print(f"runner report over them      : {report_s:.2f} s (target < 10 s)")
    print(f"runner --help (median of 5)  : {help_time():.2f} s (target < 1 s)")


if __name__ == "__main__":
    main()
