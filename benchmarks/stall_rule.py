"""The stalls verdict's outcome rates, exact over every outcome of N paired games: the rule
`stall_excess_ci_high <= 0.1` (breakout_core.statistics.stalls) on equal models, small
excesses, an excess at the 10-point tolerance and one well above it.

    python benchmarks/stall_rule.py
"""

from __future__ import annotations

from breakout_core.statistics.stalls import stall_rule_rates

POPULATIONS = [  # (what, chance of a candidate-only stall, of a baseline-only stall)
    ("equal, 2% each", 0.02, 0.02),
    ("equal, 3% each", 0.03, 0.03),
    ("2 points more", 0.04, 0.02),
    ("4 points more", 0.06, 0.02),
    ("at the tolerance", 0.12, 0.02),
    ("at the tolerance, baseline never alone", 0.10, 0.0),
    ("20 points more", 0.25, 0.05),
]


def main() -> None:
    print(f"{'population':40s} {'games':>5s} {'worthy':>7s} {'rejected':>8s} {'inconcl.':>8s}")
    for what, only_candidate, only_baseline in POPULATIONS:
        for games in (50, 100, 200, 300, 400):
            rates = stall_rule_rates(games, only_candidate, only_baseline)
            print(f"{what:40s} {games:5d} {rates.deployment_worthy:7.3f} {rates.rejected:8.3f} "
                  f"{rates.inconclusive:8.3f}")


if __name__ == "__main__":
    main()
