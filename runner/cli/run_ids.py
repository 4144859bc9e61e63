"""Run ids and spec names as a user types them: a unique prefix of a run id, or of its last part
(the six hex digits after the time), stands for the run, and a name that matches nothing is
answered with the names it may have meant."""

from __future__ import annotations

import difflib
from pathlib import Path

from runner.store.database import Store
from runner.store.errors import NoSuchRun

SHOWN_MATCHES = 10  # an ambiguous prefix lists at most this many of the runs it matches


def resolve_run(con, typed: str) -> str:
    """The run id `typed` is, or the one it begins, or the one whose last part (the random hex
    digits after the time) it begins; NoSuchRun for none or several."""
    if con.execute("SELECT 1 FROM runs WHERE run_id = ?", [typed]).fetchone():
        return typed
    matches = [r[0] for r in con.execute(
        "SELECT run_id FROM runs WHERE starts_with(run_id, $typed) "
        "OR starts_with(string_split(run_id, '-')[-1], $typed) ORDER BY started_at DESC", {"typed": typed}).fetchall()]
    if len(matches) == 1:
        return matches[0]
    if matches:
        shown = ", ".join(matches[:SHOWN_MATCHES]) + (f" and {len(matches) - SHOWN_MATCHES} more"
                                                       if len(matches) > SHOWN_MATCHES else "")
        raise NoSuchRun(f"run id {typed!r} is ambiguous: it begins {len(matches)} runs ({shown})")
    known = [r[0] for r in con.execute("SELECT run_id FROM runs").fetchall()]
    raise NoSuchRun(f"no run {typed!r} in the database{_did_you_mean(typed, known)}")


def resolve_spec(con, typed: str) -> str:
    """`typed` if some run of the database is of that spec; NoSuchRun naming the likely specs otherwise."""
    known = [r[0] for r in con.execute("SELECT DISTINCT spec_name FROM runs ORDER BY spec_name").fetchall()]
    if typed not in known:
        raise NoSuchRun(f"no run of spec {typed!r} in the database{_did_you_mean(typed, known)}")
    return typed


def resolved_runs(store: Store, *typed: str | None) -> list[str | None]:
    """Each of `typed` resolved by resolve_run (None stays None), read in one connection."""
    if not any(typed):
        return list(typed)
    with store.reader() as con:
        return [resolve_run(con, t) if t else None for t in typed]


def resolved_spec(store: Store, typed: str | None) -> str | None:
    """`typed` checked by resolve_spec (None stays None)."""
    if typed is None:
        return None
    with store.reader() as con:
        return resolve_spec(con, typed)


def missing_spec_file(path: Path) -> str:
    """'; did you mean specs/X.yaml?' for a spec file that is not there: the spec files of its
    folder (of ./specs, for a bare name like `day24`) named like it."""
    folder = path.parent if path.parent != Path(".") or path.suffix else Path("specs")
    files = {f.stem: f for f in sorted(folder.glob("*.yaml")) if not f.name.startswith("_")} if folder.is_dir() else {}
    likely = _likely(path.stem, list(files))
    return f"; did you mean {' or '.join(str(files[n]) for n in likely)}?" if likely else ""


def _did_you_mean(typed: str, known: list[str]) -> str:
    """'; did you mean A or B?' for the known names like `typed`."""
    likely = _likely(typed, known)
    return f"; did you mean {' or '.join(likely)}?" if likely else ""


def _likely(typed: str, known: list[str]) -> list[str]:
    """At most three of `known`: those that contain `typed`, then those spelled like it."""
    lowered = typed.lower()
    containing = [k for k in known if lowered in k.lower()]
    close = difflib.get_close_matches(typed, known, n=3, cutoff=0.6)
    return list(dict.fromkeys(containing + close))[:3]
