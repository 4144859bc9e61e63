"""What one replay entry holds, and the memory a replay takes: torch-free, so that a spec's
replay size is checked when it loads without importing torch."""

from __future__ import annotations

import numpy as np

# the per-entry fields beside the frame, with their numpy types
ENTRY_FIELDS = {"actions": np.int64, "rewards": np.float32, "terminal": bool, "has_next": bool, "starts": bool}


def replay_bytes(capacity: int, frame_shape: tuple[int, int] = (84, 84)) -> int:
    """Memory a replay of `capacity` entries takes: one uint8 frame and the entry fields each.
    numpy commits it page by page as the replay fills, so a replay too large for the machine
    fails, or swaps, only well into a training."""
    return capacity * (int(np.prod(frame_shape)) + sum(np.dtype(t).itemsize for t in ENTRY_FIELDS.values()))
