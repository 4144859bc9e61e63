"""The learner's precision: chosen by the CPU's flags, refused where bf16 would be emulated,
run and marked as native where the CPU has AVX512_BF16 without AMX,
and a bf16 gradient step that keeps weights, gradients and Adam's state in fp32."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from breakout_core.game.contract import Contract
from breakout_core.learning.learner_precision import (
    AUTO_MARGIN,
    PrecisionUnavailable,
    auto_by_timings,
    choose_learner_precision,
)
from breakout_core.learning.train_config import TrainConfig
from breakout_core.learning.trainer import CheckpointSaved, Trainer, random_replay
from runner.cli.commands import main

AMX = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"})
AVX512_BF16_ONLY = frozenset({"avx2", "avx512f", "avx512_bf16"})
AVX2_ONLY = frozenset({"avx2"})
SMALL = dict(learning_starts=100, replay_capacity=2_000, batch_size=8, torch_threads=1, target_sync_every=100,
             epsilon_decay_transitions=200, diagnostics_every=100)


def this_cpu_flags() -> set[str]:
    """Read apart from the module under test: the first `flags` line of /proc/cpuinfo."""
    return set(next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("flags")), []))


def this_cpu_has_amx() -> bool:
    return {"amx_tile", "amx_bf16"} <= this_cpu_flags()


def this_cpu_runs_bf16() -> bool:
    return this_cpu_has_amx() or "avx512_bf16" in this_cpu_flags()


def test_auto_decides_by_the_timings_of_both_precisions_where_bf16_is_native():
    """auto times a gradient step in each precision where bf16 is native (AMX or avx512_bf16):
    bf16 only where it is faster by more than the margin, fp32 on a tie or where it is slower;
    the timings and the margin are kept with the choice. Where bf16 would be emulated, or on a
    CUDA learner, there is nothing to time."""
    for flags in (AMX, AVX512_BF16_ONLY):
        faster = choose_learner_precision("auto", "cpu", flags, timings=lambda: {"fp32_ms": 10.0, "bf16_ms": 8.0})
        assert (faster.chosen, faster.autocast) == ("bf16", True)
        assert faster.timings == {"fp32_ms": 10.0, "bf16_ms": 8.0, "margin": AUTO_MARGIN}
        assert faster.reason.startswith("a gradient step took 10.00 ms in fp32 and 8.00 ms in bf16 here (x1.25)")
    slower = choose_learner_precision("auto", "cpu", AVX512_BF16_ONLY,
                                      timings=lambda: {"fp32_ms": 10.0, "bf16_ms": 10.6})  # x0.94, as one Intel ran
    assert (slower.chosen, slower.autocast) == ("fp32", False) and "not faster" in slower.reason
    tie = choose_learner_precision("auto", "cpu", AMX, timings=lambda: {"fp32_ms": 10.0, "bf16_ms": 9.6})
    assert tie.chosen == "fp32"  # x1.04: within the margin
    assert auto_by_timings(10.0, 10.0 / (1 + AUTO_MARGIN) - 1e-6)[0] == "bf16"

    def never() -> dict:
        raise AssertionError("nothing to time")

    emulated = choose_learner_precision("auto", "cpu", AVX2_ONLY, timings=never)
    assert emulated.chosen == "fp32" and emulated.timings is None and "would be emulated" in emulated.reason
    assert choose_learner_precision("auto", "cuda:0", AMX, timings=never).chosen == "fp32"
    assert choose_learner_precision("fp32", "cpu", AMX, timings=never).chosen == "fp32"  # fp32 is what was asked
    untimed = choose_learner_precision("auto", "cpu", AMX)  # a spec validated: no training yet
    assert untimed.chosen == "fp32" and "times both as training starts" in untimed.reason


def test_auto_times_the_trainers_own_step_and_keeps_what_it_measured(tmp_path):
    """A trainer asked for auto on a CPU said to compute bf16 natively times real gradient steps in
    both precisions and chooses by them; where this CPU in fact emulates bf16 (12x slower), the
    same measurement chooses fp32."""
    trainer = _trainer("auto", AVX512_BF16_ONLY, tmp_path)
    timings = trainer.precision.timings
    assert timings is not None and timings["fp32_ms"] > 0 and timings["bf16_ms"] > 0
    assert trainer.precision.chosen == auto_by_timings(timings["fp32_ms"], timings["bf16_ms"])[0]
    if not this_cpu_runs_bf16():
        assert trainer.precision.chosen == "fp32" and timings["bf16_ms"] > timings["fp32_ms"]


def test_bf16_where_it_would_be_emulated_is_refused_naming_the_missing_flags():
    with pytest.raises(PrecisionUnavailable,
                       match=r"needs a CPU with AMX or avx512_bf16; this CPU lacks amx_tile, amx_bf16 and avx512_bf16"):
        choose_learner_precision("bf16", "cpu", AVX2_ONLY)
    with pytest.raises(PrecisionUnavailable, match="lacks amx_bf16 and avx512_bf16"):
        choose_learner_precision("bf16", "cpu", {"amx_tile"})
    with pytest.raises(PrecisionUnavailable, match="for a CPU learner"):
        choose_learner_precision("bf16", "cuda", AMX)
    assert choose_learner_precision("bf16", "cpu", AMX).chosen == "bf16"


def test_bf16_on_avx512_bf16_without_amx_runs_and_says_it_is_not_amx():
    """Native bf16 dot products: the same arithmetic as AMX's, so a study of whether bf16 learns as
    well can run there; the record says the speed is not AMX's."""
    native = choose_learner_precision("bf16", "cpu", AVX512_BF16_ONLY)
    assert (native.chosen, native.autocast) == ("bf16", True)
    assert "has avx512_bf16 but lacks amx_tile, amx_bf16" in native.reason and "not AMX's" in native.reason


def test_a_bf16_spec_is_one_line_where_this_cpu_would_emulate_it(write_spec):
    path = write_spec("name: bf16\nmeasurements:\n  - kind: train\n    name: t\n    total_transitions: 1000\n"
                      "    learner_precision: bf16\n")
    result = CliRunner().invoke(main, ["validate", str(path)])
    if this_cpu_runs_bf16():
        assert result.exit_code == 0, result.output
    else:
        assert result.exit_code == 2
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: {path}:6: measurements[0].learner_precision: ")
        assert "lacks amx_tile, amx_bf16 and avx512_bf16" in lines[0]
        assert "Traceback" not in result.output
    unknown = write_spec(path.read_text().replace("bf16\n", "fp8\n"), "unknown.yaml")
    refused = CliRunner().invoke(main, ["validate", str(unknown)])
    assert refused.exit_code == 2 and "learner_precision" in refused.stderr and "auto" in refused.stderr


def _trainer(precision: str, flags: frozenset[str], tmp_path: Path) -> Trainer:
    return Trainer(TrainConfig(learner_precision=precision, seed=3, **SMALL), Contract(), tmp_path, cpu_flags=flags)


def test_a_bf16_step_keeps_weights_gradients_and_adam_in_fp32(tmp_path):
    """The autocast covers the online forward and its backward; what the optimizer holds and
    the TD targets stay fp32, and the step's loss is the fp32 step's within bf16's precision."""
    torch.manual_seed(0)
    bf16, fp32 = _trainer("bf16", AMX, tmp_path / "bf16"), _trainer("fp32", AMX, tmp_path / "fp32")
    fp32.online.load_state_dict(bf16.online.state_dict())
    fp32.target.load_state_dict(bf16.target.state_dict())
    replay = random_replay(bf16.config, bf16.contract)
    batch = replay.sample(8, torch.device("cpu"))
    (loss16, q16, target16), (loss32, q32, target32) = (t._td_loss(*t._batch_inputs(batch)) for t in (bf16, fp32))
    assert q16.dtype == target16.dtype == loss16.dtype == torch.float32
    assert torch.equal(target16, target32)  # the gradient-free forwards ran in fp32
    assert torch.allclose(q16, q32, rtol=0.05, atol=0.05) and not torch.equal(q16, q32)  # bf16 rounding, no more
    for _ in range(3):
        assert bf16._update(replay, want_diagnostics=True)["loss"] >= 0
    assert all(p.dtype == torch.float32 and p.grad.dtype == torch.float32 for p in bf16.online.parameters())
    moments = [v for state in bf16.optimizer.state.values() for v in state.values() if v.dim() > 0]
    assert moments and all(v.dtype == torch.float32 for v in moments)
    obs = np.zeros((2, 4, 84, 84), np.uint8)
    assert bf16._act(obs, epsilon=0.0).dtype == np.int64  # acting reads the fp32 weights


@pytest.mark.slow
def test_a_checkpoint_trained_in_bf16_exports_and_keeps_its_decisions(tmp_path):
    """A bf16 training writes fp32 weights: its checkpoint exports to ONNX and ONNX Runtime
    takes the same action as torch on every fixed state, as an fp32 checkpoint does."""
    from breakout_core.conversion.export import export_onnx
    from breakout_core.diagnosis.parity import compare_q
    from breakout_core.runtimes.registry import make_runtime

    config = TrainConfig(learner_precision="bf16", total_transitions=300, checkpoint_at=(), **SMALL)
    trainer = Trainer(config, Contract().replace(max_episode_frames=400), tmp_path, cpu_flags=AMX)
    final = [r.path for r in trainer.run() if isinstance(r, CheckpointSaved)][-1]
    assert trainer.updates > 0
    exported = export_onnx(final, tmp_path / "bf16.onnx", exporter="torchscript")
    states = np.load(Path(__file__).resolve().parent.parent / "models/reference/fixed_states_60.npz")["obs"]
    with make_runtime("torch") as base, make_runtime("onnxruntime", intra_op_threads=1) as onnx:
        base.load(final)
        onnx.load(exported.onnx_path)
        parity = compare_q(base.infer(states), onnx.infer(states), precision="fp32")
    assert parity.action_agreement == parity.n_states == 60
    assert parity.max_abs_diff < 1e-4
