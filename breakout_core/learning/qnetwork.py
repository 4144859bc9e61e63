"""Q-networks (Nature DQN CNN, optional dueling head) and their checkpoint files.

Input uint8 (B, 4, 84, 84), output float32 (B, 4) for NOOP, FIRE, RIGHT, LEFT.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

from breakout_core.common.files import torch_bytes, write_whole
from breakout_core.common.messages import described
from breakout_core.game.contract import Contract
from breakout_core.game.envs import NUM_ACTIONS

CHECKPOINT_FORMAT = "breakout-dqn-checkpoint/1"
ARCHITECTURES = ("nature", "dueling")


class QNetwork(nn.Module):
    """Nature DQN torso; a plain linear head or a dueling (value + advantage) head."""

    def __init__(self, architecture: str = "nature", num_actions: int = NUM_ACTIONS, frame_stack: int = 4):
        super().__init__()
        if architecture not in ARCHITECTURES:
            raise ValueError(f"unknown architecture {architecture!r}; known: {', '.join(ARCHITECTURES)}")
        self.architecture = architecture
        self.num_actions = num_actions  # one output per action of the contract it plays
        self.torso = nn.Sequential(
            nn.Conv2d(frame_stack, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )
        if architecture == "dueling":
            self.value = nn.Sequential(nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, 1))
            self.advantage = nn.Sequential(nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, num_actions))
        else:
            self.head = nn.Sequential(nn.Linear(3136, 512), nn.ReLU(), nn.Linear(512, num_actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        features = self.torso(obs.float() / 255.0)
        if self.architecture == "dueling":
            advantage = self.advantage(features)
            return self.value(features) + advantage - advantage.mean(dim=1, keepdim=True)
        return self.head(features)


def save_checkpoint(
    path: str | Path,
    network: QNetwork,
    contract: Contract,
    *,
    transitions: int,
    train_config: dict[str, Any] | None = None,
) -> Path:
    """Write weights with the contract and training config that produced them."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": CHECKPOINT_FORMAT,
        "architecture": network.architecture,
        "state_dict": network.state_dict(),
        "contract": contract.to_dict(),
        "contract_hash": contract.hash,
        "transitions": int(transitions),
        "train_config": dict(train_config or {}),
    }
    return write_whole(path, torch_bytes(payload))  # a reader never sees a half-written checkpoint


def load_checkpoint(path: str | Path) -> tuple[QNetwork, dict[str, Any]]:
    """Load a checkpoint safely (weights_only) and return the network in eval mode and its metadata."""
    path = Path(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except pickle.UnpicklingError:  # torch's message goes on to suggest an unsafe load
        raise ValueError(f"{path}: not a readable checkpoint (it holds Python objects a weights-only load "
                         "refuses)") from None
    except Exception as exc:  # torch raises several types for a corrupt or foreign file
        raise ValueError(f"{path}: not a readable checkpoint ({described(exc, 'unreadable')})") from None
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise ValueError(f"{path}: not a {CHECKPOINT_FORMAT} file")
    last = "advantage.2.bias" if payload["architecture"] == "dueling" else "head.2.bias"
    network = QNetwork(payload["architecture"], num_actions=int(payload["state_dict"][last].shape[0]))
    network.load_state_dict(payload["state_dict"])
    network.eval()
    meta = {k: v for k, v in payload.items() if k != "state_dict"}
    return network, meta


def checkpoint_contract(path: str | Path) -> tuple[str | None, str]:
    """(name, hash) of the contract a checkpoint was trained under."""
    meta = load_checkpoint(path)[1]
    if not meta.get("contract_hash"):
        raise ValueError(f"{path}: a checkpoint without its contract hash; its game is unknown")
    return (meta.get("contract") or {}).get("name"), meta["contract_hash"]
