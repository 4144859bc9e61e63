"""Policies that choose actions for a batch of observations.

Every slot of a batch carries its own random generator, seeded from the episode seed, so
an episode's actions depend only on its seed and the policy, never on which other
episodes share the batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol, Sequence

import numpy as np

from breakout_core.game.envs import NUM_ACTIONS
from breakout_core.game.greedy import finite_q


class Policy(Protocol):
    name: str

    def act(self, obs: np.ndarray, rngs: Sequence[np.random.Generator]) -> np.ndarray:
        """obs uint8 (B, 4, 84, 84) -> int64 actions (B,), one generator per row."""
        ...


class RandomPolicy:
    """Uniform over the contract's actions (the minimal four by default): the baseline every agent must beat."""

    name = "random"

    def __init__(self, num_actions: int = NUM_ACTIONS):
        self.num_actions = num_actions

    def act(self, obs: np.ndarray, rngs: Sequence[np.random.Generator]) -> np.ndarray:
        return np.fromiter((rng.integers(self.num_actions) for rng in rngs), dtype=np.int64, count=len(rngs))


class QNetworkPolicy:
    """Epsilon-greedy over a Q-network; epsilon 0 is the greedy policy used in evaluation.

    Each row draws one uniform number per step whatever epsilon is, so the random stream of
    an episode does not depend on earlier greedy/random choices.
    """

    def __init__(self, network, epsilon: float = 0.0, name: str = "qnetwork"):
        import torch

        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        self._torch = torch
        self.network = network.eval()
        self.num_actions = getattr(network, "num_actions", None)  # a QNetwork's; None: unknown, not checked
        self.epsilon = float(epsilon)
        self.name = name

    @classmethod
    def from_checkpoint(cls, path: str | Path, epsilon: float = 0.0) -> "QNetworkPolicy":
        from breakout_core.learning.qnetwork import load_checkpoint

        network, meta = load_checkpoint(path)
        policy = cls(network, epsilon, name=Path(path).stem)
        policy.checkpoint_meta = meta
        return policy

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        with self._torch.inference_mode():
            return self.network(self._torch.from_numpy(np.ascontiguousarray(obs))).numpy()

    def act(self, obs: np.ndarray, rngs: Sequence[np.random.Generator]) -> np.ndarray:
        return epsilon_greedy(self.q_values(obs), rngs, self.epsilon)


class OnnxPolicy:
    """Epsilon-greedy over an ONNX model of the agent (uint8 (B, 4, 84, 84) in) on ONNX Runtime's CPU."""

    def __init__(self, path: str | Path, epsilon: float = 0.0):
        from breakout_core.runtimes.onnxruntime_runtime import OnnxRuntimeRuntime

        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon}")
        self.runtime = OnnxRuntimeRuntime(intra_op_threads=1, node_placement=False).load(path)
        self.epsilon = float(epsilon)
        self.name = Path(path).stem

    def act(self, obs: np.ndarray, rngs: Sequence[np.random.Generator]) -> np.ndarray:
        return epsilon_greedy(self.runtime.infer(obs), rngs, self.epsilon)

    def close(self) -> None:
        self.runtime.close()


def check_fits(policy: Policy, contract) -> None:
    """ValueError where `policy` decides among another number of actions than `contract` plays (a
    4-action network under full_action_space would play its outputs as NOOP, FIRE, UP, RIGHT)."""
    width = getattr(policy, "num_actions", None)
    if width is not None and width != contract.num_actions:
        raise ValueError(f"policy {policy.name} chooses among {width} actions, and contract {contract.name} "
                         f"({contract.hash}) plays {contract.num_actions}")


def epsilon_greedy(q: np.ndarray, rngs: Sequence[np.random.Generator], epsilon: float) -> np.ndarray:
    """Each row's greedy action, or a random one (of the model's outputs, one per action of its
    contract) with probability epsilon; every row draws one uniform number and one action whatever
    epsilon is. NonFiniteQ where a row's Q-values are not all finite."""
    greedy = finite_q(q).argmax(axis=1)
    explore = np.fromiter((rng.random() for rng in rngs), dtype=np.float64, count=len(rngs))
    random_actions = np.fromiter((rng.integers(q.shape[1]) for rng in rngs), dtype=np.int64, count=len(rngs))
    return np.where(explore < epsilon, random_actions, greedy).astype(np.int64)
