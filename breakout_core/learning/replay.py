"""Experience replay that stores single uint8 frames and rebuilds 4-frame stacks on sampling.

One stream per environment, each a ring of frames in arrival order, so stacks never mix
environments. Every entry is one frame: the newest frame of an observation, with the
action taken from it, the reward, whether the target must not bootstrap, whether the next
entry is its next frame (false for an episode's final frame), and whether it starts an
episode. Frames before an episode's start are zeros in a stack, as the env's own stack
is at reset, so episode boundaries never leak into a stack.

Frames live in numpy (`device="numpy"`) or in a torch tensor on any torch device
(`"cpu"`, `"cuda"`); the small per-entry fields stay in numpy either way.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from breakout_core.learning.replay_layout import ENTRY_FIELDS


@dataclass
class ReplayBatch:
    obs: torch.Tensor  # uint8 (B, 4, 84, 84)
    actions: torch.Tensor  # int64 (B,)
    rewards: torch.Tensor  # float32 (B,), as learned from (clipped if the contract says so)
    terminal: torch.Tensor  # float32 (B,), 1 where the target must not bootstrap
    next_obs: torch.Tensor  # uint8 (B, 4, 84, 84)


class FrameReplay:
    def __init__(self, capacity: int, num_streams: int, *, frame_shape=(84, 84), stack: int = 4,
                 device: str = "numpy", seed: int = 0):
        if capacity < num_streams * (stack + 2):
            raise ValueError(f"replay capacity {capacity} is too small for {num_streams} streams")
        self.stream_capacity = capacity // num_streams
        self.num_streams = num_streams
        self.stack = stack
        self.device = device
        shape = (num_streams, self.stream_capacity, *frame_shape)
        if device == "numpy":
            self.frames = np.zeros(shape, dtype=np.uint8)
        else:
            self.frames = torch.zeros(shape, dtype=torch.uint8, device=device)
        cap = (num_streams, self.stream_capacity)
        self.actions = np.zeros(cap, dtype=ENTRY_FIELDS["actions"])
        self.rewards = np.zeros(cap, dtype=ENTRY_FIELDS["rewards"])
        self.terminal = np.zeros(cap, dtype=ENTRY_FIELDS["terminal"])
        self.has_next = np.zeros(cap, dtype=ENTRY_FIELDS["has_next"])
        self.starts = np.zeros(cap, dtype=ENTRY_FIELDS["starts"])
        self.written = np.zeros(num_streams, dtype=np.int64)  # entries ever written per stream
        self.rng = np.random.default_rng(seed)

    @property
    def transitions(self) -> int:
        """Sampleable transitions held now (entries with a stored next frame)."""
        return int(sum(self.has_next[s, : min(self.written[s], self.stream_capacity)].sum()
                       for s in range(self.num_streams)))

    def _write(self, streams: np.ndarray, frames: np.ndarray, actions, rewards, terminal, has_next, starts) -> None:
        slots = self.written[streams] % self.stream_capacity
        if self.device == "numpy":
            self.frames[streams, slots] = frames
        else:
            self.frames[torch.as_tensor(streams, device=self.device), torch.as_tensor(slots, device=self.device)] = (
                torch.as_tensor(frames).to(self.device, non_blocking=True))
        self.actions[streams, slots] = actions
        self.rewards[streams, slots] = rewards
        self.terminal[streams, slots] = terminal
        self.has_next[streams, slots] = has_next
        self.starts[streams, slots] = starts
        self.written[streams] += 1

    def add(self, streams: np.ndarray, frames: np.ndarray, actions: np.ndarray, rewards: np.ndarray,
            terminal: np.ndarray, starts: np.ndarray) -> None:
        """Insert one transition per listed stream in one batched write: the newest frame of
        each observation, the action taken, reward and terminal flag. Its next frame is the
        next entry of the same stream (a following add, or add_final_frames)."""
        n = len(streams)
        self._write(streams, frames, actions, rewards, terminal, np.ones(n, dtype=bool), starts)

    def add_final_frames(self, streams: np.ndarray, frames: np.ndarray) -> None:
        """Store the final observation's frame of episodes that just ended (no transition starts there)."""
        n = len(streams)
        zeros = np.zeros(n, dtype=bool)
        self._write(streams, frames, np.zeros(n, dtype=np.int64), np.zeros(n, dtype=np.float32), zeros, zeros, zeros)

    def _valid(self, streams: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Entry `counts` of `streams` starts a transition whose frames are all still held."""
        written = self.written[streams]
        oldest = np.maximum(written - self.stream_capacity, 0)
        history_held = (counts - (self.stack - 1) >= oldest) | (oldest == 0)  # before position 0: zeros
        return (counts + 1 < written) & history_held & self.has_next[streams, counts % self.stream_capacity]

    def sample(self, batch_size: int, to_device: str | torch.device = "cpu") -> ReplayBatch:
        held = np.minimum(self.written, self.stream_capacity)
        if held.sum() < self.stack + 2:
            raise ValueError(f"replay holds {held.sum()} frames, too few to sample a transition")
        streams = np.empty(batch_size, dtype=np.int64)
        counts = np.empty(batch_size, dtype=np.int64)
        todo = np.arange(batch_size)
        for _ in range(1000):  # rejection rounds; nearly every candidate is valid
            if not len(todo):
                break
            s = self.rng.choice(self.num_streams, size=len(todo), p=held / held.sum())
            c = self.written[s] - held[s] + (self.rng.random(len(todo)) * held[s]).astype(np.int64)
            ok = self._valid(s, c)
            streams[todo[ok]], counts[todo[ok]] = s[ok], c[ok]
            todo = todo[~ok]
        if len(todo):
            raise ValueError("replay holds too few complete transitions to sample from")
        # positions c-3 .. c+1; a frame is kept unless an episode starts after it (up to c)
        offsets = np.arange(-(self.stack - 1), 2)
        positions = counts[:, None] + offsets[None, :]
        slots = positions % self.stream_capacity
        starts = self.starts[streams[:, None], slots]
        starts_upto_c = starts[:, : self.stack].copy()  # positions c-3 .. c
        # keep[p] for p <= c: no start at any position in (p, c]
        later_start = np.flip(np.cumsum(np.flip(starts_upto_c[:, 1:], axis=1), axis=1), axis=1) > 0
        keep = np.ones_like(starts, dtype=bool)
        keep[:, : self.stack - 1] = ~later_start
        keep &= positions >= 0
        if self.device == "numpy":
            frames = torch.from_numpy(self.frames[streams[:, None], slots] * keep[:, :, None, None].astype(np.uint8))
        else:
            dev = self.frames.device
            frames = self.frames[torch.as_tensor(streams[:, None], device=dev), torch.as_tensor(slots, device=dev)]
            frames = frames * torch.as_tensor(keep, device=dev)[:, :, None, None].to(torch.uint8)
        frames = frames.to(to_device, non_blocking=True)
        entry = (streams, counts % self.stream_capacity)
        return ReplayBatch(
            obs=frames[:, : self.stack],
            actions=torch.as_tensor(self.actions[entry], device=to_device),
            rewards=torch.as_tensor(self.rewards[entry], device=to_device),
            terminal=torch.as_tensor(self.terminal[entry].astype(np.float32), device=to_device),
            next_obs=frames[:, 1:],
        )
