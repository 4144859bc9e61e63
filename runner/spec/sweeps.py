"""Expanding a sweep into trials, and checking what it lists: pure functions.

A sweep's size is judged before anything is expanded: the number of trials is the product
of its value counts, and a value is a plain value or a short list of them, so that a small
file cannot ask for millions of trials or for values that are large only once expanded."""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass
from typing import Any

from breakout_core.common.messages import some_of
from runner.spec.yaml_source import PlacedError


@dataclass(frozen=True)
class Trial:
    name: str  # safe as a folder name: "learning_rate=0.0002,seed=42" or "base"
    overrides: dict[str, Any]


def _text(value: Any) -> str:
    return format(value, "g") if isinstance(value, float) else str(value)


DEFAULT_MAX_TRIALS = 1_000
MAX_TRIALS_LIMIT = 10_000  # the most a spec's `max_trials` may allow
MAX_LISTED_VALUE_ITEMS = 64  # a swept value that is a list (checkpoint_at) holds at most this many
_PLAIN = (str, int, float, bool, type(None))


def value_counts(sweep: dict[str, Any]) -> list[int]:
    """How many values each key of `sweep` that lists values lists: their product is its trials."""
    return [len(values) for values in sweep.values() if isinstance(values, list) and values]


def sweep_size_problem(sweep: Any, max_trials: int) -> PlacedError | None:
    """Why `sweep` (as the file gives it, before validation) is too large to expand: more
    trials than `max_trials`, or a value that is neither a plain value nor a list of at most
    MAX_LISTED_VALUE_ITEMS plain values. None where it is not, or is no mapping of lists."""
    if not isinstance(sweep, dict):
        return None
    for key, values in sweep.items():
        for i, value in enumerate(values if isinstance(values, list) else ()):
            if isinstance(value, _PLAIN):
                continue
            if not isinstance(value, list):
                return PlacedError(f"sweep {key!r}: a swept value is a plain value or a list of them, "
                                   f"not a {type(value).__name__}", ("sweep", key, i))
            if len(value) > MAX_LISTED_VALUE_ITEMS or not all(isinstance(item, _PLAIN) for item in value):
                return PlacedError(f"sweep {key!r}: a swept list holds at most {MAX_LISTED_VALUE_ITEMS} plain "
                                   f"values", ("sweep", key, i))
    counts = value_counts(sweep)
    if math.prod(counts) > max_trials:
        return PlacedError(f"the sweep makes {math.prod(counts):,} trials ({' x '.join(map(str, counts))} values), "
                           f"more than max_trials {max_trials:,} (which may be set up to {MAX_TRIALS_LIMIT:,})",
                           ("sweep",))
    return None


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
                    else f"sweep {key!r} values {some_of(shown, ' and ')} share one trial name, {key}={name} "
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
