"""Input-major fully connected layers compute what nn.Linear computes and speak its state_dict,
so a network holding them reads and writes the checkpoints of one that does not."""

import copy

import pytest
import torch
from torch import nn

from breakout_core.game.contract import Contract
from breakout_core.learning.input_major import (
    InputMajorLinear,
    input_major_weights,
    transposed_at,
    with_input_major_linears,
)
from breakout_core.learning.qnetwork import QNetwork, load_checkpoint, save_checkpoint


@pytest.mark.parametrize("architecture", ["nature", "dueling"])
def test_a_network_with_input_major_linears_is_the_same_network(architecture):
    torch.manual_seed(0)
    plain = QNetwork(architecture)
    converted = with_input_major_linears(copy.deepcopy(plain))
    linears = [m for m in converted.modules() if isinstance(m, InputMajorLinear)]
    assert len(linears) == (4 if architecture == "dueling" else 2)
    assert not any(isinstance(m, nn.Linear) for m in converted.modules())
    assert all(m.weight.shape == (m.in_features, m.out_features) and m.weight.is_contiguous() for m in linears)

    # its state_dict is nn.Linear's: the same keys, shapes and values
    state, converted_state = plain.state_dict(), converted.state_dict()
    assert list(converted_state) == list(state)
    for key, value in state.items():
        assert torch.equal(converted_state[key], value), key

    obs = torch.randint(0, 256, (5, 4, 84, 84), dtype=torch.uint8)
    torch.testing.assert_close(converted(obs), plain(obs), rtol=1e-5, atol=1e-6)
    plain(obs).sum().backward()
    converted(obs).sum().backward()
    positions = input_major_weights(converted)
    assert len(positions) == len(linears)
    grads = transposed_at([p.grad for p in converted.parameters()], positions)
    for got, want in zip(grads, (p.grad for p in plain.parameters())):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)

    # with keep_vars too, as copies: editing one does not reach the layer
    kept = converted.state_dict(keep_vars=True)
    assert all(torch.equal(kept[key], value) for key, value in state.items())
    fc1 = next(key for key in kept if key.endswith("0.weight") and not key.startswith("torso"))
    copy.deepcopy(kept)[fc1].zero_()
    kept[fc1].zero_()
    assert torch.count_nonzero(converted.state_dict()[fc1]) > 0

    # it loads nn.Linear's state_dict
    other = QNetwork(architecture)
    converted.load_state_dict(other.state_dict())
    torch.testing.assert_close(converted(obs), other(obs), rtol=1e-5, atol=1e-6)


def test_a_checkpoint_of_a_network_with_input_major_linears_loads_as_a_plain_one(tmp_path):
    torch.manual_seed(1)
    converted = with_input_major_linears(QNetwork())
    path = save_checkpoint(tmp_path / "net.pt", converted, Contract(), transitions=0)
    loaded, _ = load_checkpoint(path)
    obs = torch.randint(0, 256, (3, 4, 84, 84), dtype=torch.uint8)
    torch.testing.assert_close(loaded(obs), converted(obs), rtol=1e-5, atol=1e-6)
    assert all(t.is_contiguous() for t in torch.load(path, weights_only=True)["state_dict"].values())
