"""Breakout on the real ALE emulator (ale-py's bundled ROM).

`AleGame` is one game on its own ALEInterface, preprocessed as the contract says, so that
its emulator state can be saved and restored: the episode driver (`breakout_core.game.driver`)
starts every seeded episode by restoring the state that a seeded ROM load leaves after
ALE's reset (`episode_start`), which ale-py's native vector env cannot do (it has no
clone/restore). Its preprocessing is the native vector env's, step for step (tests compare
the two frame by frame): the action is repeated `frame_skip` emulator frames, sticky
actions applied by the emulator inside each frame; the last two frames are max-pooled,
turned to grayscale with the emulator's own palette and resized with OpenCV's INTER_AREA;
the newest frame goes last in the stack.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

import cv2
import numpy as np
from ale_py import Action, ALEInterface, ALEState, LoggerMode, roms

from breakout_core.game.contract import FIRE, MINIMAL_ACTION_NAMES, Contract

ACTION_NAMES = MINIMAL_ACTION_NAMES  # what the agent's outputs play under a contract without full_action_space
NUM_ACTIONS = len(ACTION_NAMES)

ALEInterface.setLoggerMode(LoggerMode.Error)  # a ROM load would print six lines to stdout
# OpenCV's pool would spread each 210x160 -> 84x84 resize over threads that the games of a driver's
# other process (or the learner's torch threads) need; one frame gains ~25 us from it.
cv2.setNumThreads(0)


def new_emulator(contract: Contract, random_seed: int) -> ALEInterface:
    """An ALEInterface with the contract's sticky actions, its ROM loaded under `random_seed`.

    The seed is read only by the load, and it seeds only the sticky-action generator.
    """
    ale = ALEInterface()
    ale.setFloat("repeat_action_probability", contract.repeat_action_probability)
    ale.setInt("random_seed", int(random_seed))
    ale.loadROM(roms.get_rom_path(contract.game))
    return ale


# ALE decides each frame's sticky action with std::mt19937 draws (StellaEnvironment::act,
# ale-py 0.11-0.12): the last action played is kept when a draw falls below the repeat
# probability. Seeded with 0, the generator's first draw is 2357136044 / 2**32 (std::mt19937
# and numpy's MT19937 share their seeding), so one NOOP frame from seed 0's fresh state
# makes NOOP the last action under any repeat probability below it.
LAST_ACTION_CLEARING_SEED = 0
LAST_ACTION_CLEARING_DRAW = 2357136044 / 2**32


@dataclass(frozen=True)
class EpisodeStart:
    """Where seed s's episode begins: the emulator state (sticky-action generator included)
    that a ROM load seeded with s leaves after ALE's reset, and that frame's grayscale screen
    where the contract does not press FIRE at the reset (a restore leaves the screen as it was).

    ALE keeps the last action played outside its saved states, and a reset makes it NOOP; so
    `restore` first plays one NOOP frame whose draw keeps nothing (from `_last_action_clearer`),
    then restores the state: 0.5-1.1 ms against 11-12 ms for ALE's reset, which emulates some 70
    frames (on a 2-core AMD EPYC, `benchmarks/spine.py`).
    """

    state: ALEState
    clearer: ALEState
    screen: np.ndarray | None

    def restore(self, ale: ALEInterface) -> None:
        ale.restoreState(self.clearer)
        ale.act(Action.NOOP)
        ale.restoreState(self.state)


_STARTS: OrderedDict[tuple[str, int | None], EpisodeStart] = OrderedDict()
_STARTS_MAX = 4_096  # ~14 KB each (plus a 33.6 KB screen without a FIRE at the reset)


@lru_cache(maxsize=None)
def _last_action_clearer(contract: Contract) -> ALEState:
    ale = new_emulator(contract, LAST_ACTION_CLEARING_SEED)
    used = ale.getFloat("repeat_action_probability")  # as ALE keeps it: 6 significant digits
    if used >= LAST_ACTION_CLEARING_DRAW:
        raise ValueError(f"sticky actions at {used} would keep the last action through the NOOP frame that "
                         f"clears it (its draw is {LAST_ACTION_CLEARING_DRAW:.7f})")
    return ale.cloneState(include_rng=True)


def episode_start(contract: Contract, seed: int) -> EpisodeStart:
    """Seed `seed`'s episode start under the contract's emulator settings, made once per process.

    Keyed by the emulator settings that the state depends on (sticky-action probability,
    game) and the seed; without sticky actions no seed reaches the emulator.
    """
    key = (f"{contract.game}/{contract.repeat_action_probability!r}/{contract.fire_on_reset}",
           int(seed) if contract.repeat_action_probability > 0 else None)
    start = _STARTS.get(key)
    if start is None:
        ale = new_emulator(contract, key[1] or 0)
        ale.reset_game()
        start = EpisodeStart(ale.cloneState(include_rng=True),
                             _last_action_clearer(contract),
                             None if contract.fire_on_reset else ale.getScreenGrayscale())
        _STARTS[key] = start
        if len(_STARTS) > _STARTS_MAX:
            _STARTS.popitem(last=False)
    else:
        _STARTS.move_to_end(key)
    return start


def contract_action_set(contract: Contract, ale: ALEInterface) -> list[Action]:
    """The ALE action each of the agent's outputs plays: ALE's legal set under `full_action_space`
    (as ale-py's env maps it), else its minimal set; refused where the emulator's set is not the
    one the contract names."""
    actions = ale.getLegalActionSet() if contract.full_action_space else ale.getMinimalActionSet()
    if tuple(a.name for a in actions) != contract.action_names:
        raise ValueError(f"ALE's action set for {contract.game} is {[a.name for a in actions]}, but the contract "
                         f"names {list(contract.action_names)}")
    return list(actions)


class AleGame:
    """One game: an emulator (made by the driver, which sets its sticky actions) plus the
    contract's preprocessing, writing into `obs`.

    `obs` (frame_stack, H, W) may be a row of a caller's batch array: the game writes its
    observation there in place, so a batch of games needs no copying to act on.
    """

    def __init__(self, contract: Contract, ale: ALEInterface, obs: np.ndarray | None = None):
        self.contract = contract
        self.ale = ale
        self.action_set = contract_action_set(contract, ale)
        height, width = self.ale.getScreenDims()
        self.raw = np.zeros((2, height, width), dtype=np.uint8)  # the skip's last two frames
        shape = (contract.frame_stack, contract.screen_size, contract.screen_size)
        self.obs = np.zeros(shape, dtype=np.uint8) if obs is None else obs
        if self.obs.shape != shape or self.obs.dtype != np.uint8:
            raise ValueError(f"obs must be uint8 {shape}, got {self.obs.dtype} {self.obs.shape}")
        self.elapsed_frames = 0  # since the reset, the FIRE press excluded (the time limit counts these)
        self.lives = 0

    def reset(self, start: EpisodeStart | None = None) -> None:
        """A new game: from a seed's `start` when given, else ALE's reset where the emulator is."""
        if start is None:
            self.ale.reset_game()
        else:
            start.restore(self.ale)
        if self.contract.fire_on_reset:
            self.ale.act(self.action_set[FIRE])
        self.obs[:] = 0
        if start is None or start.screen is None:
            self.ale.getScreenGrayscale(self.raw[0])
        else:
            self.raw[0] = start.screen
        self.raw[1] = 0
        self._push_frame()
        self.elapsed_frames = 0
        self.lives = self.ale.lives()

    def step(self, action: int) -> tuple[float, bool, bool]:
        """One agent step: (raw reward, game over, time limit reached)."""
        ale, skip, limit = self.ale, self.contract.frame_skip, self.contract.max_episode_frames
        chosen = self.action_set[action]
        reward = 0.0
        over = False
        for left in range(skip, 0, -1):
            reward += ale.act(chosen)
            over = ale.game_over()
            self.elapsed_frames += 1
            if over or self.elapsed_frames >= limit:
                break
            if left <= 2:
                ale.getScreenGrayscale(self.raw[left - 1])
        self._push_frame()
        self.lives = ale.lives()
        return reward, over, (self.elapsed_frames >= limit and not over)

    def episode_frames(self) -> int:
        return int(self.ale.getEpisodeFrameNumber())

    def rgb(self) -> np.ndarray:
        """The screen as a person sees it: (210, 160, 3) uint8."""
        return self.ale.getScreenRGB()

    def _push_frame(self) -> None:
        if self.contract.max_pool:
            np.maximum(self.raw[0], self.raw[1], out=self.raw[0])  # in place, as the vector env does
        self.obs[:-1] = self.obs[1:]
        size = self.contract.screen_size
        cv2.resize(self.raw[0], (size, size), dst=self.obs[-1], interpolation=cv2.INTER_AREA)
