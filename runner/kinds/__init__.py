"""Registry of measurement kinds: one module each, one line here."""

from __future__ import annotations

from runner.kinds import (closed_loop, episodes, evaluate, export, latency, parity, throughput, train,
                          training_history)
from runner.kinds.base import Kind

KINDS: dict[str, Kind] = {kind.name: kind for kind in (evaluate.KIND, train.KIND, throughput.KIND, export.KIND,
                                                       parity.KIND, latency.KIND, closed_loop.KIND, episodes.KIND,
                                                       training_history.KIND)}
