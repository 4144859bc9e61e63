"""The seeds a measurement plays, where its spec writes `seeds: {drawn: N}`: drawn when it
starts from the reserved range (runner.spec.seed_pools), keyed by its candidate files (an ONNX
model by its content: graph and weights, not names or bytes, so a re-save draws the same games;
any other file by its sha256), and stored in `drawn_seeds` with the pool, the key and each
file's hash, so the run records which games it played and why those. Explicit seeds are played
as written.

Which files are the candidates is each kind's to say: the `episodes` kind's are the files its
runtimes other than the baseline load; the `evaluate` kind's, the checkpoint files of its
policies. On --resume the seeds the run drew are played on, whatever the files hold now.
`seeds_report` shows the draw, and the baseline games copied from earlier runs
(runner.kinds.shared.baseline_games), so a report says where every game came from.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from runner.spec.fields import DrawnSeeds, seed_list
from runner.store import schema

if TYPE_CHECKING:
    from runner.report.section import Section
    from runner.run.context import RunContext

MIGRATIONS = [
    (
        "0105_drawn_seeds",
        """
        CREATE TABLE drawn_seeds (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL,
            pool VARCHAR NOT NULL CHECK (pool IN ('check', 'confirmation')),
            key VARCHAR NOT NULL, files JSON NOT NULL, seeds JSON NOT NULL
        )
        """,
    )
]

schema.declare("drawn_seeds", MIGRATIONS)


def played_seeds(ctx: "RunContext", measurement: str, seeds, files: dict[str, str]) -> list[int]:
    """The seeds `measurement` plays: as written, or drawn for `files` ({name: path}) and stored."""
    from runner.spec.seed_pools import draw_key, draw_seeds

    if not isinstance(seeds, DrawnSeeds):
        return seed_list(seeds)
    if ctx.resume:
        with ctx.store.reader() as con:
            stored = con.execute("SELECT seeds FROM drawn_seeds WHERE run_id = ? AND measurement = ?",
                                 [ctx.run_id, measurement]).fetchone()
        if stored is not None:
            return json.loads(stored[0])
    sha256s = {name: seed_identity(path) for name, path in sorted(files.items())}
    key = draw_key(sha256s.values())
    pool = "confirmation" if ctx.confirm else "check"
    drawn = draw_seeds(key, seeds.drawn, pool)
    ctx.store.append_rows("drawn_seeds", [{"run_id": ctx.run_id, "measurement": measurement, "pool": pool, "key": key,
                                           "files": json.dumps(sha256s), "seeds": json.dumps(drawn)}])
    return drawn


def seed_identity(path: str | Path) -> str:
    """What a file's seeds are drawn by: an ONNX model's content hash (its graph and weights, so a
    re-save or renamed nodes draw the same games), any other file's sha256."""
    from breakout_core.common.hashing import file_sha256
    from breakout_core.conversion.model_content import model_content_sha256

    return model_content_sha256(path) if Path(path).suffix == ".onnx" else file_sha256(path)


def seeds_report(con, run_id: str, measurement: str) -> "list[Section]":
    """Where the seeds were drawn, and which baseline games were copied from earlier runs."""
    from runner.report.html import table_html
    from runner.report.section import Section

    drawn = con.execute("SELECT pool, key, files, seeds FROM drawn_seeds WHERE run_id = ? AND measurement = ?",
                        [run_id, measurement]).df()
    reused = con.execute("SELECT runtime, reused_from, count(*) AS games, min(key) AS key FROM baseline_games "
                         "WHERE run_id = ? AND measurement = ? AND reused_from IS NOT NULL GROUP BY ALL "
                         "ORDER BY runtime, reused_from", [run_id, measurement]).df()
    sections = []
    if not drawn.empty:
        sections.append(Section(f"{measurement}: seeds drawn for the candidate files (keyed by their sha256)",
                                html=table_html(drawn)))
    if not reused.empty:
        sections.append(Section(f"{measurement}: baseline games copied from earlier runs under the same key "
                                "(runtime, file, CPU, packages, contract and code alike), not replayed",
                                html=table_html(reused)))
    return sections
