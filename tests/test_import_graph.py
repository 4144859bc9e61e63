"""Neither runner/ nor the engine, breakout_core/, has an import circle: the module graph, imports
inside functions and parent packages counted, has no cycle. No kind imports another; the engine
never imports runner, holds every module in a room, and a room imports only rooms below it."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


# the engine's rooms, bottom to top: each imports only from rooms before it in this list
ENGINE_ROOMS = ("common", "statistics", "game", "learning", "conversion", "diagnosis", "browser", "runtimes",
                "evaluation")


def imported(path: Path) -> list[str]:
    """Every module name an import in `path` names (inside functions too), with each
    `from X import y` counted as X and X.y."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return names


def module_graph(root: Path, package: str = "runner") -> dict[str, set[str]]:
    """{module: the modules of `package` it imports}, from the source of every file under root/package."""
    modules = {}
    for path in (root / package).rglob("*.py"):
        parts = list(path.relative_to(root).with_suffix("").parts)
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        graph[name] |= {found for t in imported(path)
                        if t.split(".")[0] == package and (found := known(t)) not in (None, name)}
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


def test_the_engine_has_no_import_cycle():
    assert cycles(module_graph(REPO, "breakout_core")) == []


def test_a_cycle_in_the_engine_is_found_and_named(tmp_path):
    room = tmp_path / "breakout_core" / "game"
    room.mkdir(parents=True)
    for package in (room.parent, room):
        (package / "__init__.py").write_text("")
    (room / "driver.py").write_text("def f():\n    from breakout_core.game.envs import g\n")
    (room / "envs.py").write_text("import breakout_core.game.driver\n")
    assert cycles(module_graph(tmp_path, "breakout_core")) == [["breakout_core.game.driver",
                                                                "breakout_core.game.envs"]]


def test_the_engine_never_imports_runner():
    found = sorted(str(path.relative_to(REPO)) for path in (REPO / "breakout_core").rglob("*.py")
                   if any(name.split(".")[0] == "runner" for name in imported(path)))
    assert found == []


def test_every_engine_module_is_in_a_room_and_rooms_import_only_rooms_below():
    loose = sorted(p.name for p in (REPO / "breakout_core").glob("*.py") if p.name != "__init__.py")
    assert loose == []
    rooms = sorted(p.name for p in (REPO / "breakout_core").iterdir() if (p / "__init__.py").is_file())
    assert rooms == sorted(ENGINE_ROOMS)
    graph = module_graph(REPO, "breakout_core")

    def room(name: str) -> str | None:
        parts = name.split(".")
        return parts[1] if len(parts) > 2 else None

    climbing = sorted((name, other) for name, imports in graph.items() for other in imports
                      if room(name) and room(other) and room(name) != room(other)
                      and ENGINE_ROOMS.index(room(other)) > ENGINE_ROOMS.index(room(name)))
    assert climbing == []
