"""Fully connected layers whose weight is stored input-major, (in, out), while training.

torch's nn.Linear keeps its weight (out, in), and its gradient is then grad_outᵀ @ x: for
the Nature CNN's first fully connected layer a 512 x 32 by 32 x 3136 product, which took
1.3-2.2 times as long on a 2-core Zen 2 as the same gradient laid out as xᵀ @ grad_out
(3136 x 32 by 32 x 512). Stored (in, out), the weight's gradient takes that form and comes
out contiguous. A transposed view of an (out, in) weight would take it too, but the fused
Adam copies a non-contiguous weight, its gradient and moments in and out at every step,
and loses more than the product gains (docs/learner_speed.md, section 8).

The layers' state_dict speaks nn.Linear's (out, in) layout, so checkpoints (byte for byte),
training states and target syncs look the same with the layout on or off; its weight is a
copy, not an alias of the layer's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn


class InputMajorLinear(nn.Module):
    """nn.Linear's function and state_dict, with its weight held (in, out)."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = nn.Parameter(linear.weight.detach().t().contiguous())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.t(), self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        """The weight goes out as an (out, in) copy, with keep_vars too: editing it in place
        does not reach the layer, as it would an nn.Linear's."""
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = destination[prefix + "weight"].detach().t().contiguous()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        key = prefix + "weight"
        # load_state_dict hands each module its own copy of the dict; a tensor that is not 2-D
        # goes in as it is, for torch's own size-mismatch message
        if key in state_dict and state_dict[key].dim() == 2:
            state_dict[key] = state_dict[key].t()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def with_input_major_linears(network: nn.Module) -> nn.Module:
    """`network`, its nn.Linear layers replaced in place by InputMajorLinear ones with their weights."""
    for name, child in network.named_children():
        if isinstance(child, nn.Linear):
            setattr(network, name, InputMajorLinear(child))
        else:
            with_input_major_linears(child)
    return network


def input_major_weights(network: nn.Module) -> list[int]:
    """The positions in `network.parameters()` (an optimizer's order) of its input-major weights."""
    held = {id(m.weight) for m in network.modules() if isinstance(m, InputMajorLinear)}
    return [i for i, p in enumerate(network.parameters()) if id(p) in held]


def transposed_at(tensors: Sequence[torch.Tensor], positions: Iterable[int]) -> list[torch.Tensor]:
    """`tensors` with those at `positions` transposed (and contiguous): a weight-shaped tensor
    of an input-major layer in nn.Linear's layout, or back. Transposing is its own inverse, so
    one function serves saving and loading."""
    out = list(tensors)
    for i in positions:
        out[i] = out[i].t().contiguous()
    return out


def optimizer_state_transposed_at(state_dict: dict, positions: Iterable[int]) -> dict:
    """An optimizer's state_dict with the weight-shaped state (Adam's moments) of the parameters
    at `positions` transposed as `transposed_at` does; the live optimizer's state is left alone."""
    state = dict(state_dict["state"])
    for i in positions:
        if i in state:
            state[i] = {key: value.t().contiguous() if torch.is_tensor(value) and value.dim() == 2 else value
                        for key, value in state[i].items()}
    return {**state_dict, "state": state}
