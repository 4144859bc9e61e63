"""The baseline's games, reused where the same baseline already played them on this machine.

A game on a seed is a function of the contract, the policy and the seed
(breakout_core.game.driver); a runtime's policy is its backend, options and file, and its numbers
depend on the CPU and the libraries that compute them (and on the batch it is asked in). A
baseline's game stored under the same key is the game it would play again, so the `episodes`
kind copies it into the new run instead of replaying it. The key is the sha256 of all of
that (`keyed_by`, stored beside it): the contract's hash, the backend and its options, the
file's sha256, the batch size, the CPU's model name and flags, and the versions of Python
and the packages provenance records. Another runtime, CPU, library version or contract gives
another key and never reuses.

`baseline_games` holds one row per baseline game of a run: its key, and the run it was copied
from (NULL where it was played). Only played games are copied from.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

from runner.store import schema

if TYPE_CHECKING:
    from runner.run.context import RunContext

MIGRATIONS = [
    (
        "0106_baseline_games",
        """
        CREATE TABLE baseline_games (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, runtime VARCHAR NOT NULL, seed BIGINT NOT NULL,
            key VARCHAR NOT NULL, keyed_by JSON NOT NULL, reused_from VARCHAR
        )
        """,
    )
]

schema.declare("baseline_games", MIGRATIONS)

EPISODE_COLUMNS = ("measurement", "policy", "seed", "score", "steps", "frames", "ended_by", "action_noop",
                   "action_fire", "action_right", "action_left", "wall_s", "contract_hash")


def _cpu() -> dict:
    from breakout_core.common.cpu_flags import cpu_flags
    from runner.store.provenance import cpu_name

    return {"model": cpu_name(), "flags": sorted(cpu_flags())}


def game_key(ctx: "RunContext", runtime: str, batch_size: int) -> tuple[str, dict]:
    """(key, what it is the sha256 of) for the games `runtime` plays in batches of `batch_size`."""
    from breakout_core.common.hashing import file_sha256
    from runner.store.provenance import package_versions

    config = ctx.spec.runtimes[runtime]
    keyed_by = {"contract": ctx.contract.hash, "backend": config.runtime, "options": config.options(),
                "file_sha256": file_sha256(ctx.spec.artifacts[config.artifact].path), "batch_size": batch_size,
                "cpu": _cpu(), "packages": json.loads(package_versions())}
    text = json.dumps(keyed_by, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest(), json.loads(text)


def reuse_games(ctx: "RunContext", measurement: str, runtime: str, seeds: list[int], key: str,
                keyed_by: dict) -> list[int]:
    """Copy into this run the games played before under `key` on any of `seeds`; the seeds
    still to play, in order."""
    with ctx.store.reader() as con:
        found = con.execute(
            f"SELECT g.run_id, {', '.join('e.' + c for c in EPISODE_COLUMNS)} FROM baseline_games g JOIN episodes e "
            "ON e.run_id = g.run_id AND e.measurement = g.measurement AND e.policy = g.runtime AND e.seed = g.seed "
            "WHERE g.key = ? AND g.reused_from IS NULL AND g.run_id <> ? AND list_contains(?, g.seed) "
            "QUALIFY row_number() OVER (PARTITION BY g.seed ORDER BY g.run_id) = 1",
            [key, ctx.run_id, seeds]).fetchall()
    if not found:
        return seeds
    episodes, marks = [], []
    for source, *values in found:
        row = {**dict(zip(EPISODE_COLUMNS, values)), "run_id": ctx.run_id, "measurement": measurement,
               "policy": runtime}
        episodes.append(row)
        marks.append({"run_id": ctx.run_id, "measurement": measurement, "runtime": runtime, "seed": row["seed"],
                      "key": key, "keyed_by": json.dumps(keyed_by), "reused_from": source})
    ctx.store.append_together({"episodes": episodes, "baseline_games": marks})
    reused = {row["seed"] for row in episodes}
    return [s for s in seeds if s not in reused]


def played_marks(ctx: "RunContext", measurement: str, runtime: str, seeds: list[int], key: str,
                 keyed_by: dict) -> list[dict]:
    """The rows that record the games `runtime` just played under `key`, for later runs to reuse;
    stored with the games themselves."""
    return [{"run_id": ctx.run_id, "measurement": measurement, "runtime": runtime, "seed": s, "key": key,
             "keyed_by": json.dumps(keyed_by), "reused_from": None} for s in seeds]


def reused_count(con, run_id: str, measurement: str, runtime: str) -> int:
    return con.execute("SELECT count(*) FROM baseline_games WHERE run_id = ? AND measurement = ? AND runtime = ? "
                       "AND reused_from IS NOT NULL", [run_id, measurement, runtime]).fetchone()[0]
