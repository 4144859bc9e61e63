"""The names of the metrics a verdict on a `train` measurement may use, by what they judge."""

HEALTH_METRICS = ("finished", "weights_moved", "replay_fill_fraction", "epsilon_schedule_error",
                  "non_finite_diagnostics")
# a health figure over several training seeds is its worst seed's
WORST_OVER_SEEDS = {"finished": min, "weights_moved": min, "replay_fill_fraction": min,
                    "epsilon_schedule_error": max, "non_finite_diagnostics": max}
LEARNING_METRICS = ("last20_mean", "last20_median", "last20_trend", "transitions_per_s")  # means over seeds
INTERVALS = ("_ci_low", "_ci_high")
SCORE_METRICS = tuple(f"score_{name}{bound}" for name in ("mean", "iqm") for bound in ("",) + INTERVALS)
# comparisons over training seeds, judged by their intervals; the raw values are evidence only
EPISODE_DIFFERENCES = tuple(f"{name}_diff" for name in LEARNING_METRICS[:3])
COMPARED = ("score_mean_diff", "score_iqm_diff", "probability_of_improvement", "transitions_per_s_speedup")
COMPARISON_METRICS = tuple(name + bound for name in COMPARED for bound in INTERVALS)
SCORE_METRICS += tuple(name for name in COMPARISON_METRICS if not name.startswith("transitions_per_s"))
RAW_COMPARISONS = COMPARED + EPISODE_DIFFERENCES
METRIC_NAMES = HEALTH_METRICS + LEARNING_METRICS + SCORE_METRICS[:6] + COMPARISON_METRICS + RAW_COMPARISONS
ONE_SEED = "one training seed per arm"
