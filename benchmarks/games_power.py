"""Power and expected games of the staged games rule, on the recorded paired games.

    python benchmarks/games_power.py [--sequences 4000] [--data tests/data/paired_games.csv]

For each population of tests/data/paired_games.csv (FP16 pairs, INT8 pairs, left-tail
collapses: breakout_core.statistics.sequential_oc.recorded_families) and each shipped plan (the staged
games of specs/check_onnx.yaml and specs/int8_cpu.yaml), the candidate's scores are shifted
to a mean difference of 0, -0.5, -1, -1.5 and -2 margins (a margin: 10% of the baseline's
mean), and the rule runs on --sequences resampled sequences: the share ending non-inferior,
inferior and inconclusive, and the games a runtime it played on average. Nothing is asserted:
the error rates are tests/test_games_operating_characteristics.py's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

SHIFTS = (0.0, 0.5, 1.0, 1.5, 2.0)  # the true mean loss, in margins


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sequences", type=int, default=4000)
    parser.add_argument("--data", type=Path, default=REPO / "tests" / "data" / "paired_games.csv")
    args = parser.parse_args()

    from test_games_operating_characteristics import PLANS

    from breakout_core.statistics.sequential_oc import recorded_families, shifted_pairs, simulate

    families = recorded_families(args.data)
    print(f"{'plan':<11} {'population':<20} {'loss':>6} {'non-inf':>8} {'inferior':>8} {'inconcl':>8} {'games':>6}")
    same: dict = {}  # specs whose plans are the same share their rows
    for plan_name, (plan, fraction) in PLANS.items():
        same.setdefault((plan, fraction), []).append(plan_name)
    for names, (plan, fraction) in ((", ".join(n), key) for key, n in same.items()):
        plan_name = names.split(", ")[0]
        for family, (candidate, baseline) in families.items():
            margin = fraction * baseline.mean()
            for shift in SHIFTS:
                c, b = shifted_pairs(candidate, baseline, -shift * margin)
                found = simulate(plan, c, b, sequences=args.sequences, seed=7, margin_fraction=fraction)
                print(f"{plan_name:<11} {family:<20} {shift:>5.1f}m {found.non_inferior:>8.3f} "
                      f"{found.inferior:>8.3f} {found.inconclusive:>8.3f} {found.mean_games:>6.0f}", flush=True)
        print(f"{names}: stages of {plan.stage_games}, cap {plan.max_games}, {plan.looks} looks, "
              f"margin {fraction:.0%} of the baseline's mean ({margin:.2f} points on these games)")


if __name__ == "__main__":
    main()
