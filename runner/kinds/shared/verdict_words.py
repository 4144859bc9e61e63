"""What a verdict's metrics show, in a user's words: the figures behind the rule's bound, with
their units and counts ("65.0 against 106.9 over 100 games a runtime, 4 distinct"), said beside
the rule it was decided by. One function per kind of measurement, each reading the metrics its
kind computes; a figure that is missing is left out."""

from __future__ import annotations


def parity_words(found: dict, ruled: set[str]) -> str | None:
    if "action_agreement" not in found or "parity_states" not in found:
        return None
    states = int(found["parity_states"])
    flipped = int(found.get("action_disagreements", 0))
    return (f"{states - flipped} of {states} fixed states take the same action ({flipped} flipped), "
            f"max |dQ| {found['max_abs_dq']:.3g}")


def latency_words(found: dict, ruled: set[str]) -> str | None:
    if "latency_p50_ms" not in found:
        return None
    text = f"P50 {found['latency_p50_ms']:.3f} ms a call"
    if "latency_p50_ratio" in found:
        text += f", {found['latency_p50_ratio']:.3f}x the baseline's"
    bounds = [f"{name} up to {found[metric]:.3f}x" for name, metric in (
        ("P50 (wall)", "latency_p50_ratio_ci_high"), ("P95 (CPU time)", "cpu_time_p95_ratio_ci_high"))
        if metric in found]
    return f"{text} (95% intervals: {', '.join(bounds)})" if bounds else text


def closed_loop_words(found: dict, ruled: set[str]) -> str | None:
    if "candidate_score" not in found or "baseline_score" not in found:
        return None
    steps = found.get("first_divergence_step")
    where = f", first different action at step {int(steps)}" if steps is not None and steps == steps else ""
    return f"score {found['candidate_score']:g} against {found['baseline_score']:g} over the same steps{where}"


def games_words(found: dict, ruled: set[str]) -> str | None:
    games = found.get("staged_games", found.get("paired_episodes"))
    if games is None:
        return None
    distinct = found.get("distinct_paired_games")
    over = f"over {int(games)} games a runtime" + (f" ({int(distinct)} distinct)" if distinct is not None else "")
    if any(metric.startswith("stall_") for metric in ruled) and "candidate_time_limit_games" in found:
        return (f"{int(found['candidate_time_limit_games'])} games to the time limit against "
                f"{int(found['baseline_time_limit_games'])} {over}")
    if "candidate_mean_score" not in found:
        return None
    text = f"mean score {found['candidate_mean_score']:.1f} against {found['baseline_mean_score']:.1f} {over}"
    if "staged_diff_ci_low" in found:
        text += (f"; difference {found['staged_mean_diff']:+.2f}, interval [{found['staged_diff_ci_low']:.2f}, "
                 f"{found['staged_diff_ci_high']:.2f}] against a margin of -{found['staged_margin']:.2f}")
    return text
