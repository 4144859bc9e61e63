"""The allocator setting (`keep_freed_memory`): page faults and milliseconds per gradient step.

    python benchmarks/allocator.py [--pairs 6] [--steps 100] [--threads 2]

The setting is process-wide and cannot be undone, so each side runs in a process of its own,
over --pairs pairs: glibc malloc's defaults first in odd pairs, the setting first in even ones,
so a drift within a pair does not favour one side. Each process builds
the trainer (DQN, batch 32, channels_last + fused Adam) on a replay of random frames, takes 5
steps of warm-up, then times --steps calls of `Trainer._update` and counts the minor page
faults of each (median and mean per step). The ratio is default ms / kept ms within a pair.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

from breakout_core.common.messages import process_failure

ONE_SIDE = """
import json, resource, statistics, sys, time
from breakout_core.game.contract import CONTRACTS
from breakout_core.learning.train_config import TrainConfig
from breakout_core.learning.trainer import Trainer, random_replay
keep, steps, threads = sys.argv[1] == "keep", int(sys.argv[2]), int(sys.argv[3])
config = TrainConfig(algorithm="dqn", batch_size=32, torch_threads=threads, channels_last=True, fused_adam=True,
                     keep_freed_memory=keep)
contract = CONTRACTS["breakout-v3"]
trainer, replay = Trainer(config, contract, "/nonexistent-unused"), random_replay(config, contract)
for _ in range(5):
    trainer._update(replay, want_diagnostics=False)
faults, ms = [], []
for _ in range(steps):
    before, started = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.perf_counter()
    trainer._update(replay, want_diagnostics=False)
    ms.append((time.perf_counter() - started) * 1e3)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"ms": statistics.median(ms), "faults": statistics.median(faults),
                  "faults_mean": statistics.mean(faults)}))
"""


def one_side(mode: str, steps: int, threads: int) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", ONE_SIDE, mode, str(steps), str(threads)],
                         capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(process_failure(f"the {mode} side", out))
    return json.loads(out.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=6)
    parser.add_argument("--steps", type=int, default=100, help="timed gradient steps per process")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if min(args.pairs, args.steps, args.threads) < 1:
        parser.error("--pairs, --steps and --threads must be at least 1")
    ratios = []
    for pair in range(args.pairs):
        order = ("default", "keep") if pair % 2 == 0 else ("keep", "default")
        sides = {mode: one_side(mode, args.steps, args.threads) for mode in order}
        default, kept = sides["default"], sides["keep"]
        ratios.append(default["ms"] / kept["ms"])
        print(f"pair {pair + 1} ({order[0]} first): glibc defaults {default['ms']:6.2f} ms, faults/step median "
              f"{default['faults']:.0f} mean {default['faults_mean']:.0f}; keeping freed memory {kept['ms']:6.2f} ms, "
              f"faults/step median {kept['faults']:.0f} mean {kept['faults_mean']:.1f}; x{ratios[-1]:.2f}", flush=True)
    print(f"\nx{statistics.median(ratios):.2f} (median of {args.pairs} pairs; {min(ratios):.2f}-{max(ratios):.2f})")


if __name__ == "__main__":
    main()
