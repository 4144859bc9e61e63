"""runner/ has no import circle: the module graph, imports inside functions and parent packages
counted, has no cycle; and no kind imports another."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def module_graph(root: Path) -> dict[str, set[str]]:
    """{module: the runner modules it imports}, from the source of every file under root/runner."""
    modules = {}
    for path in (root / "runner").rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = [alias.name for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module, *(f"{node.module}.{a.name}" for a in node.names)] \
                if isinstance(node, ast.ImportFrom) and node.module and node.level == 0 else []
            graph[name] |= {found for t in targets
                            if t.startswith("runner") and (found := known(t)) not in (None, name)}
        parents = name.split(".")
        graph[name] |= {".".join(parents[:i]) for i in range(1, len(parents)) if ".".join(parents[:i]) in modules}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_runner_has_no_import_cycle():
    assert cycles(module_graph(REPO)) == []


def test_a_cycle_is_found_and_named(tmp_path):
    package = tmp_path / "runner"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from runner.b import g\n")
    (package / "b.py").write_text("from runner import a\n")
    assert cycles(module_graph(tmp_path)) == [["runner.a", "runner.b"]]


def test_no_kind_imports_another():
    graph = module_graph(REPO)
    kinds = {name for name in graph if name.startswith("runner.kinds.") and not name.startswith(
        ("runner.kinds.shared", "runner.kinds.kind", "runner.kinds.registry"))}

    def kind_of(name: str) -> str:
        return ".".join(name.split(".")[:3])

    crossing = sorted((name, other) for name in kinds for other in graph[name]
                      if other in kinds and kind_of(other) != kind_of(name))
    assert crossing == []
