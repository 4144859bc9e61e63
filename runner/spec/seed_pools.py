"""The reserved episode seeds: the range a candidate's games are drawn from, and the
confirmation range that only `--confirm` plays.

A spec that writes `seeds: {drawn: N}` plays N seeds drawn from the check range, keyed by
the sha256 of the candidate files (runner.kinds.shared.drawn_seeds says which files each kind
counts): the same files draw the same seeds on any machine, and a re-exported file draws new
ones, so a model exported and checked until it passes is not fitted to one set of games.
`runner run --confirm` (and `runner check --confirm`) draws from the confirmation range
instead, which no spec may name: seeds a file was never tuned against, for a last look
before it ships.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

CHECK_RANGE = range(1_000_000_000, 1_500_000_000)
CONFIRMATION_RANGE = range(1_500_000_000, 2_000_000_000)
POOLS = {"check": CHECK_RANGE, "confirmation": CONFIRMATION_RANGE}
DRAWABLE = range(CHECK_RANGE.start, CONFIRMATION_RANGE.stop)  # every seed a draw may give


def shown(seeds: range) -> str:
    return f"{seeds.start}-{seeds.stop - 1}"


def draw_key(sha256s: Iterable[str]) -> str:
    """The key of a draw: the sha256 of the candidate files' sha256s, sorted (names and order do not count)."""
    return hashlib.sha256("\n".join(sorted(sha256s)).encode()).hexdigest()


def draw_seeds(key: str, count: int, pool: str) -> list[int]:
    """`count` distinct seeds of the named pool, a function of `key` alone: the i-th candidate
    seed is the pool's start plus sha256(key:pool:i) modulo the pool's size, repeats skipped."""
    seeds_range = POOLS[pool]
    if not 0 < count <= len(seeds_range) // 2:
        raise ValueError(f"draw 1 to {len(seeds_range) // 2} seeds, not {count}")
    seeds: list[int] = []
    seen: set[int] = set()
    i = 0
    while len(seeds) < count:
        digest = hashlib.sha256(f"{key}:{pool}:{i}".encode()).digest()
        seed = seeds_range.start + int.from_bytes(digest[:8], "big") % len(seeds_range)
        i += 1
        if seed not in seen:
            seen.add(seed)
            seeds.append(seed)
    return seeds


def confirmation_overlap(seeds: Iterable[int] | range) -> str | None:
    """Why seeds a spec names may not be played: some lie in the confirmation range."""
    if isinstance(seeds, range):
        inside = range(max(seeds.start, CONFIRMATION_RANGE.start), min(seeds.stop, CONFIRMATION_RANGE.stop))
        first = inside.start if len(inside) else None
    else:
        first = next((s for s in seeds if s in CONFIRMATION_RANGE), None)
    if first is None:
        return None
    return (f"seed {first} is in the confirmation range {shown(CONFIRMATION_RANGE)}, which only `--confirm` plays "
            "(a spec may name no seed there)")
