"""How long a check's games will take here, said before they start: the games its plan may play
(a first stage at least, the cap at most, on every runtime) at the rate earlier checks' games
ran in this database on this host. Where none ran yet, the games alone are said."""

from __future__ import annotations

import socket
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class GamesEstimate:
    games_low: int  # a runtime: the first stage (or every seed where the games are not staged)
    games_high: int  # a runtime: the cap
    runtimes: int
    games_per_minute: float | None  # this host's earlier checks in this database; None where none ran
    minutes_low: float | None
    minutes_high: float | None

    def words(self) -> str:
        games = (f"{self.games_low} games a runtime" if self.games_low == self.games_high
                 else f"{self.games_low} to {self.games_high} games a runtime, as the staged test decides")
        if self.games_per_minute is None:
            return f"games: {games}, {self.runtimes} runtimes (no check's games were timed on this host in this " \
                   "database yet: no estimate of the minutes)"
        return (f"games: {games}, {self.runtimes} runtimes, about {self.minutes_low:.1f} to {self.minutes_high:.1f} "
                f"minutes at the {self.games_per_minute:.1f} games a minute earlier checks played on this host")

    def record(self) -> dict:
        return asdict(self)


def games_estimate(store, spec) -> GamesEstimate | None:
    """The estimate for the spec's staged games measurement (None where it has none)."""
    from runner.spec.fields import seed_count

    staged = next((m for m in spec.measurements if m.kind == "episodes"), None)
    if staged is None:
        return None
    high = seed_count(staged.seeds)
    low = min(staged.stages.games, high) if staged.stages is not None else high
    rate = _games_per_minute(store, spec.name)
    runtimes = len(staged.runtimes)
    minutes = (None, None) if rate is None else (low * runtimes / rate, high * runtimes / rate)
    return GamesEstimate(low, high, runtimes, rate, *minutes)


def _games_per_minute(store, spec_name: str) -> float | None:
    if not store.path.exists():
        return None
    with store.reader() as con:
        games, seconds = con.execute(
            "SELECT sum(i.episodes), sum(i.wall_s) FROM episode_inference i JOIN runs r USING (run_id) "
            "WHERE r.spec_name = ? AND r.host = ?", [spec_name, socket.gethostname()]).fetchone()
    return None if not games or not seconds else 60.0 * games / seconds
