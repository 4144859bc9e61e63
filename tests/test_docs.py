"""The documentation against the code: the README's list of tables and views is the schema a
new database gets, every repository path docs/architecture.md names exists, and its engine
table names every engine module in its room."""

from __future__ import annotations

import re
from pathlib import Path

from runner.store.database import Store

REPO = Path(__file__).parents[1]


def _schema_block() -> tuple[set[str], set[str]]:
    """(tables, views) the README names between its store-schema markers: the backticked
    name that starts each item, and every backticked name after it on the item's lines."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = re.search(r"<!-- store-schema:begin -->(.*?)<!-- store-schema:end -->", text, re.S)
    assert block, "README.md has no store-schema block"
    tables_text, views_text = block.group(1).split("\nViews:\n")
    names = lambda part: set(re.findall(r"`([a-z_][a-z0-9_]*)`", part))  # noqa: E731
    return names(tables_text), names(views_text)


def test_readme_lists_every_table_and_view_a_new_database_has(tmp_path):
    with Store(tmp_path / "schema.duckdb").writer() as con:
        rows = con.execute("SELECT table_name, table_type FROM information_schema.tables "
                           "WHERE table_schema = 'main'").fetchall()
    tables = {name for name, kind in rows if kind == "BASE TABLE"}
    views = {name for name, kind in rows if kind == "VIEW"}
    listed_tables, listed_views = _schema_block()
    assert listed_tables == tables, (f"README lacks {sorted(tables - listed_tables)}, "
                                     f"names tables that are not there {sorted(listed_tables - tables)}")
    assert listed_views == views, (f"README lacks {sorted(views - listed_views)}, "
                                   f"names views that are not there {sorted(listed_views - views)}")


def test_architecture_doc_names_only_files_that_exist():
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    paths = set(re.findall(r"`((?:breakout_core|runner|tests|specs|docs|scripts|benchmarks|web)/[\w./-]*)`", text))
    assert len(paths) > 10
    missing = sorted(p for p in paths if not (REPO / p.rstrip("/")).exists())
    assert missing == [], f"docs/architecture.md names paths that do not exist: {missing}"


def test_the_engine_table_names_every_module_in_its_room():
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("## The engine", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `breakout_core/(\w+)/` \| ([^|]*) \|", section, re.M)
    named = {(room, module) for room, cell in rows for module in re.findall(r"`(\w+)\.py`", cell)}
    backends = {("runtimes", p.stem) for p in (REPO / "breakout_core" / "runtimes").glob("*_runtime.py")}
    present = {(p.parent.name, p.stem) for p in (REPO / "breakout_core").glob("*/*.py") if p.stem != "__init__"}
    assert sorted(present - backends - named) == [], "modules the engine table does not name in their room"
    assert sorted(named - present) == [], "modules the engine table names that are not there"


def test_readme_names_only_repository_files_that_exist():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert "docs/architecture.md" in text
    paths = set(re.findall(r"`((?:docs|scripts|specs|benchmarks|models)/[\w./-]+\.\w+)`", text))
    assert "docs/architecture.md" in paths
    assert sorted(p for p in paths if not (REPO / p).is_file()) == []
