"""`runner specs`: the shipped specs, what each asks and needs, and when it last ran here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click

from runner.cli.options import db_option
from runner.spec.output_paths import SHIPPED_SPECS

SPECS_DIR = SHIPPED_SPECS


@dataclass(frozen=True)
class SpecSummary:
    file: Path
    name: str
    description: str
    kinds: tuple[str, ...]
    gpu_runtimes: int  # runtimes that need a CUDA device (rows stored as unavailable without one)
    runtimes: int
    browser: bool


def summarise(path: Path) -> SpecSummary:
    """What a spec file asks and needs, read from its resolved document without running or
    validating it (a spec that does not read says why in its description)."""
    from runner.spec.extends import resolve_extends
    from runner.spec.yaml_source import SpecSourceError, load_yaml

    try:
        data = resolve_extends(load_yaml(path)).data
    except SpecSourceError as exc:
        return SpecSummary(path, path.stem, f"(does not read: {exc})", (), 0, 0, False)
    data = data if isinstance(data, dict) else {}
    measurements = [m for m in data.get("measurements") or [] if isinstance(m, dict)]
    kinds = tuple(dict.fromkeys(str(m.get("kind")) for m in measurements))
    needs = [runtime_needs(config) for config in (data.get("runtimes") or {}).values()]
    description = " ".join(str(data.get("description", "")).split())
    return SpecSummary(path, str(data.get("name", path.stem)), description, kinds,
                       sum("gpu" in n for n in needs), len(needs), any("browser" in n for n in needs))


def runtime_needs(config: object) -> frozenset[str]:
    """What one runtime configuration of a spec needs of the machine (its backend says)."""
    from breakout_core.runtimes.registry import RUNTIMES

    if not isinstance(config, dict) or config.get("runtime") not in RUNTIMES:
        return frozenset()
    backend = RUNTIMES[config["runtime"]]
    try:
        options = backend.resolve_options(**{k: v for k, v in config.items() if k not in ("runtime", "artifact")})
    except ValueError:
        return frozenset()
    return backend.needs(options)


def shipped_specs(folder: Path) -> list[Path]:
    """The specs in `folder` that run (a base, _name.yaml, is left out)."""
    from runner.spec.extends import is_base_only

    return sorted(p for p in folder.glob("*.yaml") if not is_base_only(p))


def last_runs(db: Path | None) -> tuple[dict[str, tuple], str | None]:
    """{spec name: (started_at, status)} of each spec's latest run in the database, read-only,
    and why there are none (no database, or one this runner cannot read)."""
    from runner.store.database import Store, StoreError

    store = Store(db)
    if not store.path.exists():
        return {}, f"no database at {store.path}: no runs yet"
    try:
        with store.reader() as con:
            rows = con.execute("SELECT spec_name, started_at, status FROM runs "
                               "QUALIFY row_number() OVER (PARTITION BY spec_name ORDER BY started_at DESC) = 1"
                               ).fetchall()
    except StoreError as exc:
        return {}, f"last runs not shown: {exc}"
    return {name: (started, status) for name, started, status in rows}, None


def needs_text(spec: SpecSummary) -> str:
    needs = []
    if spec.gpu_runtimes:
        needs.append("GPU" if spec.gpu_runtimes == spec.runtimes else f"GPU for {spec.gpu_runtimes} of "
                                                                       f"{spec.runtimes} runtimes")
    if spec.browser:
        needs.append("browser")
    return ", ".join(needs) or "CPU only"


@click.command()
@click.option("--dir", "folder", type=click.Path(file_okay=False, exists=True, path_type=Path), default=SPECS_DIR,
              show_default="the shipped specs/", help="the folder of specs to list")
@db_option
def specs(folder: Path, db: Path | None) -> None:
    """List the specs (not the _ bases): the question each asks, its measurement kinds, whether it
    needs a GPU (without one those runtimes are stored as unavailable) or a browser, and its last
    run in the database (read-only; any run of that name, --set ones too)."""
    from runner.cli.terminal import folding_table, table_console

    runs, why_none = last_runs(db)
    table = folding_table("spec", "question", "kinds", "needs", "last run")
    summaries = [summarise(path) for path in shipped_specs(folder)]
    for spec in summaries:
        started, status = runs.get(spec.name, (None, None))
        table.add_row(spec.name, spec.description, ", ".join(spec.kinds), needs_text(spec),
                      f"{started:%Y-%m-%d %H:%M} ({status})" if started else "")
    console = table_console()
    console.print(table)
    click.echo(f"{len(summaries)} spec(s) in {folder}" + (f"; {why_none}" if why_none else ""))
