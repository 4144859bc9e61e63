"""`--set path.to.field=value`: a spec's value changed from the command line.

An override is laid on the resolved document (its `extends` merged in) before it is
validated, so it is checked as a value written in the file is, and an error in it names the
`--set` argument instead of a file line. The path is the value's keys joined by dots:
mapping keys by name, list items by index (`verdicts.0.deployment_worthy_when`) or, in a
list of named items (measurements, verdicts), by name as `extends` merges them
(`measurements.games.seeds`). The last key of a mapping may be one the file leaves out (a
default); every other step must exist. The value is read as YAML (`3`, `1e-4`, `true`,
`[1, 8]`, `{start: 0, count: 3}`), so a text that reads otherwise is quoted (`'010'`).

The overridden document is what is validated, hashed, stored as the run's spec text and
matched by `--resume`; the run stores the overrides as given beside it.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from typing import Any

import yaml

from runner.spec.yaml_source import SpecSourceError, YamlSource, format_path, read_value

SEPARATOR = "="


@dataclass(frozen=True)
class Override:
    text: str  # the argument as given, `path=value`
    keys: tuple[str, ...]  # the path as written, split at its dots
    value: Any

    @property
    def where(self) -> str:
        return f"--set {self.text}"


def parse_override(text: str) -> Override:
    """`path.to.field=value` read; SpecSourceError naming the argument when it is not one."""
    path, separator, value = text.partition(SEPARATOR)
    keys = tuple(path.strip().split("."))
    if not separator or not all(keys):
        raise SpecSourceError(f"--set {text}: expected PATH=VALUE, the path's keys joined by dots "
                              "(e.g. measurements.0.iterations=2000)")
    return Override(text=text, keys=keys, value=read_value(value, f"--set {text}"))


def apply_overrides(source: YamlSource, texts: tuple[str, ...]) -> YamlSource:
    """`source` (a mapping) with each `path=value` text laid on it in order; the lines of
    replaced values are forgotten, so that an error below an override names the override.
    SpecSourceError, naming the spec and the argument, for a text that is no override or a
    path that is not in the document."""
    if not texts:
        return source
    data = copy.deepcopy(source.data)
    lines, files, given = dict(source.lines), dict(source.files), dict(source.given)
    overrides = []
    for text in texts:
        try:
            override = parse_override(text)
            path = _place(data, override)
        except SpecSourceError as exc:
            raise SpecSourceError(f"{source.path}: {exc}") from None
        overrides.append(override)
        parent = _at(data, path[:-1])
        parent[path[-1]] = copy.deepcopy(override.value)
        for table in (lines, files, given):
            for known in [known for known in table if known[:len(path)] == path]:
                del table[known]
        lines[path] = 0
        given[path] = override.where
    return replace(source, data=data, lines=lines, files=files, given=given,
                   text=_overridden_text(source, data, overrides))


def _place(data: dict, override: Override) -> tuple:
    """The path of keys and list indexes that `override` names in `data`."""
    path: tuple = ()
    node: Any = data
    for n, key in enumerate(override.keys):
        last = n == len(override.keys) - 1
        here = format_path(path)
        if isinstance(node, dict):
            if key not in node and not last:
                known = ", ".join(str(k) for k in node) or "nothing"
                raise SpecSourceError(f"{override.where}: {here} has no key {key!r} (it has: {known})")
            step: Any = key
        elif isinstance(node, list):
            step = _item(node, key, override, here)
        else:
            raise SpecSourceError(f"{override.where}: {here} is a value ({_shown(node)}), not a mapping or a list: "
                                  f"it has no {key!r}")
        path += (step,)
        node = node.get(step) if isinstance(node, dict) else node[step]
    return path


def _item(items: list, key: str, override: Override, here: str) -> int:
    """A list item's index, from an index or, in a list of named items, a name."""
    if key.isdigit():
        if int(key) < len(items):
            return int(key)
        raise SpecSourceError(f"{override.where}: {here} has {len(items)} item(s) (0 to {len(items) - 1}); "
                              f"no item {key}")
    names = [item.get("name") if isinstance(item, dict) else None for item in items]
    if key in names:
        return names.index(key)
    named = ", ".join(str(name) for name in names if name is not None)
    raise SpecSourceError(f"{override.where}: {here} has no item named {key!r}"
                          + (f" (named: {named}; or give an index)" if named else " (give an index)"))


def _at(data: Any, path: tuple) -> Any:
    for step in path:
        data = data[step]
    return data


def _shown(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _overridden_text(source: YamlSource, data: dict, overrides: list[Override]) -> str:
    """The document's text after the overrides: a comment naming them, then the YAML."""
    head = "".join(line + "\n" for line in source.text.splitlines()[:1] if line.startswith("# ") and source.layers)
    given = ", ".join(json.dumps(o.text, ensure_ascii=False) for o in overrides)
    return (f"{head}# {source.path.name} with --set {given}\n"
            + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100, default_flow_style=None))


GATE_NEUTRAL_KEYS = ("artifacts", "contract", "runtimes")  # what is checked, where and in which game


def gate_changes(texts: tuple[str, ...]) -> list[str]:
    """The `--set` texts that change a gate's rules or the evidence they are held to (its
    measurements' games, seeds, stages, rounds and margins, its verdicts): every override but
    those naming the files checked, the runtimes that load them and the game they play."""
    return [text for text in texts if parse_override(text).keys[0] not in GATE_NEUTRAL_KEYS]
