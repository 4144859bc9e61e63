"""Keep freed memory in the process for reuse: glibc malloc's thresholds, set for a training.

A gradient step allocates and frees tensors of 0.1-7 MB (batches, activations, gradients).
Under glibc's default, blocks that size are often handed back to the kernel when freed and
faulted in again, zeroed page by page, at the next step: hundreds to a few thousand page
faults per step (docs/learner_speed.md), and a fault costs microseconds in a virtual machine.
Raising the mmap threshold (blocks up to it come from the heap) and the trim threshold (free
heap up to it is kept) makes every later step reuse the first step's memory. Nothing computed
changes.

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


def apply(keep: bool) -> None:
    """Set the thresholds for this process when `keep` (where its C library is glibc; elsewhere
    nothing changes). Raise ValueError for `keep` false in a process where they were set: glibc
    cannot undo them, so that training would not run under the defaults it asks for."""
    global _kept
    if not keep:
        if _kept:
            raise ValueError("keep_freed_memory is false, but an earlier training in this process set it, and glibc "
                             "cannot undo it: train with it false in a process of its own")
        return
    if _kept or platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    mallopt = ctypes.CDLL(None).mallopt  # the process's own C library
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # the trim threshold alone would pin glibc's mmap threshold at its 128 KiB start: far more faults
    _kept = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
