"""`runner check` cut to seconds for tests, its method unchanged: games in stages (6 seeds in 3
looks of 2, the fewest looks a plan may have) and latency over rounds (10 rounds of 100 timed
calls, the least a P95 rule accepts)."""

from __future__ import annotations

SMALL_CHECK = ("measurements.games.seeds={start: 3000, count: 6}", "measurements.games.stages={games: 2}",
               "measurements.latency.iterations=1000", "measurements.latency.rounds=10")


def set_args(*overrides: str) -> list[str]:
    """`--set` before each override, as the command line takes them."""
    return [arg for override in overrides for arg in ("--set", override)]
