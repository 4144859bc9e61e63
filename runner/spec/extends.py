"""Specs that extend specs: `extends: base.yaml` layers one spec file over another.

The base is read first (its own `extends` too, up to MAX_EXTENDS_DEPTH files), then the
extending file over it: mappings merge key by key, and a key written `~name:` removes the
base's `name`. A list of named mappings (measurements, verdicts) merges item by item by
`name`: an item of a name the base has merges into it, an item with `renames: OLD` merges
into the base's item OLD and gives it its own name (in OLD's place), a new name is added at
the end, and an item written `- ~name:` removes the base's item of that name. Any other list, and a plain
value, replaces the base's. The result is one document
with no `extends` left in it, which is what is validated, hashed, stored as a run's spec
text and matched by `--resume`: a stored run never depends on a file beside it. Each value
remembers the file and line it was written at, so an error names the file that holds it.
Paths inside a spec (artifacts, checkpoints) are read against the folder of the spec that
is run, so a base and the specs that extend it live in one folder.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from runner.spec.yaml_source import SpecSourceError, YamlSource, load_yaml

BASE_ONLY_PREFIX = "_"  # a spec file named _x.yaml is a base that specs extend, never run itself
EXTENDS_KEY = "extends"
RENAMES_KEY = "renames"
REMOVE_PREFIX = "~"
MAX_EXTENDS_DEPTH = 4  # files in one chain of extends, the spec that is run included


def resolve_extends(source: YamlSource, chain: tuple[Path, ...] = ()) -> YamlSource:
    """`source` with its chain of bases merged under it; a source without `extends` is returned
    as it is (its text, comments and all, is then the spec's text)."""
    data = source.data
    if not isinstance(data, dict) or EXTENDS_KEY not in data:
        if removals := _removals(data):
            raise SpecSourceError(f"{source.where(removals[0])}: {REMOVE_PREFIX}name removes what a base declares: "
                                  f"it needs `{EXTENDS_KEY}:`")
        return source
    chain = (*chain, source.path.resolve())
    base = _read_base(source, chain)
    if not isinstance(base.data, dict):
        raise SpecSourceError(f"{source.where((EXTENDS_KEY,))}: {EXTENDS_KEY}: {base.path} is not a mapping of keys")
    own = {k: v for k, v in data.items() if k != EXTENDS_KEY}
    if "name" in base.data and "name" not in own:
        raise SpecSourceError(f"{source.where((EXTENDS_KEY,))}: name: a spec that extends another names itself "
                              f"(with {base.path}'s name, their runs and verdicts would be one spec's)")
    own_at = {path: at for path, at in source.origins.items() if path[:1] != (EXTENDS_KEY,)}
    merged, at = _merge(base.data, base.origins, own, own_at)
    layers = (source.path, *(base.layers or (base.path,)))
    return YamlSource(path=source.path, text=_resolved_text(merged, layers), data=merged,
                      lines={path: line for path, (_, line) in at.items()},
                      files={path: file for path, (file, _) in at.items() if file != source.path}, layers=layers)


def is_base_only(path: str | Path) -> bool:
    return Path(path).name.startswith(BASE_ONLY_PREFIX)


def _read_base(source: YamlSource, chain: tuple[Path, ...]) -> YamlSource:
    at = source.where((EXTENDS_KEY,))
    name = source.data[EXTENDS_KEY]
    if not isinstance(name, str) or not name.strip():
        raise SpecSourceError(f"{at}: {EXTENDS_KEY}: the base spec's path, relative to this file (e.g. base.yaml)")
    path = source.path.parent / name
    if path.resolve() in chain:
        cycle = " -> ".join(str(p.name) for p in (*chain, path.resolve()))
        raise SpecSourceError(f"{at}: {EXTENDS_KEY}: {name} makes a cycle ({cycle})")
    if len(chain) >= MAX_EXTENDS_DEPTH:
        raise SpecSourceError(f"{at}: {EXTENDS_KEY}: {name} would make a chain of more than {MAX_EXTENDS_DEPTH} "
                              "specs; extend a spec that extends nothing deeper")
    if path.resolve().parent != source.path.resolve().parent:
        raise SpecSourceError(f"{at}: {EXTENDS_KEY}: {name} is in another folder; a base lies beside the specs that "
                              "extend it (their paths are read from that folder)")
    if not path.is_file():
        raise SpecSourceError(f"{at}: {EXTENDS_KEY}: {path}: no such spec file")
    return resolve_extends(load_yaml(path), chain)


Origins = dict[tuple, tuple[Path, int]]  # a value's path below some node -> (file, line) where it is written


def _below(at: Origins, key: object) -> Origins:
    return {path[1:]: origin for path, origin in at.items() if path[:1] == (key,)}


def _under(key: object, at: Origins) -> Origins:
    return {(key, *path): origin for path, origin in at.items()}


def _place(at: Origins, path: tuple) -> str:
    file, line = at.get(path) or at.get(()) or (Path("?"), 0)
    return f"{file}:{line}"


def _removed(key: object) -> str | None:
    return key[len(REMOVE_PREFIX):] if isinstance(key, str) and key.startswith(REMOVE_PREFIX) else None


def _merge(base: object, base_at: Origins, over: object, over_at: Origins) -> tuple[object, Origins]:
    """`over` laid on `base`, with where each resulting value is written."""
    if isinstance(base, dict) and isinstance(over, dict):
        return _merge_mappings(base, base_at, over, over_at)
    if _named_items(base) and isinstance(over, list) and all(isinstance(item, dict) for item in over):
        return _merge_named(base, base_at, over, over_at)
    return over, over_at


def _merge_mappings(base: dict, base_at: Origins, over: dict, over_at: Origins) -> tuple[dict, Origins]:
    merged = dict(base)
    at: Origins = {(): over_at.get((), base_at.get(()))}
    parts = {key: _below(base_at, key) for key in base}
    for key, value in over.items():
        if (name := _removed(key)) is not None:
            if value is not None:
                raise SpecSourceError(f"{_place(over_at, (key,))}: {key}: removes {name!r}; write `{key}:` alone")
            if name not in merged:
                raise SpecSourceError(f"{_place(over_at, (key,))}: {key}: the base has no {name!r} here")
            del merged[name], parts[name]
        elif key in merged:
            merged[key], parts[key] = _merge(merged[key], parts[key], value, _below(over_at, key))
        else:
            merged[key], parts[key] = value, _below(over_at, key)
    for key, part in parts.items():
        at.update(_under(key, part))
    return merged, at


def _named_items(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(
        isinstance(item, dict) and isinstance(item.get("name"), str) for item in value)


def _merge_named(base: list, base_at: Origins, over: list, over_at: Origins) -> tuple[list, Origins]:
    """Lists of named mappings, merged by name (see the module's docstring)."""
    items = {item["name"]: (item, _below(base_at, i)) for i, item in enumerate(base)}
    for i, item in enumerate(over):
        if len(item) == 1 and (removed := _removed(next(iter(item)))) is not None:
            if item[next(iter(item))] is not None:
                raise SpecSourceError(f"{_place(over_at, (i,))}: an item that removes one writes `- ~NAME:` alone")
            if removed not in items:
                raise SpecSourceError(f"{_place(over_at, (i,))}: ~{removed}: the base has no item of that name")
            del items[removed]
            continue
        name = item.get("name")
        if not isinstance(name, str):
            raise SpecSourceError(f"{_place(over_at, (i,))}: each item here names itself (name:), as the base's do, "
                                  "so that it merges with the base's item of that name")
        if RENAMES_KEY in item:
            old = item[RENAMES_KEY]
            if old not in items or name in items:
                why = f"the base has no item {old!r}" if old not in items else f"the base has an item {name!r} already"
                raise SpecSourceError(f"{_place(over_at, (i, RENAMES_KEY))}: {RENAMES_KEY}: {why}")
            own = {key: value for key, value in item.items() if key != RENAMES_KEY}
            own_at = {path: at for path, at in _below(over_at, i).items() if path[:1] != (RENAMES_KEY,)}
            items = {(name if key == old else key): (_merge(*value, own, own_at) if key == old else value)
                     for key, value in items.items()}
        elif name in items:
            items[name] = _merge(*items[name], item, _below(over_at, i))
        else:
            items[name] = (item, _below(over_at, i))
    merged, at = [], {(): over_at.get((), base_at.get(()))}
    for i, (item, item_at) in enumerate(items.values()):
        merged.append(item)
        at.update(_under(i, item_at))
    return merged, at


def _removals(data: object) -> list[tuple]:
    """Paths of `~name` removals anywhere in `data`."""
    found: list[tuple] = []
    seen: set[int] = set()

    def walk(node: object, path: tuple) -> None:
        if not isinstance(node, (dict, list)) or id(node) in seen:  # an alias met again: walked once
            return
        seen.add(id(node))
        if isinstance(node, dict):
            for key, value in node.items():
                if _removed(key) is not None:
                    found.append((*path, key))
                walk(value, (*path, key))
        elif isinstance(node, list):
            for i, item in enumerate(node):
                walk(item, (*path, i))

    walk(data, ())
    return found


def _resolved_text(data: dict, layers: tuple[Path, ...]) -> str:
    header = f"# {layers[0].name} resolved: it extends {' over '.join(f.name for f in layers[1:])}\n"
    return header + yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100, default_flow_style=None)
