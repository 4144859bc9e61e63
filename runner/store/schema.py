"""The results database's schema, declared in parts by the modules that own the tables.

Each owner declares its tables (ordered, named migrations that never change once shipped)
and its views once, with `declare`: the store its own tables, each measurement kind through
its `Kind`, `runner.kinds.shared.runtime_status` and `runner.kinds.shared.episode_scores` the tables several kinds
share, the play page its games. The store asks `migrations()` and `views()` and knows no
owner; a migration's name is global and sorts it among every other owner's.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Iterable

# The modules whose import declares every part of the schema (runner.kinds imports each kind).
OWNER_MODULES = ("runner.store.tables", "runner.kinds.shared.runtime_status", "runner.kinds.shared.episode_scores",
                 "runner.kinds.registry", "runner.play.server", "runner.run.check_attempts")


@dataclass(frozen=True)
class SchemaPart:
    owner: str
    migrations: tuple[tuple[str, str], ...]  # (name, SQL), applied in name order across all parts
    views: tuple[str, ...]  # CREATE OR REPLACE VIEW statements, rerun whenever a writer opens the file


_PARTS: dict[str, SchemaPart] = {}


def declare(owner: str, migrations: Iterable[tuple[str, str]] = (), views: Iterable[str] = ()) -> SchemaPart:
    """Register `owner`'s tables and views; a migration name another owner uses is refused."""
    part = SchemaPart(owner, tuple(migrations), tuple(views))
    if _PARTS.get(owner, part) != part:
        raise ValueError(f"schema of {owner!r} declared twice, differently")
    taken = {name: other.owner for other in _PARTS.values() if other.owner != owner for name, _ in other.migrations}
    clashes = sorted(name for name, _ in part.migrations if name in taken)
    if clashes:
        raise ValueError(f"{owner!r} declares migration(s) {clashes}, already declared by {taken[clashes[0]]!r}")
    _PARTS[owner] = part
    return part


def forget(owner: str) -> None:
    """Drop `owner`'s part (a kind registered for a while, runner.kinds.registry.registered)."""
    _PARTS.pop(owner, None)


def parts() -> list[SchemaPart]:
    """Every declared part, once the owner modules are imported."""
    for module in OWNER_MODULES:
        importlib.import_module(module)
    return list(_PARTS.values())


def migrations() -> list[tuple[str, str]]:
    """(name, SQL) of every owner, in the order they are applied."""
    return sorted((m for part in parts() for m in part.migrations), key=lambda m: m[0])


def views() -> list[str]:
    """Every owner's views, after its tables exist (views may read other owners' tables)."""
    return [view for part in parts() for view in part.views]
