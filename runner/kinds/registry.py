"""The one registry of measurement kinds: a line per kind. Everything else the runner knows of a
kind (the spec model, the schema, the compare rows, the fields that are not settings) is read
from its `Kind` here.

`registered(kind)` adds a kind for a while (a kind defined outside runner/kinds/, as a test
does); `version` changes with every change of the registry, so that models built from it
(the spec's union of measurement models) know to rebuild.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from runner.kinds import (
    closed_loop,
    episodes,
    evaluate,
    export,
    latency,
    localisation,
    parity,
    repair,
    throughput,
    training_history,
)
from runner.kinds.kind import Kind
from runner.kinds.train.kind import KIND as TRAIN

KINDS: dict[str, Kind] = {kind.name: kind for kind in (
    evaluate.KIND,
    TRAIN,
    throughput.KIND,
    export.KIND,
    parity.KIND,
    latency.KIND,
    closed_loop.KIND,
    episodes.KIND,
    training_history.KIND,
    localisation.KIND,
    repair.KIND,
)}
version = 0


@contextlib.contextmanager
def registered(kind: Kind) -> Iterator[Kind]:
    """`kind` in the registry, and its tables in the schema, for the length of the block."""
    global version
    from runner.store import schema

    if kind.name in KINDS:
        raise ValueError(f"a kind named {kind.name!r} is registered already")
    KINDS[kind.name] = kind
    version += 1
    try:
        yield kind
    finally:
        del KINDS[kind.name]
        schema.forget(f"kind {kind.name}")
        version += 1
