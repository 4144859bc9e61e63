"""The `train` kind against CleanRL's dqn_atari.py at the same settings, interleaved over rounds.

    python benchmarks/vs_cleanrl.py CLEANRL_DQN_ATARI_PY --cleanrl-python PYTHON [--rounds 3]
        [--transitions 12000] [--learning-starts 2000] [--variant plain --variant fast ...]

CleanRL is not part of this project: fetch it yourself (its repository's cleanrl/dqn_atari.py
with the cleanrl_utils package beside it) and give an interpreter that has its dependencies
(gymnasium 0.29, ale-py, tyro, tensorboard). Its file is run unchanged, through `runpy`
after `import ale_py` (ale-py >= 0.9 registers the Atari ids on import).

Both sides: 1 env, batch 32, one update per 4 transitions, a 20K replay, Adam at 1e-4,
gamma 0.99, a target copy every 1,000 transitions, epsilon 1 -> 0.01 over the first 10% of
the transitions, the learning starts after --learning-starts transitions; no tracking, no
video. Throughput is each side's own loop clock (transitions over the seconds since its loop
began): CleanRL's last `SPS:` line, the train kind's stored `transitions_per_s`. What is
left different is each side's own: CleanRL plays BreakoutNoFrameskip-v4 through its gym
wrappers and learns with an MSE loss and no gradient clipping; the train kind plays its
contract through the episode driver with a Huber loss clipped at norm 10.

Each round runs CleanRL, then every train-kind variant, each in its own process; the ratio
is variant / CleanRL within the round, and the medians and spread over rounds are printed.
Variants: plain (NCHW, plain Adam, nn.Linear's weight layout, glibc malloc's defaults),
allocator (plain, keeping freed memory), fast (channels_last + fused Adam), fast_allocator
(both), fast_input_major (fast_allocator with the fully connected weights held input-major:
the train kind's defaults with channels_last), compiled (all, and torch.compile of the TD
loss), auto (fast_input_major with `learner_precision: auto`: bf16 autocast for the learner
where the CPU has AMX, fp32 elsewhere; the line printed says which ran). Every variant but
auto learns in fp32. The CPU's model and the flags that decide fp32 and bf16 speed are
printed first: a ratio is a figure of that CPU.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import duckdb

from breakout_core.common.cpu_flags import cpu_flags, cpu_model
from breakout_core.common.messages import process_failure
from breakout_core.learning.learner_precision import RECORDED_FLAGS

VARIANTS = {  # train-kind fields that differ between the project's variants
    "plain": {"channels_last": False, "fused_adam": False, "input_major_linear": False, "keep_freed_memory": False},
    "allocator": {"channels_last": False, "fused_adam": False, "input_major_linear": False, "keep_freed_memory": True},
    "fast": {"channels_last": True, "fused_adam": True, "input_major_linear": False, "keep_freed_memory": False},
    "fast_allocator": {"channels_last": True, "fused_adam": True, "input_major_linear": False,
                       "keep_freed_memory": True},
    "fast_input_major": {"channels_last": True, "fused_adam": True, "input_major_linear": True,
                         "keep_freed_memory": True},
    "compiled": {"channels_last": True, "fused_adam": True, "input_major_linear": True, "keep_freed_memory": True,
                 "compile": True},
    "auto": {"channels_last": True, "fused_adam": True, "input_major_linear": True, "keep_freed_memory": True,
             "learner_precision": "auto"},
}


def cleanrl_rate(python: str, script: Path, args: argparse.Namespace, workdir: Path) -> tuple[float, float]:
    """(transitions/s by CleanRL's own clock, wall seconds of the process)."""
    argv = [str(script), "--seed", "1", "--no-cuda", "--no-track", "--no-capture-video",
            "--total-timesteps", str(args.transitions), "--learning-starts", str(args.learning_starts),
            "--buffer-size", str(args.buffer), "--batch-size", "32", "--train-frequency", "4",
            "--target-network-frequency", "1000", "--learning-rate", "1e-4", "--end-e", "0.01",
            "--exploration-fraction", "0.1"]
    launcher = ("import runpy, sys, ale_py; sys.argv = " + repr(argv) + "; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")
    env = {"PYTHONPATH": str(script.parent.parent), "PATH": "/usr/bin:/bin"}
    started = time.perf_counter()
    out = subprocess.run([python, "-c", launcher], cwd=workdir, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if out.returncode != 0:
        sys.exit(process_failure("CleanRL", out))
    sps = re.findall(r"^SPS: (\d+)", out.stdout, flags=re.M)
    if not sps:
        sys.exit("CleanRL printed no 'SPS:' line: is --transitions past --learning-starts?")
    return float(sps[-1]), wall


def train_kind_rate(variant: str, args: argparse.Namespace, workdir: Path) -> tuple[float, float, str]:
    """(transitions/s by the train kind's loop clock, wall seconds of `runner run`, the learner precision that
    ran)."""
    fields = {
        "kind": "train", "name": "vs_cleanrl", "algorithm": "dqn", "total_transitions": args.transitions,
        "num_envs": 1, "learning_rate": 1e-4, "batch_size": 32, "gamma": 0.99, "replay_capacity": args.buffer,
        "learning_starts": args.learning_starts, "train_every": 4, "target_sync_every": 1000,
        "epsilon_start": 1.0, "epsilon_end": 0.01, "epsilon_decay_transitions": args.transitions // 10,
        "seed": 1, "torch_threads": args.threads, "diagnostics_every": 1000, **VARIANTS[variant],
    }
    spec = workdir / f"{variant}.yaml"
    spec.write_text(json.dumps({"name": f"vs_cleanrl_{variant}", "description": "train kind at CleanRL's settings",
                                "measurements": [fields]}))  # JSON is YAML
    db = workdir / f"{variant}.duckdb"
    db.unlink(missing_ok=True)
    started = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "runner", "run", str(spec), "--db", str(db), "--no-report",
                          "--runs-dir", str(workdir / "runs")], cwd=workdir, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if out.returncode != 0:
        sys.exit(process_failure("the train kind", out))
    with duckdb.connect(str(db), read_only=True) as con:
        rate = con.execute("SELECT transitions_per_s FROM train_results ORDER BY attempt DESC LIMIT 1").fetchone()[0]
        precision = json.loads(con.execute("SELECT learner_precision FROM train_attempts ORDER BY attempt DESC "
                                           "LIMIT 1").fetchone()[0])
    return float(rate), wall, precision["chosen"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cleanrl_script", type=Path, help="CleanRL's cleanrl/dqn_atari.py")
    parser.add_argument("--cleanrl-python", required=True, help="an interpreter with CleanRL's dependencies")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--transitions", type=int, default=12_000)
    parser.add_argument("--learning-starts", type=int, default=2_000)
    parser.add_argument("--buffer", type=int, default=20_000)
    parser.add_argument("--threads", type=int, default=2,
                        help="the train kind's torch threads (CleanRL: torch's default)")
    parser.add_argument("--variant", action="append", choices=sorted(VARIANTS),
                        help="train-kind variants to run (repeatable); default: plain, fast_input_major and "
                             "auto")
    args = parser.parse_args()
    if min(args.rounds, args.threads) < 1:
        parser.error("--rounds and --threads must be at least 1")
    if not args.cleanrl_script.is_file():
        sys.exit(f"{args.cleanrl_script}: no such file (CleanRL's cleanrl/dqn_atari.py)")
    if not (args.cleanrl_script.parent.parent / "cleanrl_utils").is_dir():
        sys.exit(f"{args.cleanrl_script}: cleanrl_utils/ is not beside its cleanrl/ folder")
    if args.transitions <= args.learning_starts + 100:
        sys.exit(f"--transitions {args.transitions} must be over --learning-starts {args.learning_starts} + 100")
    variants = args.variant or ["plain", "fast_input_major", "auto"]
    flags = [f for f in RECORDED_FLAGS if f in cpu_flags()]
    print(f"CPU: {cpu_model()}; flags: {', '.join(flags) or 'none of ' + ', '.join(RECORDED_FLAGS)}", flush=True)
    rates: dict[str, list[float]] = {"cleanrl": [], **{v: [] for v in variants}}
    walls: dict[str, list[float]] = {k: [] for k in rates}
    with tempfile.TemporaryDirectory(prefix="vs_cleanrl_") as tmp:
        workdir = Path(tmp)
        for r in range(args.rounds):
            rate, wall = cleanrl_rate(args.cleanrl_python, args.cleanrl_script, args, workdir)
            rates["cleanrl"].append(rate)
            walls["cleanrl"].append(wall)
            print(f"round {r + 1}: cleanrl {rate:.0f} transitions/s ({wall:.0f} s wall)", flush=True)
            for v in variants:
                rate, wall, precision = train_kind_rate(v, args, workdir)
                rates[v].append(rate)
                walls[v].append(wall)
                print(f"round {r + 1}: train kind {v} ({precision} learner) {rate:.0f} transitions/s "
                      f"({wall:.0f} s wall), x{rate / rates['cleanrl'][-1]:.2f} CleanRL", flush=True)
    print(f"\n{args.transitions} transitions, {args.learning_starts} before learning, {args.rounds} rounds")
    width = max(map(len, ["cleanrl", *variants]))
    print(f"{'cleanrl':{width}s} {statistics.median(rates['cleanrl']):6.0f} transitions/s (median)")
    for v in variants:
        ratios = [a / b for a, b in zip(rates[v], rates["cleanrl"])]
        wall_ratio = statistics.median(walls["cleanrl"]) / statistics.median(walls[v])
        print(f"{v:{width}s} {statistics.median(rates[v]):6.0f} transitions/s  "
              f"x{statistics.median(ratios):.2f} CleanRL "
              f"(rounds {min(ratios):.2f}-{max(ratios):.2f}); wall x{wall_ratio:.2f}")


if __name__ == "__main__":
    main()
