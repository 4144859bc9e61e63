"""The faster gradient steps (compiled TD loss, channels_last, fused Adam, input-major linear
weights) compute what the plain step computes: the same loss, Q-values, targets and gradients
on fixed inputs, and the same weights after an optimizer step, within float tolerance; a state
saved under one memory layout resumes under the other; the allocator setting that keeps freed
memory does what it is for, in a process of its own."""

import platform
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from breakout_core.game.contract import Contract
from breakout_core.learning.input_major import transposed_at
from breakout_core.learning.train_config import TrainConfig
from breakout_core.learning.trainer import Trainer, random_replay

PLAIN = TrainConfig(batch_size=16, torch_threads=1, channels_last=False, fused_adam=False, input_major_linear=False,
                    compile=False)
FASTER = {
    "compile": dict(compile=True),
    "input-major linear": dict(input_major_linear=True),
    "channels_last + fused Adam": dict(channels_last=True, fused_adam=True),
    "channels_last + fused Adam + input-major linear": dict(channels_last=True, fused_adam=True,
                                                            input_major_linear=True),
    "compile + channels_last + fused Adam + input-major linear": dict(
        compile=True, channels_last=True, fused_adam=True, input_major_linear=True),
}


def _step(trainer: Trainer, batch) -> tuple[torch.Tensor, ...]:
    """Loss, Q-values, targets, gradients and the weights after the step; gradients and weights
    in nn.Linear's layout whatever the trainer holds."""
    loss, q, target = trainer._loss_fn(*trainer._batch_inputs(batch))
    trainer.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grads = transposed_at([p.grad.detach() for p in trainer.online.parameters()], trainer._input_major)
    trainer.optimizer.step()
    return loss.detach(), q.detach(), target, grads, [w.clone() for w in trainer.online.state_dict().values()]


@pytest.mark.parametrize("algorithm", ["dqn", "double"])
# torch.compile pays inductor's first compile (5-40 s), so those variants run with the slow tests
@pytest.mark.parametrize(
    "variant", [pytest.param(name, marks=pytest.mark.slow) if FASTER[name].get("compile") else name for name in FASTER])
def test_faster_step_computes_the_plain_steps_loss_and_gradients(tmp_path, algorithm, variant):
    contract = Contract()
    plain_config = replace(PLAIN, algorithm=algorithm)
    batch = random_replay(plain_config, contract).sample(plain_config.batch_size)
    batch.rewards = torch.linspace(-1, 1, len(batch.rewards))  # a target that is not Q(s') alone
    plain = Trainer(plain_config, contract, tmp_path)
    faster = Trainer(replace(plain_config, **FASTER[variant]), contract, tmp_path)  # same seed: same weights
    # the target network is moved off the online one, so its forward is checked too
    with torch.no_grad():
        for a, b in zip(plain.target.parameters(), faster.target.parameters()):
            a.mul_(0.9)
            b.mul_(0.9)
    expected, got = _step(plain, batch), _step(faster, batch)
    loss, q, target, grads, weights = expected
    assert loss > 0 and any(g.abs().sum() > 0 for g in grads)
    torch.testing.assert_close(got[0], loss, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got[1], q, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(got[2], target, rtol=1e-4, atol=1e-5)
    for g_got, g in zip(got[3], grads):
        torch.testing.assert_close(g_got, g, rtol=1e-3, atol=1e-6)
    # Adam's first step moves every weight by about lr = 1e-4 whatever its gradient's size, so a
    # near-zero gradient's float noise can move a weight by a few 1e-6: a tenth of a step is allowed
    for w_got, w in zip(got[4], weights):
        torch.testing.assert_close(w_got, w, rtol=1e-4, atol=1e-5)


def test_compiled_trainer_state_loads_into_a_plain_trainer(tmp_path):
    """Compiling leaves the modules' state_dict keys alone: a state saved with it resumes without it."""
    contract = Contract()
    compiled = Trainer(replace(PLAIN, compile=True), contract, tmp_path)
    compiled._update(random_replay(PLAIN, contract), want_diagnostics=False)
    compiled.save_state((0, 0.0), 0.0)
    plain = Trainer(PLAIN, contract, tmp_path)
    plain.load_state()
    assert plain.updates == 1
    for a, b in zip(plain.online.parameters(), compiled.online.parameters()):
        assert torch.equal(a, b)


@pytest.mark.parametrize("saved_with", [True, False])
@pytest.mark.parametrize("layout", ["channels_last", "input_major_linear"])
def test_a_state_resumes_under_the_other_memory_layout(tmp_path, layout, saved_with):
    """A state saved with a layout setting on resumes with it off, and the other way, and steps as
    the trainer that saved it would: weights, Adam's moments and initial weights are saved in one
    layout and take the resuming trainer's. (The fused Adam pairs a weight with its moments by
    memory position, so moments in another layout would update each weight with another's.)"""
    contract = Contract()
    config = replace(PLAIN, fused_adam=True)
    replay = random_replay(config, contract)
    saver = Trainer(replace(config, **{layout: saved_with}), contract, tmp_path)
    for _ in range(3):
        saver._update(replay, want_diagnostics=False)
    saver.save_state((0, 0.0), 0.0)
    resumed = Trainer(replace(config, **{layout: not saved_with}), contract, tmp_path)
    resumed.load_state()
    for weight, state in resumed.optimizer.state.items():
        assert state["exp_avg"].shape == weight.shape and state["exp_avg"].stride() == weight.stride()
    assert [t.shape for t in resumed.initial] == [p.shape for p in resumed.online.parameters()]
    batch = replay.sample(config.batch_size)
    expected, got = _step(saver, batch)[4], _step(resumed, batch)[4]
    for w_got, w in zip(got, expected):
        torch.testing.assert_close(w_got, w, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("saved_fused", [True, False])
def test_a_resumed_trainer_keeps_its_own_adam_kernel(tmp_path, saved_fused):
    """The saved optimizer state names the saver's kernel; the resuming trainer's setting wins."""
    contract = Contract()
    replay = random_replay(PLAIN, contract)
    saver = Trainer(replace(PLAIN, fused_adam=saved_fused), contract, tmp_path)
    saver._update(replay, want_diagnostics=False)
    saver.save_state((0, 0.0), 0.0)
    resumed = Trainer(replace(PLAIN, fused_adam=not saved_fused), contract, tmp_path)
    resumed.load_state()
    assert bool(resumed.optimizer.param_groups[0]["fused"]) is (not saved_fused)
    batch = replay.sample(PLAIN.batch_size)
    for w_got, w in zip(_step(resumed, batch)[4], _step(saver, batch)[4]):
        torch.testing.assert_close(w_got, w, rtol=1e-4, atol=1e-6)


# Each run is a process of its own: the allocator setting is process-wide and cannot be undone.
# Two 10 MiB blocks taken and freed together: under glibc's default the freed top of the heap
# exceeds its trim threshold and goes back to the OS, to be faulted in again next time.
FAULTS_PER_ROUND = """
import resource, sys
import numpy as np
from breakout_core.game.contract import Contract
from breakout_core.learning.train_config import TrainConfig
from breakout_core.learning.trainer import Trainer
Trainer(TrainConfig(torch_threads=1, keep_freed_memory=sys.argv[1] == "keep"), Contract(), "unused")
def blocks():
    a, b = np.ones(10 << 20, np.uint8), np.ones(10 << 20, np.uint8)
    del a, b
blocks()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    blocks()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def _faults_per_round(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", FAULTS_PER_ROUND, mode], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return float(out.stdout)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the allocator setting is glibc's")
def test_a_trainer_keeps_freed_memory_for_reuse():
    """A trainer with the setting (the default) leaves its process reusing freed blocks: no page
    is faulted in again. Without it, glibc returns them and faults them back every round."""
    assert _faults_per_round("keep") == 0
    assert _faults_per_round("default") > 100


def test_a_training_without_the_setting_is_refused_in_a_process_that_set_it():
    code = """
from dataclasses import replace
from breakout_core.game.contract import Contract
from breakout_core.learning.train_config import TrainConfig
from breakout_core.learning.trainer import Trainer
config = TrainConfig(batch_size=32, torch_threads=1)
Trainer(config, Contract(), "unused")
try:
    Trainer(replace(config, keep_freed_memory=False), Contract(), "unused")
except ValueError as exc:
    print(exc)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    if platform.libc_ver()[0] == "glibc":
        assert "keep_freed_memory is false, but an earlier training in this process set it" in out.stdout
    else:  # nothing was set, so nothing is refused
        assert out.stdout == ""
