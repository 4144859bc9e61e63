"""A network shaped as CleanRL's `dqn_atari.py` QNetwork (one nn.Sequential: three convolutions,
two linear layers), taking uint8 observations and dividing by 255 inside, exported the way a
user does it: `torch.onnx.export` with a dynamic batch, no metadata. Its weights are the shipped
reference agent's, so it plays exactly as the reference does."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

REFERENCE_PT = Path(__file__).resolve().parents[1] / "models" / "reference" / "dqn_breakout.pt"


class CleanRLQNetwork(nn.Module):
    def __init__(self, actions: int = 4):
        super().__init__()
        self.network = nn.Sequential(
            nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
            nn.Linear(3136, 512), nn.ReLU(),
            nn.Linear(512, actions),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x.float() / 255.0)


def reference_weighted() -> CleanRLQNetwork:
    """The CleanRL-shaped network holding the shipped agent's weights."""
    from breakout_core.learning.qnetwork import load_checkpoint

    reference, _ = load_checkpoint(REFERENCE_PT)
    net = CleanRLQNetwork()
    layers = [*[m for m in reference.torso if isinstance(m, nn.Conv2d)],
              *[m for m in reference.head if isinstance(m, nn.Linear)]]
    mine = [m for m in net.network if isinstance(m, (nn.Conv2d, nn.Linear))]
    for target, source in zip(mine, layers, strict=True):
        target.load_state_dict(source.state_dict())
    return net.eval()


def export_cleanrl_shaped(path: Path) -> Path:
    """The network exported with uint8 input (B, 4, 84, 84), the batch dimension dynamic."""
    net = reference_weighted()
    example = torch.zeros(1, 4, 84, 84, dtype=torch.uint8)
    torch.onnx.export(net, (example,), str(path), input_names=["x"], output_names=["q_values"],
                      dynamic_axes={"x": {0: "batch"}, "q_values": {0: "batch"}}, dynamo=False)
    return path
