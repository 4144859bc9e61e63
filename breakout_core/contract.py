"""The contract: everything that decides what the agent sees and how a score counts.

Two results are comparable only when their contracts hash the same. Evaluation always
reports the raw Atari score of full games; reward clipping applies to training only.

Serving after a lost life (`serve_after_life_loss`, off in breakout-v2): when on, the
caller plays one forced FIRE agent step after every life lost that does not end the game,
so an agent that never learned to serve (greedy Q(FIRE) a hair below Q(LEFT) in the
ball-less state: the two differ by (1 - gamma) of the state's value) cannot stall until
the time limit. It changes the game (the agent no longer decides when to serve), so it is
a different contract with its own hash, never a silent evaluation tweak.

The no-op start is played by the caller (evaluator, trainer) as forced NOOP agent steps,
as in the Nature DQN evaluation, not inside the emulator's reset: a seeded ALE reset
reloads the ROM (~0.1 s), while an unseeded reset with sticky actions off is
deterministic and ~10x cheaper, so the episode seed only has to choose the no-op count
(and seed the policy's own randomness).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Contract:
    """Frozen description of the Breakout environment as the agent experiences it."""

    name: str = "breakout-v2"
    game: str = "breakout"
    frame_skip: int = 4  # emulator frames per agent step
    max_pool: bool = True  # max over the last two frames of each skip
    screen_size: int = 84  # square, grayscale
    frame_stack: int = 4  # observations are uint8 (frame_stack, screen_size, screen_size)
    noop_start_max: int = 30  # an episode starts with 0..this many forced NOOP agent steps, drawn from its seed
    repeat_action_probability: float = 0.0  # sticky actions
    fire_on_reset: bool = True  # press FIRE once at reset (not after a lost life)
    clip_rewards_in_training: bool = True  # sign(reward) in training only
    max_episode_frames: int = 108_000  # emulator frames; 30 minutes of play at 60 Hz
    serve_after_life_loss: bool = False  # a forced FIRE agent step after each lost life (see above)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def hash(self) -> str:
        """Short sha256 of every field, name included, in a canonical JSON form.

        Fields added after breakout-v2 are left out of the canonical form while they hold
        their defaults, so every hash stored before they existed still names the same game.
        """
        fields = {k: v for k, v in self.to_dict().items() if ADDED_LATER.get(k, object()) != v}
        canonical = json.dumps(fields, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]

    def replace(self, **changes: object) -> "Contract":
        return dataclasses.replace(self, **changes)


ADDED_LATER = {"serve_after_life_loss": False}  # field -> the default that leaves hashes as they were
FIRE = 1  # the action index that serves (envs.ACTION_NAMES)

CONTRACTS: dict[str, Contract] = {"breakout-v2": Contract()}


def serves(contract: Contract, lives_before: np.ndarray, lives_after: np.ndarray, done: np.ndarray) -> np.ndarray:
    """Slots whose next agent step is a forced FIRE: a life was lost and the game goes on."""
    if not contract.serve_after_life_loss:
        return np.zeros(np.shape(done), dtype=bool)
    return (np.asarray(lives_after) < np.asarray(lives_before)) & ~np.asarray(done, dtype=bool)


def contract_by_name(name: str) -> Contract:
    try:
        return CONTRACTS[name]
    except KeyError:
        raise KeyError(f"unknown contract {name!r}; known: {', '.join(sorted(CONTRACTS))}") from None
