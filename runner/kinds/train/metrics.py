"""The metrics a verdict on a `train` measurement reads: health per training, learning per trial,
and scores and comparisons over training seeds."""

from __future__ import annotations

from runner.kinds.train.metric_names import LEARNING_METRICS, ONE_SEED, WORST_OVER_SEEDS
from runner.kinds.train.model import TrainMeasurement
from runner.kinds.train.trainings import Training
from runner.spec.sweeps import expand_sweep


def participants(m: TrainMeasurement) -> list[str]:
    return [t.name for t in expand_sweep(m.sweep)]


def _training_metrics(con, run_id: str, m: TrainMeasurement, training: Training) -> dict[str, float]:
    """Day 13's health checks and Day 14's learning figures for one (trial, training seed)."""
    found: dict[str, float] = {}
    where, args = "run_id = ? AND measurement = ? AND trial = ? AND training_seed = ?", [run_id, m.name, training.trial,
                                                                                         training.training_seed]
    result = con.execute(f"SELECT transitions, transitions_per_s, weights_moved FROM train_results WHERE {where} "
                         "ORDER BY attempt DESC LIMIT 1", args).fetchone()
    found["finished"] = 1.0 if result else 0.0
    if result:
        found["weights_moved"] = result[2]
        if result[1]:  # 0: the trainer measured nothing (an attempt that began at its last transition)
            found["transitions_per_s"] = result[1]
    config = m.training_config(training)
    diagnostics = con.execute(  # from_transition: where the row's attempt began, with an empty replay
        "SELECT d.transition, d.epsilon, d.replay_frames, d.loss, d.q_mean, d.target_mean, d.td_abs_mean, "
        "d.td_abs_max, d.grad_norm, a.from_transition FROM train_diagnostics_valid d JOIN train_attempts a "
        f"USING (run_id, measurement, trial, training_seed, attempt) WHERE {where} ORDER BY d.transition",
        args).fetchall()
    if diagnostics:
        import math

        last = diagnostics[-1]
        # the epsilon a diagnostics row reports was used on the step that reached its transition count
        slack = abs(config.epsilon_end - config.epsilon_start) * config.num_envs / config.epsilon_decay_transitions
        found["epsilon_schedule_error"] = max(
            max(0.0, abs(row[1] - config.epsilon(row[0])) - slack) for row in diagnostics)
        found["replay_fill_fraction"] = last[2] / min(config.replay_capacity, last[0] - last[9])
        found["non_finite_diagnostics"] = float(sum(
            1 for row in diagnostics for v in row[3:9] if v is None or not math.isfinite(v)))
    summary = con.execute(f"SELECT last20_mean, last20_median, last20_trend FROM train_trial_summary WHERE {where}",
                          args).fetchone()
    if summary:
        found.update({k: v for k, v in zip(("last20_mean", "last20_median", "last20_trend"), summary) if v is not None})
    score = con.execute(f"SELECT score FROM train_seed_scores WHERE {where}", args).fetchone()
    if score:
        found["score"] = score[0]
    return found


def _trial_metrics(con, run_id: str, m: TrainMeasurement, trial: str) -> tuple[dict[str, float], dict[str, list]]:
    """(the trial's figures over its training seeds, each per-seed figure by name)."""
    per_seed: dict[str, list] = {}
    for training in m.trainings():
        if training.trial == trial:
            for name, value in _training_metrics(con, run_id, m, training).items():
                per_seed.setdefault(name, []).append(value)
    seeds = len(m.training_seeds())
    found = {name: WORST_OVER_SEEDS[name](values) for name, values in per_seed.items()
             if name in WORST_OVER_SEEDS and len(values) == seeds}
    found.update({name: sum(values) / len(values) for name, values in per_seed.items() if name in LEARNING_METRICS})
    return found, per_seed


def metrics(con, run_id: str, m: TrainMeasurement, candidate: str, baseline: str | None) -> dict[str, float]:
    """A trial's health (its worst seed), its learning figures (means over seeds), its score over
    seeds with intervals, and against a baseline the differences of scores and the speed-up with
    their intervals over seeds. Fewer than MIN_SEEDS_FOR_INTERVAL seeds per arm: `inconclusive_reason`."""
    from breakout_core.statistics.stats import MIN_SEEDS_FOR_INTERVAL, seed_statistics

    found, mine = _trial_metrics(con, run_id, m, candidate)
    base_found, theirs = _trial_metrics(con, run_id, m, baseline) if baseline is not None else ({}, {})
    scores, rates = mine.get("score", []), mine.get("transitions_per_s", [])
    if scores:
        found.update({f"score_{k}": v for k, v in seed_statistics(scores).items()})
    if baseline is not None:
        for name in LEARNING_METRICS[:3]:
            if name in found and name in base_found:
                found[f"{name}_diff"] = found[name] - base_found[name]
        if scores and theirs.get("score"):
            both = seed_statistics(scores, theirs["score"], comparisons=("mean_diff", "iqm_diff",
                                                                           "probability_of_improvement"))
            found.update({(k if k.startswith("probability") else f"score_{k}"): v for k, v in both.items()
                          if k.startswith(("mean_diff", "iqm_diff", "probability"))})
        base_rates = theirs.get("transitions_per_s", [])
        if rates and base_rates:
            both = seed_statistics(rates, base_rates, comparisons=("speedup",))
            found.update({f"transitions_per_s_{k}": v for k, v in both.items() if k.startswith("speedup")})
    seeds = len(m.training_seeds())
    if seeds < MIN_SEEDS_FOR_INTERVAL:
        found["inconclusive_reason"] = (
            (ONE_SEED if baseline is not None else "one training seed") if seeds == 1 else
            f"{seeds} training seeds per arm: an interval over seeds needs at least {MIN_SEEDS_FOR_INTERVAL}")
    return found
