"""How `runner compare` reads two runs of a `train` measurement."""

from __future__ import annotations

import numpy as np

from runner.compare.rows import Row, RunSide, episode_rows, over_seeds, samples_row, scores_row

# -- runner compare ---------------------------------------------------------------------------

LAST_EPISODES = 20  # as the train_trial_summary view's last20_mean

def _agent(trial: str, training_seed: int, by_seed: bool) -> str:
    """A trained agent's label. Where either run trained several seeds, the seeds are the repeats,
    and each agent is named as a sweep over seed names it ("base,seed=42", "learning_rate=0.0001,
    seed=42"), whether its seed came from `seeds:` or from the sweep: the same agent pairs across
    both spellings, and two seeds' agents are never pooled. A row without its training seed (one
    stored without an attempt to take it from) keeps the seed its trial's name gives."""
    parts = trial.split(",")
    named = next((part.removeprefix("seed=") for part in parts if part.startswith("seed=")), None)
    seed = training_seed if training_seed is not None else named
    if not by_seed or seed is None:
        return trial
    rest = [part for part in parts if not part.startswith("seed=")]
    return f"{','.join(rest) or 'base'},seed={seed}"

def compare_train(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    name = m_a["name"]
    by_seed = any(m.get("seeds") is not None or "seed" in (m.get("sweep") or {}) for m in (m_a, m_b))
    rates, returns, scores = {}, {}, {}
    for label, side in (("A", a), ("B", b)):
        args = [side.run_id, name]
        scores[label] = {_agent(t, seed, by_seed): (np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.float64))
                         for t, seed, s, v in con.execute(
            "SELECT trial, training_seed, list(eval_seed ORDER BY eval_seed), list(score ORDER BY eval_seed) "
            "FROM train_scores WHERE run_id = ? AND measurement = ? GROUP BY ALL", args).fetchall()}
        rates[label] = {_agent(t, seed, by_seed): rate for t, seed, rate in con.execute(
            "SELECT trial, training_seed, arg_max(transitions_per_s, attempt) FROM train_results WHERE run_id = ? "
            "AND measurement = ? GROUP BY ALL", args).fetchall()}
        returns[label] = {_agent(t, seed, by_seed): np.asarray(v, dtype=np.float64) for t, seed, v in con.execute(
            "SELECT trial, training_seed, list(episode_return) FROM (SELECT trial, training_seed, episode_return, "
            "row_number() OVER (PARTITION BY trial, training_seed ORDER BY transition DESC, env_index DESC) AS back "
            "FROM train_episodes_valid WHERE run_id = ? AND measurement = ?) WHERE back <= ? GROUP BY ALL",
            [*args, LAST_EPISODES]).fetchall()}
    rows = []
    for trial in sorted({t for found in (rates, returns, scores) for side in found.values() for t in side}):
        rows.append(samples_row(name, f"trial {trial}", f"last{LAST_EPISODES}_return",
                                 returns["A"].get(trial, np.empty(0)), returns["B"].get(trial, np.empty(0)),
                                 lower_is_better=False, machine_bound=False,
                                 note="consecutive training episodes of one trial, not independent seeds"))
        if trial in scores["A"] and trial in scores["B"]:
            rows.append(scores_row(name, f"trial {trial}", "final_score", scores["A"][trial], scores["B"][trial], {},
                                    note="the final checkpoint's greedy episodes on the score seeds: one training "
                                         "seed's agent, not the training's spread over seeds"))
        elif trial in scores["A"] or trial in scores["B"]:
            rows.append(Row(name, f"trial {trial}", "final_score", None, None, False, "", None,
                            problem=f"scored only in run {'A' if trial in scores['A'] else 'B'}"))
        rate_a, rate_b = rates["A"].get(trial), rates["B"].get(trial)
        rows.append(samples_row(name, f"trial {trial}", "transitions_per_s",
                                 np.asarray([] if rate_a is None else [rate_a]),
                                 np.asarray([] if rate_b is None else [rate_b]), lower_is_better=False,
                                 machine_bound=True))
    rows += over_seeds(name, f"last{LAST_EPISODES}_mean", *[{t: float(v.mean()) for t, v in returns[label].items()}
                                                            for label in "AB"], lower_is_better=False,
                        machine_bound=False)
    rows += over_seeds(name, "score_mean", *[{t: float(v.mean()) for t, (_, v) in scores[label].items()}
                                              for label in "AB"],
                        lower_is_better=False, machine_bound=False)
    rows += over_seeds(name, "transitions_per_s", rates["A"], rates["B"], lower_is_better=False, machine_bound=True)
    return rows + episode_rows(con, a, b, m_a, lambda _checkpoint: None)
