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
from breakout_core.learning.learner_precision import PrecisionUnavailable, choose_learner_precision
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


def test_auto_chooses_bf16_only_with_amx():
    with_amx = choose_learner_precision("auto", "cpu", AMX)
    assert (with_amx.chosen, with_amx.autocast) == ("bf16", True)
    assert with_amx.cpu_flags == ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")
    without = choose_learner_precision("auto", "cpu", AVX512_BF16_ONLY)
    assert (without.chosen, without.autocast) == ("fp32", False)
    assert "lacks amx_tile, amx_bf16" in without.reason
    assert choose_learner_precision("auto", "cuda:0", AMX).chosen == "fp32"  # a CUDA learner stays fp32
    assert choose_learner_precision("fp32", "cpu", AMX).chosen == "fp32"  # fp32 is what was asked


def test_auto_on_this_cpu_follows_its_flags():
    choice = choose_learner_precision("auto")
    assert choice.chosen == ("bf16" if this_cpu_has_amx() else "fp32")
    assert choice.requested == "auto" and choice.reason


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
    well can run there; the record says the speed is not AMX's, and auto still stays fp32."""
    native = choose_learner_precision("bf16", "cpu", AVX512_BF16_ONLY)
    assert (native.chosen, native.autocast) == ("bf16", True)
    assert "has avx512_bf16 but lacks amx_tile, amx_bf16" in native.reason and "not AMX's" in native.reason
    assert choose_learner_precision("auto", "cpu", AVX512_BF16_ONLY).chosen == "fp32"


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
