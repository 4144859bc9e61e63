"""Expanding a sweep into trials, and checking what it lists: pure functions."""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

from runner.spec.yaml_source import PlacedError


@dataclass(frozen=True)
class Trial:
    name: str  # safe as a folder name: "learning_rate=0.0002,seed=42" or "base"
    overrides: dict[str, Any]


def _text(value: Any) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


def sweep_problems(sweep: dict[str, list[Any]], fields: list[str] | tuple[str, ...]) -> list[PlacedError]:
    """Every key of `sweep` that is not one of `fields` or lists no values, and every value listed
    twice (as trial names spell them: two values of one name would be one trial twice)."""
    problems = []
    for key, values in sweep.items():
        if key not in fields:
            problems.append(PlacedError(f"sweep key {key!r} is not a training field; fields: {', '.join(fields)}",
                                        ("sweep", key)))
            continue
        if not values:
            problems.append(PlacedError(f"sweep {key!r} lists no values", ("sweep", key)))
        named: dict[str, list[tuple[int, Any]]] = {}
        for i, value in enumerate(values):
            named.setdefault(_text(value), []).append((i, value))
        for name, written in named.items():
            if len(written) > 1:
                shown = [json.dumps(v) for _, v in written]
                at = ("sweep", key, written[1][0])
                problems.append(PlacedError(
                    f"sweep {key!r} lists {shown[0]} more than once: each value is one trial" if len(set(shown)) == 1
                    else f"sweep {key!r} values {' and '.join(shown)} share one trial name, {key}={name} "
                         "(a float is named to 6 significant digits): each value is one trial", at))
    return problems


def expand_sweep(sweep: dict[str, list[Any]]) -> list[Trial]:
    """Every combination of the listed values, in the order the keys and values are given."""
    if not sweep:
        return [Trial("base", {})]
    keys = list(sweep)
    trials = []
    for values in itertools.product(*(sweep[k] for k in keys)):
        overrides = dict(zip(keys, values))
        trials.append(Trial(",".join(f"{k}={_text(v)}" for k, v in overrides.items()), overrides))
    return trials
