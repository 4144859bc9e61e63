"""Breakout on the real ALE emulator (ale-py's bundled ROM).

`AleGame` is one game on its own ALEInterface, preprocessed as the contract says, so that
its emulator state can be saved and restored: the episode driver (`breakout_core.driver`)
starts every seeded episode by restoring the state that a seeded ROM load leaves, which
ale-py's native vector env cannot do (it has no clone/restore). Its preprocessing is the
native vector env's, step for step (tests compare the two frame by frame): the action is
repeated `frame_skip` emulator frames, sticky actions applied by the emulator inside each
frame; the last two frames are max-pooled, turned to grayscale with the emulator's own
palette and resized with OpenCV's INTER_AREA; the newest frame goes last in the stack.
"""

from __future__ import annotations

from collections import OrderedDict

import cv2
import numpy as np
from ale_py import ALEInterface, LoggerMode, roms

from breakout_core.contract import FIRE, Contract

ACTION_NAMES = ("NOOP", "FIRE", "RIGHT", "LEFT")
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


_SEED_STATES: OrderedDict[tuple[str, int | None], object] = OrderedDict()
_SEED_STATES_MAX = 4_096  # ~14 KB each


def seed_state(contract: Contract, seed: int):
    """The emulator state a ROM load seeded with `seed` leaves, made once per process.

    Keyed by the emulator settings that the state depends on (sticky-action probability,
    game) and the seed; without sticky actions no seed reaches the emulator.
    """
    key = (f"{contract.game}/{contract.repeat_action_probability!r}",
           int(seed) if contract.repeat_action_probability > 0 else None)
    state = _SEED_STATES.get(key)
    if state is None:
        state = new_emulator(contract, key[1] or 0).cloneState(include_rng=True)
        _SEED_STATES[key] = state
        if len(_SEED_STATES) > _SEED_STATES_MAX:
            _SEED_STATES.popitem(last=False)
    else:
        _SEED_STATES.move_to_end(key)
    return state


class AleGame:
    """One game: an emulator (made by the driver, which sets its sticky actions) plus the
    contract's preprocessing, writing into `obs`.

    `obs` (frame_stack, H, W) may be a row of a caller's batch array: the game writes its
    observation there in place, so a batch of games needs no copying to act on.
    """

    def __init__(self, contract: Contract, ale: ALEInterface, obs: np.ndarray | None = None):
        self.contract = contract
        self.ale = ale
        self.action_set = self.ale.getMinimalActionSet()
        height, width = self.ale.getScreenDims()
        self.raw = np.zeros((2, height, width), dtype=np.uint8)  # the skip's last two frames
        shape = (contract.frame_stack, contract.screen_size, contract.screen_size)
        self.obs = np.zeros(shape, dtype=np.uint8) if obs is None else obs
        if self.obs.shape != shape or self.obs.dtype != np.uint8:
            raise ValueError(f"obs must be uint8 {shape}, got {self.obs.dtype} {self.obs.shape}")
        self.elapsed_frames = 0  # since the reset, the FIRE press excluded (the time limit counts these)
        self.lives = 0

    def reset(self, state=None) -> None:
        """A new game: from `state` (an emulator snapshot) when given, else where the emulator is."""
        if state is not None:
            self.ale.restoreState(state)
        self.ale.reset_game()
        if self.contract.fire_on_reset:
            self.ale.act(self.action_set[FIRE])
        self.obs[:] = 0
        self.ale.getScreenGrayscale(self.raw[0])
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
