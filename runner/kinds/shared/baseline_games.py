"""The baseline's games, reused where the same baseline already played them on this machine.

A game on a seed is a function of the contract, the policy and the seed
(breakout_core.game.driver); a runtime's policy is its backend, options and file, and its numbers
depend on the CPU and the libraries that compute them (and on the batch it is asked in), and
on the code that plays and preprocesses the game. A baseline's game stored under the same key
is the game it would play again, so the `episodes` kind copies it into the new run instead of
replaying it. The key is the sha256 of all of that (`keyed_by`, stored beside it): the
contract's hash, the backend and its options, the file's sha256, the batch size, the CPU's
model name and flags, the versions of Python and the packages provenance records, and the
project's own code (its version, commit and the sha256 of its packages' files:
runner.store.provenance.code_identity). Another runtime, CPU, library version, code or contract
gives another key and never reuses.

`baseline_games` holds one row per baseline game of a run: its key, what it keys, the sha256 of
the game (GAME_COLUMNS: seed, score, steps, frames, ending, actions, contract), and the run it
was copied from (NULL where it was played). Only played games are copied from, and only after
checking what a database edit would break: the key is the sha256 of its stored `keyed_by`, the
source game's row still hashes to what was recorded when it was played, and its contract is this
run's. A row that fails is refused (StoredRowChanged), never copied.
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING

from runner.store import schema
from runner.store.errors import StoredRowChanged
from runner.store.provenance import code_identity

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
    ),
    (
        "0107_baseline_games_game_sha256",  # the game's stored values, hashed as it was played (NULL: before)
        """
        ALTER TABLE baseline_games ADD COLUMN game_sha256 VARCHAR;
        """,
    ),
]

schema.declare("baseline_games", MIGRATIONS)

EPISODE_COLUMNS = ("measurement", "policy", "seed", "score", "steps", "frames", "ended_by", "action_noop",
                   "action_fire", "action_right", "action_left", "wall_s", "contract_hash")
# the game itself, as a copy takes it from its source: where it lands and the time it took aside
GAME_COLUMNS = tuple(c for c in EPISODE_COLUMNS[2:] if c != "wall_s")


def _cpu() -> dict:
    from breakout_core.common.cpu_flags import cpu_flags
    from runner.store.provenance import cpu_name

    return {"model": cpu_name(), "flags": sorted(cpu_flags())}


def _canonical(keyed_by: dict) -> str:
    return json.dumps(keyed_by, sort_keys=True, default=str)


def key_of(keyed_by: dict) -> str:
    """The key of what `keyed_by` says: the sha256 of its canonical JSON."""
    return hashlib.sha256(_canonical(keyed_by).encode()).hexdigest()


def game_sha256(row: dict) -> str:
    """The sha256 of a game's GAME_COLUMNS, numbers as floats (as a Python row and one read back agree)."""
    values = [v if v is None or isinstance(v, str) else float(v) for v in (row[c] for c in GAME_COLUMNS)]
    return hashlib.sha256(json.dumps(values).encode()).hexdigest()


def game_key(ctx: "RunContext", runtime: str, batch_size: int) -> tuple[str, dict]:
    """(key, what it is the sha256 of) for the games `runtime` plays in batches of `batch_size`."""
    from breakout_core.common.hashing import model_sha256
    from runner.store.provenance import package_versions

    config = ctx.spec.runtimes[runtime]
    keyed_by = {"contract": ctx.contract.hash, "backend": config.runtime, "options": config.options(),
                "file_sha256": model_sha256(ctx.spec.artifacts[config.artifact].path), "batch_size": batch_size,
                "cpu": _cpu(), "packages": json.loads(package_versions()), "code": code_identity()}
    keyed_by = json.loads(_canonical(keyed_by))  # as it reads back from its stored JSON
    return key_of(keyed_by), keyed_by


def reuse_games(ctx: "RunContext", measurement: str, runtime: str, seeds: list[int], key: str,
                keyed_by: dict) -> list[int]:
    """Copy into this run the games played before under `key` on any of `seeds`; the seeds
    still to play, in order. A stored game that fails its checks is refused (StoredRowChanged)."""
    with ctx.store.reader() as con:
        found = con.execute(
            f"SELECT g.run_id, g.keyed_by, g.game_sha256, {', '.join('e.' + c for c in EPISODE_COLUMNS)} "
            "FROM baseline_games g JOIN episodes e "
            "ON e.run_id = g.run_id AND e.measurement = g.measurement AND e.policy = g.runtime AND e.seed = g.seed "
            "WHERE g.key = ? AND g.reused_from IS NULL AND g.run_id <> ? AND list_contains(?, g.seed) "
            "QUALIFY row_number() OVER (PARTITION BY g.seed ORDER BY g.run_id) = 1",
            [key, ctx.run_id, seeds]).fetchall()
    if not found:
        return seeds
    episodes, marks = [], []
    for source, stored_keyed_by, digest, *values in found:
        game = dict(zip(EPISODE_COLUMNS, values))
        _check(ctx, source, game, key, json.loads(stored_keyed_by), digest)
        row = {**game, "run_id": ctx.run_id, "measurement": measurement, "policy": runtime}
        episodes.append(row)
        marks.append({"run_id": ctx.run_id, "measurement": measurement, "runtime": runtime, "seed": row["seed"],
                      "key": key, "keyed_by": _canonical(keyed_by), "reused_from": source, "game_sha256": digest})
    ctx.store.append_together({"episodes": episodes, "baseline_games": marks})
    reused = {row["seed"] for row in episodes}
    return [s for s in seeds if s not in reused]


def _check(ctx: "RunContext", source: str, game: dict, key: str, keyed_by: dict, digest: str | None) -> None:
    """Refuse a stored game that a database edit changed: its key, its values or its contract."""
    where = (f"{ctx.store.path}: baseline_games row of run {source} ({game['measurement']} · {game['policy']}, "
             f"seed {game['seed']})")
    if key_of(keyed_by) != key:
        problem = "its key is not the sha256 of its stored keyed_by"
    elif digest != game_sha256(game):
        problem = "its episode's stored values are not those recorded when it was played (game_sha256)"
    elif game["contract_hash"] != ctx.contract.hash:
        problem = f"its episode was played under contract {game['contract_hash']}, not this run's {ctx.contract.hash}"
    else:
        return
    raise StoredRowChanged(f"{where} refused: {problem}, so it was edited after it was stored; nothing was copied "
                           "(delete the row to replay that game)")


def played_marks(ctx: "RunContext", measurement: str, runtime: str, episodes: list[dict], key: str,
                 keyed_by: dict) -> list[dict]:
    """The rows that record the games `runtime` just played under `key` (its `episodes` rows),
    for later runs to reuse; stored with the games themselves."""
    return [{"run_id": ctx.run_id, "measurement": measurement, "runtime": runtime, "seed": e["seed"], "key": key,
             "keyed_by": _canonical(keyed_by), "reused_from": None, "game_sha256": game_sha256(e)}
            for e in episodes]


def reused_count(con, run_id: str, measurement: str, runtime: str) -> int:
    return con.execute("SELECT count(*) FROM baseline_games WHERE run_id = ? AND measurement = ? AND runtime = ? "
                       "AND reused_from IS NOT NULL", [run_id, measurement, runtime]).fetchone()[0]
