"""Q-networks shaped as the wider RL community writes them, exported as those projects show, with the
reference agent's weights (same layer shapes), so each plays exactly as the reference does.

- CleanRL's `dqn_atari.py`: one Sequential, the Nature CNN, `x / 255.0` in forward; exported with
  `torch.onnx.export(net, torch.zeros(1, 4, 84, 84), path)`: float32 input in 0-255, batch fixed at 1.
- Stable-Baselines3's `DQN("CnnPolicy").policy.q_net`: a NatureCNN features extractor (`cnn`,
  then `linear`) and a `q_net` head; its forward runs `preprocess_obs`, which casts to float and
  divides by 255 (SB3's export guide: "this pre-processing is done inside the policy"). Exported
  from a random float observation of the policy's (4, 84, 84) space, opset 17.
Variants: 18 outputs (ALE's full action set, the reference's 4 actions at their places in it), a
dynamic batch, channels last (NHWC, float32 or uint8), scaled to 0-1 outside the network, and an
FP16 file with float16 input and output (onnxconverter-common, keep_io_types=False).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from breakout_core.game.contract import CONTRACTS, DEFAULT_CONTRACT

REFERENCE_PT = Path(__file__).resolve().parents[1] / "models" / "reference" / "dqn_breakout.pt"


def _nature_layers(actions: int = 4) -> list[nn.Module]:
    return [nn.Conv2d(4, 32, 8, stride=4), nn.ReLU(), nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(), nn.Flatten(), nn.Linear(3136, 512), nn.ReLU(),
            nn.Linear(512, actions)]


def _reference_layers(checkpoint: Path) -> list[torch.Tensor]:
    """A checkpoint's weights and biases in layer order (conv, conv, conv, fc, fc)."""
    from breakout_core.learning.qnetwork import load_checkpoint

    network, _ = load_checkpoint(checkpoint)
    state = network.state_dict()
    order = ["torso.0", "torso.2", "torso.4", "head.0", "head.2"]
    return [state[f"{name}.{part}"] for name in order for part in ("weight", "bias")]


FULL_SET_LOSS = 100.0  # below the reference's Q-values by far more than they spread: never the greedy action


def _load(modules: list[nn.Module], actions: int, checkpoint: Path = REFERENCE_PT) -> None:
    weights = _reference_layers(checkpoint)
    for module, (weight, bias) in zip(modules, zip(weights[::2], weights[1::2])):
        if module.weight.shape == weight.shape:
            module.weight.data.copy_(weight)
            module.bias.data.copy_(bias)
        else:  # ALE's full action set: the reference's 4 actions where that set has them, so that it plays as
            # the reference does under full_action_space; every other action NOOP's row, FULL_SET_LOSS lower
            module.weight.data.copy_(weight[0].expand(actions, -1))
            module.bias.data.copy_(bias[0] - FULL_SET_LOSS)
            where = CONTRACTS[DEFAULT_CONTRACT].replace(full_action_space=True).minimal_outputs()
            module.weight.data[where] = weight
            module.bias.data[where] = bias


class CleanRLQNetwork(nn.Module):
    """CleanRL's shape: `self.network` and `x / 255.0` in forward."""

    def __init__(self, actions: int = 4, scale_inside: bool = True, checkpoint: Path = REFERENCE_PT):
        super().__init__()
        self.network = nn.Sequential(*_nature_layers(actions))
        self.scale_inside = scale_inside
        _load([m for m in self.network if isinstance(m, (nn.Conv2d, nn.Linear))], actions, checkpoint)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.network(x / 255.0 if self.scale_inside else x)


class ChannelsLast(nn.Module):
    """A network fed (B, 84, 84, 4) frames, as a channels-last observation pipeline gives them."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.permute(0, 3, 1, 2))


class SB3NatureCNN(nn.Module):
    def __init__(self):
        super().__init__()
        layers = _nature_layers()
        self.cnn = nn.Sequential(*layers[:7])
        self.linear = nn.Sequential(*layers[7:9])


class SB3QNetwork(nn.Module):
    """SB3's `policy.q_net`: features extractor, then `q_net`; preprocessing (float, /255) inside."""

    def __init__(self):
        super().__init__()
        self.features_extractor = SB3NatureCNN()
        self.q_net = nn.Sequential(nn.Linear(512, 4))
        fx = self.features_extractor
        _load([fx.cnn[0], fx.cnn[2], fx.cnn[4], fx.linear[0], self.q_net[0]], 4)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q_net(self.features_extractor.linear(self.features_extractor.cnn(obs.float() / 255.0)))


def export(network: nn.Module, path: Path, example: torch.Tensor, *, dynamic_batch: bool = False,
           opset: int | None = None) -> Path:
    """torch.onnx.export as the projects' guides call it (the TorchScript exporter)."""
    network.eval()
    extra = {"input_names": ["x"], "output_names": ["q"],
             "dynamic_axes": {"x": {0: "batch"}, "q": {0: "batch"}}} if dynamic_batch else {}
    if opset is not None:
        extra["opset_version"] = opset
    with torch.no_grad():
        torch.onnx.export(network, example, str(path), dynamo=False, **extra)
    return path


def cleanrl_onnx(path: Path, *, dynamic_batch: bool = False, actions: int = 4,
                 checkpoint: Path = REFERENCE_PT) -> Path:
    network = CleanRLQNetwork(actions, checkpoint=checkpoint)
    return export(network, path, torch.zeros(1, 4, 84, 84), dynamic_batch=dynamic_batch)


def sb3_onnx(path: Path) -> Path:
    return export(SB3QNetwork(), path, torch.randn(1, 4, 84, 84), opset=17)


def nhwc_onnx(path: Path, dtype: torch.dtype = torch.float32) -> Path:
    return export(ChannelsLast(CleanRLQNetwork()), path, torch.zeros(1, 84, 84, 4, dtype=dtype), dynamic_batch=True)


def scaled_outside_onnx(path: Path) -> Path:
    """A network that takes observations already scaled to 0-1."""
    return export(CleanRLQNetwork(scale_inside=False), path, torch.zeros(1, 4, 84, 84), dynamic_batch=True)


def fp16_io_onnx(source: Path, path: Path, *, keep_io_types: bool = False, keep_input_cast: bool = False) -> Path:
    """onnxconverter-common's FP16 conversion as its README shows it; `keep_input_cast`: with the
    Cast that reads a uint8 input kept in float32 (node_block_list), the valid way to convert a
    uint8-input file, which keeps its output name (`q_values` for this project's exports)."""
    import onnx
    from onnxconverter_common import float16

    model = onnx.load(source)
    blocked = [n.name for n in model.graph.node if n.op_type == "Cast"][:1] if keep_input_cast else None
    model = float16.convert_float_to_float16(model, keep_io_types=keep_io_types, node_block_list=blocked)
    onnx.save_model(model, path)
    return path
