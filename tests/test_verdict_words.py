"""A verdict's figures in a user's words: counts with what they count, ms with their unit,
scores with the games (and distinct games) they rest on."""

from __future__ import annotations

from runner.kinds.shared.verdict_words import closed_loop_words, games_words, latency_words, parity_words


def test_each_kind_says_its_figures_in_words():
    assert parity_words({"action_agreement": 56 / 60, "action_disagreements": 4.0, "parity_states": 60.0,
                         "max_abs_dq": 0.0441}, {"action_agreement"}) == \
        "56 of 60 fixed states take the same action (4 flipped), max |dQ| 0.0441"
    assert latency_words({"latency_p50_ms": 0.8123, "latency_p50_ratio": 0.97, "latency_p50_ratio_ci_high": 1.02,
                          "cpu_time_p95_ratio_ci_high": 1.05}, {"latency_p50_ratio_ci_high"}) == \
        ("P50 0.812 ms a call, 0.970x the baseline's (95% intervals: P50 (wall) up to 1.020x, P95 (CPU time) up "
         "to 1.050x)")
    assert closed_loop_words({"candidate_score": 4.0, "baseline_score": 8.0, "first_divergence_step": 17.0},
                             {"score_diff"}) == \
        "score 4 against 8 over the same steps, first different action at step 17"
    games = {"staged_games": 100.0, "distinct_paired_games": 4.0, "candidate_mean_score": 65.0,
             "baseline_mean_score": 106.94, "staged_mean_diff": -41.9, "staged_diff_ci_low": -80.1,
             "staged_diff_ci_high": -3.2, "staged_margin": 10.69, "candidate_time_limit_games": 2.0,
             "baseline_time_limit_games": 1.0}
    assert games_words(games, {"diff_plus_margin_ci_low"}) == (
        "mean score 65.0 against 106.9 over 100 games a runtime (4 distinct); difference -41.90, interval "
        "[-80.10, -3.20] against a margin of -10.69")
    assert games_words(games, {"stall_excess_ci_high"}) == \
        "2 games to the time limit against 1 over 100 games a runtime (4 distinct)"


def test_a_figure_that_is_missing_is_left_out():
    assert parity_words({}, set()) is None and latency_words({}, set()) is None
    assert closed_loop_words({"candidate_score": 3.0}, set()) is None
    assert games_words({"paired_episodes": 30.0, "candidate_mean_score": 5.0, "baseline_mean_score": 6.0}, set()) == \
        "mean score 5.0 against 6.0 over 30 games a runtime"
    assert latency_words({"latency_p50_ms": 1.5}, set()) == "P50 1.500 ms a call"
