"""Artifacts shared by the runtime, export and fixed-state tests, built once per session.

An untrained Nature-DQN checkpoint (torch.manual_seed(0)), 24 fixed states captured from its
own short real play on the ALE, and its FP32 and FP16 ONNX exports. `tests/conftest.py` loads
this module as a plugin, so a test asks for `artifacts` and `one_torch_thread` by name. On this
2-core machine torch's default two threads spin against any other job (measured: 125 ms a batch
instead of 1.3 ms), so the tests run torch and ONNX Runtime on one thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

N_STATES = 24
EPISODE_SEEDS = (0, 1, 2)
MAX_STEPS = 200  # agent steps per captured episode: enough to spread states, short to play

_cache: dict[str, "Artifacts"] = {}


@dataclass(frozen=True)
class Artifacts:
    folder: Path
    checkpoint: Path
    states_path: Path
    states: object  # FixedStates
    export: object  # ExportResult


@pytest.fixture(scope="module")
def one_torch_thread():
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory, one_torch_thread) -> Artifacts:
    if "shared" not in _cache:
        import torch

        from breakout_core.conversion.export import export_onnx
        from breakout_core.evaluation.fixed_states import capture_from_checkpoint, save_fixed_states
        from breakout_core.game.contract import Contract
        from breakout_core.learning.qnetwork import QNetwork, save_checkpoint

        folder = tmp_path_factory.mktemp("runtime_artifacts")
        torch.manual_seed(0)
        checkpoint = save_checkpoint(folder / "model.pt", QNetwork(), Contract(), transitions=0)
        states = capture_from_checkpoint(
            checkpoint, n_states=N_STATES, episode_seeds=EPISODE_SEEDS, epsilon=0.05,
            max_steps_per_episode=MAX_STEPS, batch_size=len(EPISODE_SEEDS),
        )
        states_path = save_fixed_states(folder / "states.npz", states)
        export = export_onnx(checkpoint, folder / "model.onnx", fp16_path=folder / "model.fp16.onnx",
                             verify_obs=states.obs[:4])
        _cache["shared"] = Artifacts(folder, checkpoint, states_path, states, export)
    return _cache["shared"]
