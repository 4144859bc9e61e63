"""docs/architecture.md's "Adding a backend" checklist, held true for every registered backend:
its own documented module, the hooks the checklist names, its extra in pyproject.toml and in
the README's Install section, and its row in the README's and the architecture page's
runtime tables. Derived from the registry, so a new backend is checked with no edit here."""

from __future__ import annotations

import inspect
import re
import sys
import tomllib
from pathlib import Path

from breakout_core.runtimes.base import Runtime
from breakout_core.runtimes.registry import RUNTIMES

REPO = Path(__file__).parents[1]
ARCHITECTURE = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
README = (REPO / "README.md").read_text(encoding="utf-8")


def _section(text: str, heading: str) -> str:
    """The text under a markdown heading, up to the next heading of its level or above."""
    level = heading.split(" ")[0]
    start = text.index(heading + "\n")
    following = re.search(rf"^#{{1,{len(level)}}} ", text[start + len(heading):], re.M)
    return text[start:start + len(heading) + following.start()] if following else text[start:]


def _table_rows(text: str) -> dict[str, list[str]]:
    """{first cell's backticked name: the other cells} of every markdown table row."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and (name := re.fullmatch(r"`([a-z0-9_]+)`", cells[0])):
            rows[name.group(1)] = cells[1:]
    return rows


def test_the_checklist_names_every_hook_a_backend_must_implement():
    checklist = _section(ARCHITECTURE, "### Adding a backend")
    abstract = sorted(Runtime.__abstractmethods__)
    assert abstract and all(f"`{hook}`" in checklist for hook in abstract), abstract
    for declared in ("name", "artifact_types", "OPTIONS", "EXTRA", "RUNTIMES", "ActualRun"):
        assert f"`{declared}`" in checklist, declared


def test_every_backend_is_its_own_documented_module_in_the_architecture_table():
    documented = _table_rows(_section(ARCHITECTURE, "## Runtimes"))
    modules = {path.name for path in (REPO / "breakout_core" / "runtimes").glob("*_runtime.py")}
    registered = set()
    for name, backend in RUNTIMES.items():
        module = sys.modules[backend.__module__]
        path = Path(inspect.getfile(module)).resolve()
        assert path.parent == (REPO / "breakout_core" / "runtimes").resolve() and path.name.endswith("_runtime.py"), \
            f"{name}: {path} is not breakout_core/runtimes/<name>_runtime.py"
        assert (module.__doc__ or "").strip(), f"{name}: its module has no docstring"
        assert documented.get(name) == [f"`breakout_core/runtimes/{path.name}`"], \
            f"docs/architecture.md's runtime table lacks `{name}` | `breakout_core/runtimes/{path.name}`"
        registered.add(path.name)
    assert modules == registered, f"backend modules not in the registry: {sorted(modules - registered)}"
    unknown = sorted(set(documented) - set(RUNTIMES))
    assert unknown == [], f"docs/architecture.md's runtime table names backends not registered: {unknown}"


def test_every_extra_is_in_pyproject_and_the_readme_install_section():
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    install = _section(README, "## Install")
    for name, backend in RUNTIMES.items():
        if backend.EXTRA is not None:
            assert backend.EXTRA in extras, f"{name}: extra {backend.EXTRA!r} is not in pyproject.toml"
            assert f"'.[{backend.EXTRA}]'" in install, f"{name}: the README's Install section does not name " \
                                                       f"pip install -e '.[{backend.EXTRA}]'"


def test_the_readme_runtime_table_is_the_registry():
    block = re.search(r"<!-- runtimes:begin -->(.*?)<!-- runtimes:end -->", README, re.S)
    assert block, "README.md has no runtimes block"
    rows = _table_rows(block.group(1))
    assert list(rows) == list(RUNTIMES), f"README lists {list(rows)}, the registry holds {list(RUNTIMES)}"
    for name, backend in RUNTIMES.items():
        runs, loads, extra = rows[name]
        assert loads == ", ".join(backend.artifact_types), f"{name}: README says it loads {loads!r}"
        assert extra == (f"`{backend.EXTRA}`" if backend.EXTRA else "none"), f"{name}: README's extra {extra!r}"
