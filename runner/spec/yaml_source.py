"""Safe YAML loading that remembers where every value came from.

Only the plain YAML types are accepted: an explicit tag (``!!python/object``, ``!foo``)
is an error, and so is a document with more than MAX_ALIASES aliases or more than
MAX_EXPANDED_VALUES values once its aliases are expanded (a "billion laughs" file expands
exponentially through a few aliases), a key that is not a plain value, and
nesting deeper than the parser's recursion allows. So is a plain value that does not read as
it looks: a key such as `no:` (YAML 1.1's false), a date, or a number such as 010 that
YAML 1.1 reads as 8; each error says to quote it or write the number.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from breakout_core.common.messages import first_line, some_of

MAX_ALIASES = 50
MAX_EXPANDED_VALUES = 1_000_000  # values of a document, aliases expanded: room for the 100,000 seeds a list may hold
MAX_SPEC_BYTES = 256 * 1024  # a spec file or stored spec text; read no further (README: "Limits")
_CORE = "tag:yaml.org,2002:"
ALLOWED_TAGS = {_CORE + t for t in ("str", "int", "float", "bool", "null", "map", "seq", "merge")}
# YAML 1.2 floats such as 1e-4, which PyYAML's YAML 1.1 resolver would read as strings
_FLOAT_12 = re.compile(r"^[-+]?(?:\d+\.?\d*|\.\d+)[eE][-+]?\d+$")
# numbers YAML 1.1 reads otherwise than YAML 1.2: octal 010 (8), binary 0b11, 1_000, sexagesimal 1:30 (90)
_NUMBER_11 = re.compile(r"^[-+]?(?:0[0-7_]+|0b[01_]+|[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?|.*_.*)$")


class SpecSourceError(ValueError):
    """A YAML file that cannot be read as a spec; the message names file and line."""


@dataclass
class YamlSource:
    path: Path
    text: str
    data: Any
    lines: dict[tuple, int] = field(default_factory=dict)  # value path -> 1-based line
    files: dict[tuple, Path] = field(default_factory=dict)  # value path -> the file it is written in, if not `path`
    layers: tuple[Path, ...] = ()  # a spec that extends others: its file, then its bases'
    given: dict[tuple, str] = field(default_factory=dict)  # value path -> the --set argument that gave it

    def _known(self, loc: tuple) -> tuple | None:
        """The deepest prefix of `loc` (a pydantic error location) whose line is known."""
        return next((loc[:end] for end in range(len(loc), -1, -1) if loc[:end] in self.lines), None)

    def line_of(self, loc: tuple) -> int | None:
        known = self._known(loc)
        return None if known is None else self.lines[known]

    def where(self, loc: tuple) -> str:
        """'file:line' of the value at `loc`, in whichever file of an extends chain it is written."""
        known = self._known(loc)
        if known is None:
            return str(self.path)
        if known in self.given:
            return f"{self.path}: {self.given[known]}"
        within = "".join(f" (with {given})" for path, given in self.given.items() if path[:len(known)] == known)
        return f"{self.files.get(known, self.path)}:{self.lines[known]}{within}"

    @property
    def origins(self) -> dict[tuple, tuple[Path, int]]:
        """Every known value path -> (file, line)."""
        return {path: (self.files.get(path, self.path), line) for path, line in self.lines.items()}


class _BoundedSafeLoader(yaml.SafeLoader):
    def __init__(self, stream: str):
        super().__init__(stream)
        self.alias_count = 0

    def compose_node(self, parent, index):  # counts aliases as they are met
        if self.check_event(yaml.AliasEvent):
            self.alias_count += 1
            if self.alias_count > MAX_ALIASES:
                mark = self.peek_event().start_mark
                raise SpecSourceError(f"line {mark.line + 1}: more than {MAX_ALIASES} YAML aliases")
        return super().compose_node(parent, index)


_BoundedSafeLoader.add_implicit_resolver(_CORE + "float", _FLOAT_12, list("-+0123456789."))


def _expanded_sizes(root: yaml.Node) -> tuple[dict[int, int], dict[int, int]]:
    """Each node's size with its aliases expanded (itself and everything below it, every
    alias counted as the node it names), and how many times each node is referred to; each
    node is walked once, so a file of nested aliases costs no more than its own size."""
    sizes: dict[int, int] = {}
    refs: dict[int, int] = {}

    open_nodes: set[int] = set()  # a node that holds itself (`&x [*x]`) is counted once, as what refuses it

    def walk(node: yaml.Node) -> int:  # as deep as the composer went: nesting is bounded there
        refs[id(node)] = refs.get(id(node), 0) + 1
        if id(node) in open_nodes:
            return 1
        if id(node) not in sizes:
            open_nodes.add(id(node))
            sizes[id(node)] = 1 + sum(walk(child) for child in _children(node))
            open_nodes.discard(id(node))
        return sizes[id(node)]

    walk(root)
    return sizes, refs


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, yaml.SequenceNode) else []


def _check_expanded_size(root: yaml.Node) -> None:
    """Refuse a document larger than MAX_EXPANDED_VALUES once its aliases are expanded, at
    the line of the outermost value written once that alone is too large."""
    sizes, refs = _expanded_sizes(root)
    if sizes[id(root)] <= MAX_EXPANDED_VALUES:
        return
    node = root
    while True:
        larger = [child for child in _children(node)
                  if sizes[id(child)] > MAX_EXPANDED_VALUES and refs[id(child)] == 1]
        if not larger:
            break
        node = larger[0]
    raise SpecSourceError(f"line {node.start_mark.line + 1}: {sizes[id(node)]:,} values once its YAML aliases are "
                          f"expanded, more than the {MAX_EXPANDED_VALUES:,} a spec may hold")


def format_path(path: tuple) -> str:
    """A value's place in a spec as a user reads it: measurements[0].gif.seed."""
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"


# plain scalars that YAML reads as something other than text: as a key, `no:` is the boolean false
_NOT_TEXT = {_CORE + "bool": "a boolean", _CORE + "int": "a number", _CORE + "float": "a number",
             _CORE + "null": "null", _CORE + "timestamp": "a date"}


def _check_tags_and_map_lines(node: yaml.Node, path: tuple, lines: dict[tuple, int], where: str,
                              seen: set[int]) -> None:
    """Refuse non-core tags and duplicate keys; map each value path to its line.

    An aliased node is visited once (`seen`): walking it again at every alias would make
    a small file of nested aliases cost exponential time and memory."""
    line = node.start_mark.line + 1
    if node.tag == _CORE + "timestamp" and isinstance(node, yaml.ScalarNode) and node.style is None:
        raise SpecSourceError(f"{where}:{line}: {format_path(path)}: {node.value} reads as {_NOT_TEXT[node.tag]} "
                              f"in YAML: quote it ('{node.value}') if it is text")
    if node.tag in (_CORE + "int", _CORE + "float") and node.style is None and _NUMBER_11.match(node.value):
        meant = yaml.safe_load(node.value)
        raise SpecSourceError(f"{where}:{line}: {format_path(path)}: {node.value} is read as {meant!r} by YAML 1.1's "
                              f"rules alone: write {meant!r}, or quote it if it is text")
    if node.tag not in ALLOWED_TAGS:
        raise SpecSourceError(f"{where}:{line}: {format_path(path)}: YAML tag {node.tag!r} is not allowed in a spec "
                              "(plain values only)")
    lines.setdefault(path, line)
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        keys: set = set()
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag in _NOT_TEXT and key_node.style is None:
                key = key_node.value
                raise SpecSourceError(f"{where}:{key_node.start_mark.line + 1}: {format_path(path + (key,))}: key "
                                      f"{key} reads as {_NOT_TEXT[key_node.tag]} in YAML, not a name: "
                                      f"quote it ('{key}')")
            _check_tags_and_map_lines(key_node, path + ("<key>",), {}, where, seen)
            if not isinstance(key_node, yaml.ScalarNode):
                shape = "list" if isinstance(key_node, yaml.SequenceNode) else "mapping"
                raise SpecSourceError(f"{where}:{key_node.start_mark.line + 1}: "
                                      f"a key must be a plain value, not a {shape}")
            key = key_node.value
            if key in keys:
                raise SpecSourceError(f"{where}:{key_node.start_mark.line + 1}: {format_path(path + (key,))}: key "
                                      f"{key!r} appears twice in one mapping")
            keys.add(key)
            lines[path + (key,)] = key_node.start_mark.line + 1
            _check_tags_and_map_lines(value_node, path + (key,), lines, where, seen)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _check_tags_and_map_lines(item, path + (i,), lines, where, seen)


class PlacedError(ValueError):
    """A spec value's error that says where below the model raising it the value lies (`at`,
    keys and list indexes), so that the error names that value's line, not the model's."""

    def __init__(self, message: str, at: tuple):
        super().__init__(message)
        self.at = at


class PlacedErrors(ValueError):
    """Every PlacedError that one check found, raised as one: a validator raises a single
    exception, and the user should see each bad value at once, not the first alone."""

    def __init__(self, errors: list[PlacedError]):
        super().__init__(some_of([str(error) for error in errors], "; "))
        self.errors = errors


def placed_each(error: BaseException | None) -> list[PlacedError]:
    """The placed errors `error` carries: its own list, itself, or none."""
    if isinstance(error, PlacedErrors):
        return error.errors
    return [error] if isinstance(error, PlacedError) else []


def raise_placed(errors: list[PlacedError]) -> None:
    """Raise `errors`, each once (trials that share a bad value report it alike), the one
    alone or all together; return where there are none."""
    unique = list({(str(error), error.at): error for error in errors}.values())
    if len(unique) == 1:
        raise unique[0]
    if unique:
        raise PlacedErrors(unique)


def read_spec_text(text: str) -> Any:
    """A spec's stored text read as `load_yaml` reads its file (`1e-4` is a number there, as in
    YAML 1.2, not the string PyYAML's safe_load makes of it); None for an empty text."""
    if len(text) > MAX_SPEC_BYTES:
        raise ValueError(f"a spec text of {len(text)} characters; a spec is at most {MAX_SPEC_BYTES} bytes")
    loader = _BoundedSafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded_size(node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def read_value(text: str, where: str) -> Any:
    """One YAML value given outside a spec file (a command-line override), read and checked as
    a spec file's values are; an error names `where`."""
    loader = _BoundedSafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expanded_size(node)
        _check_tags_and_map_lines(node, (), {}, where, set())
        return loader.construct_document(node)
    except SpecSourceError as exc:
        raise SpecSourceError(str(exc).replace(f"{where}:1: (top level): ", f"{where}: ")) from None
    except yaml.YAMLError as exc:
        raise SpecSourceError(f"{where}: invalid YAML: {getattr(exc, 'problem', None) or first_line(exc)}") from None
    except RecursionError:
        raise SpecSourceError(f"{where}: invalid YAML: nested too deeply for a spec") from None
    finally:
        loader.dispose()


def load_yaml(path: str | Path) -> YamlSource:
    path = Path(path)
    try:
        with open(path, "rb") as source:  # read no further than a spec can be: /dev/zero ends here too
            raw = source.read(MAX_SPEC_BYTES + 1)
        if len(raw) > MAX_SPEC_BYTES:
            raise SpecSourceError(f"{path}: larger than {MAX_SPEC_BYTES // 1024} KiB, the most a spec may be "
                                  "(the largest shipped spec is under 4 KiB)")
        text = raw.decode("utf-8")
    except FileNotFoundError:
        raise SpecSourceError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecSourceError(f"{path}: cannot read ({exc})") from None
    loader = None
    try:
        loader = _BoundedSafeLoader(text)  # its reader refuses control characters here
        node = loader.get_single_node()
        if node is None or node.tag == _CORE + "null":  # nothing, a bare `---`, or null alone
            raise SpecSourceError(f"{path}:1: the file is empty")
        _check_expanded_size(node)
        lines: dict[tuple, int] = {}
        _check_tags_and_map_lines(node, (), lines, str(path), set())
        data = loader.construct_document(node)
    except SpecSourceError as exc:
        message = str(exc)
        raise SpecSourceError(message if message.startswith(str(path))
                              else f"{path}:{message.removeprefix('line ')}") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark else 1
        raise SpecSourceError(f"{path}:{line}: invalid YAML: {exc.problem or exc.context}") from None
    except yaml.reader.ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        raise SpecSourceError(f"{path}:{line}: invalid YAML: character U+{code:04X} is not allowed "
                              "(control characters cannot appear in a spec)") from None
    except yaml.YAMLError as exc:
        raise SpecSourceError(f"{path}: invalid YAML: {first_line(exc)}") from None
    except RecursionError:
        raise SpecSourceError(f"{path}: invalid YAML: nested too deeply for a spec") from None
    finally:
        if loader is not None:
            loader.dispose()
    return YamlSource(path=path, text=text, data=data, lines=lines)
