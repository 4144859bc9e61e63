"""Keep freed memory in the process for reuse: glibc malloc's thresholds, set for a training.

A gradient step allocates and frees tensors of 0.1-7 MB (batches, activations, gradients).
Under glibc's default, blocks that size are often handed back to the kernel when freed and
faulted in again, zeroed page by page, at the next step: about 1,500 page faults per step
here, and a fault costs microseconds in a virtual machine. Raising the mmap threshold
(blocks up to it come from the heap) and the trim threshold (free heap up to it is kept)
makes every later step reuse the first step's memory. Nothing computed changes.

glibc has no call that restores its default, which moves the mmap threshold as blocks are
freed: once set, the setting stays for the life of the process.
"""

from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's own ceiling for its moving threshold: larger blocks are still mapped
TRIM_THRESHOLD = 128 << 20

_kept = False


def keeping_freed_memory() -> bool:
    """Whether this process has set the thresholds (`keep_freed_memory`)."""
    return _kept


def keep_freed_memory() -> None:
    """Set the thresholds for this process, where its C library is glibc (elsewhere nothing
    changes, and `keeping_freed_memory` stays false)."""
    global _kept
    if _kept or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # the trim threshold alone would pin glibc's mmap threshold at its 128 KiB start: far more faults
    _kept = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
