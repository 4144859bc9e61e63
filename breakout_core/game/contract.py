"""The contract: everything that decides what the agent sees and how a score counts.

Two results are comparable only when their contracts hash the same. Evaluation always
reports the raw Atari score of full games; reward clipping applies to training only.

Serving after a lost life (`serve_after_life_loss`, off in breakout-v2): when on, the
caller plays one forced FIRE agent step after every life lost that does not end the game,
so an agent that never learned to serve (greedy Q(FIRE) a hair below Q(LEFT) in the
ball-less state: the two differ by (1 - gamma) of the state's value) cannot stall until
the time limit. It changes the game (the agent no longer decides when to serve), so it is
a different contract with its own hash, never a silent evaluation tweak.

The episode driver (`breakout_core.game.driver`) plays every rule here: an episode of seed s
starts from the emulator state of a ROM load seeded with s, then the no-op start (forced
NOOP agent steps, the count drawn from s) and the serves.

breakout-v2 has no sticky actions, so the seed reaches only the no-op count (and the
policy's own generator): 30 seeds replay a handful of distinct games (the reference
agent: 4 distinct scores on 30 seeds). breakout-v3 is breakout-v2 with sticky actions at
0.25 per emulator frame (Machado et al. 2018; ALE/Breakout-v5's default), applied by the
emulator inside the frame skip, its generator seeded by the episode seed, and without the
no-op start: on the reference agent's 30 seeds, sticky actions gave 22 distinct scores
with the no-op start and 22 without it (the random policy: 7 and 7), so the no-op start
adds no distinct games under sticky actions and only spends up to 30 steps the agent does
not choose. Machado et al. recommend sticky actions in its place.

Two presets name the games other projects' agents learn in, so that such an agent is judged
in its own game (docs/contracts.md says where each differs from the wrappers it stands for):
`ale-breakout-v5`, gymnasium's `ALE/Breakout-v5` defaults (sticky actions at 0.25, no FIRE
at the reset: the agent serves), and `deepmind-noframeskip-v4`, the DeepMind evaluation that
CleanRL's and Stable-Baselines3's Atari wrappers play on `BreakoutNoFrameskip-v4` (no sticky
actions, a 0-30 no-op start, FIRE at the reset and after every lost life).

The action set (`full_action_space`, an option on any contract): an agent's output k is the k-th
action of ALE's minimal set for Breakout (NOOP, FIRE, RIGHT, LEFT), or, with the option on, of
ALE's legal set, all 18 joystick actions in ALE's own order, as ale-py's `full_action_space=True`
maps them (`getLegalActionSet`). NOOP and FIRE are outputs 0 and 1 in both, so the contract's
forced steps (no-op start, serve) are the same actions. The option changes what an output means,
so it is part of the hash.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from dataclasses import dataclass


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
    full_action_space: bool = False  # ALE's 18 legal actions instead of Breakout's minimal 4 (see above)

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

    @property
    def action_names(self) -> tuple[str, ...]:
        """The ALE action each of the agent's outputs plays, in output order."""
        return FULL_ACTION_NAMES if self.full_action_space else MINIMAL_ACTION_NAMES

    @property
    def num_actions(self) -> int:
        return len(self.action_names)

    def minimal_outputs(self) -> list[int]:
        """The outputs that play Breakout's minimal actions, NOOP, FIRE, RIGHT and LEFT in that order
        (0-3, or 0, 1, 3, 4 of the full set): what the stored per-action columns hold."""
        return [self.action_names.index(name) for name in MINIMAL_ACTION_NAMES]

    def rules(self) -> str:
        """Every rule of the game in words, in the order a player meets them."""
        sticky = (f"sticky actions at {self.repeat_action_probability:g}" if self.repeat_action_probability
                  else "no sticky actions")
        noop = (f"a no-op start of 0-{self.noop_start_max} agent steps" if self.noop_start_max
                else "no no-op start")
        fire = "FIRE pressed at the reset" if self.fire_on_reset else "no FIRE at the reset (the agent serves)"
        serve = ", a forced FIRE step after each lost life" if self.serve_after_life_loss else ""
        pooled = ", max-pooled over its last 2 frames" if self.max_pool else " (its last frame)"
        size = self.screen_size
        actions = f"ALE's full set of {self.num_actions} actions, " if self.full_action_space else ""
        return (f"{sticky}, {noop}, {fire}{serve}; {actions}each action held {self.frame_skip} frames{pooled}; "
                f"{size}x{size} grayscale, {self.frame_stack} frames stacked; full games up to "
                f"{self.max_episode_frames:,} frames, raw score")

    def described(self) -> str:
        """The contract as a person reads it: name, hash and rules."""
        return f"{self.name} ({self.hash}): {self.rules()}"


# field -> the default that leaves hashes as they were
ADDED_LATER = {"serve_after_life_loss": False, "full_action_space": False}
# ALE's action sets for Breakout (ale-py 0.12.1): getMinimalActionSet, and getLegalActionSet (every
# joystick action, in the order of ALE's Action enum); envs.AleGame checks both against its emulator
MINIMAL_ACTION_NAMES = ("NOOP", "FIRE", "RIGHT", "LEFT")
FULL_ACTION_NAMES = ("NOOP", "FIRE", "UP", "RIGHT", "LEFT", "DOWN", "UPRIGHT", "UPLEFT", "DOWNRIGHT", "DOWNLEFT",
                     "UPFIRE", "RIGHTFIRE", "LEFTFIRE", "DOWNFIRE", "UPRIGHTFIRE", "UPLEFTFIRE", "DOWNRIGHTFIRE",
                     "DOWNLEFTFIRE")
FIRE = 1  # the output that serves, in either action set
MAX_EPISODE_SEED = 2**31 - 1  # an episode seed seeds ALE's sticky-action generator, a C int
# sticky actions at most this likely: an episode start clears the last action with one NOOP frame whose
# sticky draw is 0.549 (envs.episode_start)
MAX_REPEAT_ACTION_PROBABILITY = 0.5

CONTRACTS: dict[str, Contract] = {
    "breakout-v2": Contract(),
    "breakout-v3": Contract(name="breakout-v3", repeat_action_probability=0.25, noop_start_max=0),
    "ale-breakout-v5": Contract(name="ale-breakout-v5", repeat_action_probability=0.25, noop_start_max=0,
                                fire_on_reset=False),
    "deepmind-noframeskip-v4": Contract(name="deepmind-noframeskip-v4", repeat_action_probability=0.0,
                                        noop_start_max=30, fire_on_reset=True, serve_after_life_loss=True),
}
DEFAULT_CONTRACT = "breakout-v3"  # what a spec that names no contract plays


def contract_by_name(name: str) -> Contract:
    try:
        return CONTRACTS[name]
    except KeyError:
        raise KeyError(f"unknown contract {name!r}; known: {', '.join(sorted(CONTRACTS))}") from None
