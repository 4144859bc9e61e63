"""Where a gradient step's milliseconds go, and what each way of making it faster buys.

    python benchmarks/learner_step.py [--algorithm double] [--steps 30] [--rounds 3] [--threads 2]

1. Profile: the trainer's own networks, optimizer and replay (random frames), one step cut
   into its phases and each phase timed on its own: replay sampling (stacking single frames
   into 4-frame observations), the online forward on obs, the Double-DQN online forward on
   the next obs, the target forward, the loss, backward, gradient clipping, the optimizer and
   the diagnostics. The whole `Trainer._update` is timed beside it, so the phases' sum can be
   checked against it. FLOPs are counted by torch's FlopCounterMode on one step.
2. Variants of the whole step (memory format, fused Adam, input-major linear weights,
   torch.compile, one online forward over obs and next obs together, and the fast step with
   the trainer's bf16 learner where this CPU runs it natively, AMX or AVX512_BF16:
   `learner_precision: bf16`), each
   against the plain step (NCHW, plain Adam, nn.Linear's weight layout, eager), interleaved
   over rounds in this one process; ratios are plain / variant time.
3. With --ops: torch's profiler over the fast step (channels_last + fused Adam + input-major
   linear weights), each op's own CPU time per step, largest first: the kernels themselves
   against the framework's work around them (copies, elementwise ops, the optimizer).
4. With --floor: that step's kernels timed alone (each layer forward and backward on its own
   input, the gradient-free forwards, the optimizer step), interleaved with the whole step over
   rounds: the step's floor on this machine, and how far above it the step runs.

Every trainer here shares one process, and with it glibc malloc's thresholds: all keep freed
memory (the trainer's default) unless --default-malloc. That setting is compared between
processes, in allocator.py and vs_cleanrl.py.
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import replace
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from breakout_core.game.contract import CONTRACTS
from breakout_core.learning.input_major import InputMajorLinear
from breakout_core.learning.learner_precision import PrecisionUnavailable, choose_learner_precision
from breakout_core.learning.train_config import TrainConfig
from breakout_core.learning.trainer import Trainer, random_replay

FAST = "channels_last + fused Adam + input-major"  # the fastest step measured: the profile's second column
PHASES = ("sample", "online_fwd_obs", "online_fwd_next", "target_fwd_next", "loss", "backward", "clip",
          "optimizer", "diagnostics")


def _ms(since: float) -> float:
    return (time.perf_counter() - since) * 1e3


def phase_times(trainer: Trainer, replay, steps: int) -> dict[str, list[float]]:
    """Each phase of `steps` gradient steps timed on its own (torch on CPU runs each op to its end)."""
    cfg = trainer.config
    times: dict[str, list[float]] = {p: [] for p in PHASES}
    for _ in range(steps):
        t = time.perf_counter()
        obs, next_obs, actions, rewards, terminal = trainer._batch_inputs(replay.sample(cfg.batch_size))
        times["sample"].append(_ms(t))
        t = time.perf_counter()
        q = trainer.online(obs).gather(1, actions[:, None]).squeeze(1)
        times["online_fwd_obs"].append(_ms(t))
        with torch.no_grad():
            t = time.perf_counter()
            best = None if cfg.algorithm == "dqn" else trainer.online(next_obs).argmax(dim=1, keepdim=True)
            times["online_fwd_next"].append(_ms(t))
            t = time.perf_counter()
            next_values = trainer.target(next_obs)
            times["target_fwd_next"].append(_ms(t))
        t = time.perf_counter()
        with torch.no_grad():
            next_q = next_values.max(dim=1).values if best is None else next_values.gather(1, best).squeeze(1)
            target = rewards + cfg.gamma * (1.0 - terminal) * next_q
        loss = F.smooth_l1_loss(q, target)
        times["loss"].append(_ms(t))
        t = time.perf_counter()
        trainer.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        times["backward"].append(_ms(t))
        t = time.perf_counter()
        grad_norm = torch.nn.utils.clip_grad_norm_(trainer.online.parameters(), cfg.max_grad_norm)
        times["clip"].append(_ms(t))
        t = time.perf_counter()
        trainer.optimizer.step()
        times["optimizer"].append(_ms(t))
        t = time.perf_counter()
        td = (target - q).detach().abs()
        [float(v) for v in (loss.detach(), q.detach().mean(), target.mean(), td.mean(), td.max(), grad_norm)]
        times["diagnostics"].append(_ms(t))
    return times


def median_ms(run: Callable[[], object], times: int) -> float:
    """Median milliseconds of `run()` over `times` calls."""
    taken = []
    for _ in range(times):
        t = time.perf_counter()
        run()
        taken.append(_ms(t))
    return statistics.median(taken)


def step_ms(trainer: Trainer, replay, steps: int) -> float:
    """Median milliseconds of the trainer's own `_update` over `steps` steps."""
    return median_ms(lambda: trainer._update(replay, want_diagnostics=False), steps)


def layer_inputs(trainer: Trainer, replay) -> list[tuple[nn.Module, torch.Tensor]]:
    """Each convolution and linear layer of the online network, in the order a forward runs
    them, with the input it gets in a forward on a sampled batch."""
    captured: list[tuple[nn.Module, torch.Tensor]] = []
    hooks = [m.register_forward_pre_hook(lambda module, args: captured.append((module, args[0].detach().clone())))
             for m in trainer.online.modules() if isinstance(m, (nn.Conv2d, nn.Linear, InputMajorLinear))]
    obs = trainer._batch_inputs(replay.sample(trainer.config.batch_size))[0]
    with torch.no_grad():
        trainer.online(obs)
    for hook in hooks:
        hook.remove()
    return captured


def kernels_ms(trainer: Trainer, layers: list[tuple[nn.Module, torch.Tensor]], times: int) -> float:
    """The step's kernels alone, each on its own input with hot caches: every layer's forward
    and backward (the input's gradient too, but for the first layer's, as in the step), its
    gradient-free forwards on the next observations (one, the target's, for DQN; two for
    Double DQN), and the optimizer's step. Nothing else of a step (sampling, copies,
    activations, the loss, clipping, autograd's work) is in it."""
    forwards = 1 if trainer.config.algorithm == "dqn" else 2
    total = 0.0
    for i, (layer, x) in enumerate(layers):
        x = x.requires_grad_(i > 0)

        def forward() -> None:
            with torch.no_grad():
                layer(x)

        def forward_backward() -> None:
            layer.zero_grad(set_to_none=True)
            y = layer(x)
            y.backward(torch.ones_like(y))

        total += forwards * median_ms(forward, times) + median_ms(forward_backward, times)
    for p in trainer.online.parameters():
        p.grad = torch.zeros_like(p)
    return total + median_ms(trainer.optimizer.step, times)


def op_times(trainer: Trainer, replay, steps: int) -> list[tuple[str, float, int]]:
    """(op, own CPU ms per step, calls per step) of every op over `steps` steps, costliest first."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            trainer._update(replay, want_diagnostics=False)
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    return [(e.key, e.self_cpu_time_total / 1e3 / steps, e.count // steps) for e in ops]


def step_flops(trainer: Trainer, replay) -> int:
    counter = FlopCounterMode(display=False)
    with counter:
        trainer._update(replay, want_diagnostics=False)
    return counter.get_total_flops()


class JointForwardTrainer(Trainer):
    """Double DQN with one online forward over obs and next obs together (batch 2B), the
    next half detached: one call instead of two, but backward then runs over 2B samples."""

    def _td_loss(self, obs, next_obs, actions, rewards, terminal):
        both = self.online(torch.cat([obs, next_obs]))
        q = both[: len(obs)].gather(1, actions[:, None]).squeeze(1)
        with torch.no_grad():
            best = both[len(obs):].argmax(dim=1, keepdim=True)
            next_q = self.target(next_obs).gather(1, best).squeeze(1)
            target = rewards + self.config.gamma * (1.0 - terminal) * next_q
        return F.smooth_l1_loss(q, target), q, target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", default="double", choices=("dqn", "double", "dueling"))
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30, help="timed steps per variant per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contract", default="breakout-v3", choices=sorted(CONTRACTS))
    parser.add_argument("--no-variants", action="store_true", help="skip section 2 (the variants)")
    parser.add_argument("--ops", action="store_true", help="also each op's own CPU time per step (torch's profiler)")
    parser.add_argument("--floor", action="store_true",
                        help="also the step's kernels timed alone, interleaved with the whole step: how far the step "
                             "lies above what its convolutions, matmuls and optimizer cost by themselves")
    parser.add_argument("--default-malloc", action="store_true",
                        help="leave glibc malloc's thresholds at their defaults (keep_freed_memory false); the "
                             "setting is process-wide, so it is compared between processes, "
                             "in allocator.py and vs_cleanrl.py")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    contract = CONTRACTS[args.contract]
    plain = TrainConfig(algorithm=args.algorithm, batch_size=args.batch, torch_threads=args.threads,
                        channels_last=False, fused_adam=False, input_major_linear=False,
                        keep_freed_memory=not args.default_malloc)
    replay = random_replay(plain, contract)
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}, "
          f"{torch.get_num_threads()} threads; {args.algorithm}, batch {args.batch}; malloc "
          f"{'defaults' if args.default_malloc else 'keeping freed memory'}")

    profiled = {"plain (NCHW, Adam)": plain,
                FAST: replace(plain, channels_last=True, fused_adam=True, input_major_linear=True)}
    flops = step_flops(Trainer(plain, contract, "/nonexistent-unused"), replay)
    print(f"\n1. profile: {flops / 1e9:.2f} GFLOP per step (FlopCounterMode); phases in ms, median of "
          f"{args.steps} steps x {args.rounds} rounds, whole _update timed beside them")
    trainers = {name: Trainer(cfg, contract, "/nonexistent-unused") for name, cfg in profiled.items()}
    phases = {name: {p: [] for p in PHASES} for name in profiled}
    whole = {name: [] for name in profiled}
    for name, trainer in trainers.items():
        phase_times(trainer, replay, 3)  # warm-up
    for _ in range(args.rounds):
        for name, trainer in trainers.items():
            for p, values in phase_times(trainer, replay, args.steps).items():
                phases[name][p] += values
            whole[name].append(step_ms(trainer, replay, args.steps))
    names = list(profiled)
    print(f"{'phase':18s}" + "".join(f"{n:>44s}" for n in names))
    sums = {n: 0.0 for n in names}
    for p in PHASES:
        row = ""
        for n in names:
            ms = statistics.median(phases[n][p])
            sums[n] += ms
            row += f"{ms:38.2f} ms {ms / statistics.median(whole[n]) * 100:3.0f}%"
        print(f"{p:18s}{row}")
    print(f"{'sum of phases':18s}" + "".join(f"{sums[n]:38.2f} ms     " for n in names))
    print(f"{'whole _update':18s}" + "".join(f"{statistics.median(whole[n]):38.2f} ms     " for n in names))
    print(f"{'GFLOP/s':18s}" + "".join(f"{flops / statistics.median(whole[n]) / 1e6:41.1f}   " for n in names))
    if args.ops:
        ops = op_times(trainers[FAST], replay, args.steps * args.rounds)
        print(f"\n3. ops of the {FAST} step: own CPU ms per step, "
              f"{args.steps * args.rounds} steps under torch's profiler")
        for name, ms, calls in ops[:14]:
            print(f"{name:40s} {ms:7.2f} ms  {calls:3d} calls")
        print(f"{'all ops':40s} {sum(ms for _, ms, _ in ops):7.2f} ms")
    if args.floor:
        fast = trainers[FAST]
        layers = layer_inputs(fast, replay)
        print(f"\n4. the {FAST} step against its kernels alone (hot caches), medians of "
              f"{args.steps} per round, interleaved")
        ratios = []
        for k in range(args.rounds):
            whole_ms, alone_ms = step_ms(fast, replay, args.steps), kernels_ms(fast, layers, args.steps)
            ratios.append(whole_ms / alone_ms)
            print(f"round {k + 1}: whole _update {whole_ms:6.2f} ms, kernels alone {alone_ms:6.2f} ms "
                  f"({flops / alone_ms / 1e6:5.1f} GFLOP/s), gap {whole_ms - alone_ms:5.2f} ms, "
                  f"x{whole_ms / alone_ms:.2f}")
        print(f"whole / kernels alone: x{statistics.median(ratios):.2f} (rounds {min(ratios):.2f}-{max(ratios):.2f})")
    if args.no_variants:
        return

    variants = {
        "channels_last": (Trainer, replace(plain, channels_last=True)),
        "fused Adam": (Trainer, replace(plain, fused_adam=True)),
        "channels_last + fused Adam": (Trainer, replace(plain, channels_last=True, fused_adam=True)),
        "input-major linear": (Trainer, replace(plain, input_major_linear=True)),
        FAST: (Trainer, replace(plain, channels_last=True, fused_adam=True, input_major_linear=True)),
        "compile": (Trainer, replace(plain, compile=True)),
        "compile + fused Adam": (Trainer, replace(plain, compile=True, fused_adam=True)),
        "compile + channels_last + fused Adam": (Trainer, replace(plain, compile=True, channels_last=True,
                                                                  fused_adam=True)),
    }
    try:  # the trainer's own bf16 learner, where this CPU runs it natively; refused elsewhere, and said so
        choose_learner_precision("bf16")
        variants[f"{FAST} + bf16 learner"] = (Trainer, replace(plain, channels_last=True, fused_adam=True,
                                                                input_major_linear=True, learner_precision="bf16"))
    except PrecisionUnavailable as exc:
        print(f"no bf16 variant: {exc}")
    if args.algorithm != "dqn":
        variants["joint online forward + fused Adam"] = (JointForwardTrainer, replace(plain, fused_adam=True))
    runners = {"plain": Trainer(plain, contract, "/nonexistent-unused")}
    for name, (cls, cfg) in variants.items():
        t = time.perf_counter()
        runners[name] = cls(cfg, contract, "/nonexistent-unused")
        for _ in range(3):
            runners[name]._update(replay, want_diagnostics=False)
        if cfg.compile:
            print(f"{name}: compiled in {time.perf_counter() - t:.1f} s")
    ratios = {name: [] for name in variants}
    medians = {name: [] for name in runners}
    for _ in range(args.rounds):
        base = step_ms(runners["plain"], replay, args.steps)
        medians["plain"].append(base)
        for name in variants:
            ms = step_ms(runners[name], replay, args.steps)
            medians[name].append(ms)
            ratios[name].append(base / ms)
    print(f"\n2. variants: speed relative to the plain step (plain ms / variant ms), per round, "
          f"{args.steps} steps each, interleaved")
    print(f"{'plain':48s} {statistics.median(medians['plain']):6.2f} ms  "
          f"{flops / statistics.median(medians['plain']) / 1e6:5.1f} GFLOP/s")
    for name in variants:
        ms = statistics.median(medians[name])
        spread = f"{min(ratios[name]):.2f}-{max(ratios[name]):.2f}"
        print(f"{name:48s} {ms:6.2f} ms  {flops / ms / 1e6:5.1f} GFLOP/s  x{statistics.median(ratios[name]):.2f} "
              f"(rounds {spread})")
    paired = [a / b for a, b in zip(medians["channels_last + fused Adam"], medians[FAST])]
    print(f"input-major linear weights on the channels_last + fused Adam step: x{statistics.median(paired):.3f} "
          f"(rounds {min(paired):.3f}-{max(paired):.3f}, faster in {sum(r > 1 for r in paired)} of {len(paired)})")


if __name__ == "__main__":
    main()
