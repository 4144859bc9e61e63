"""The report sections of a training's stored rows: its curves, diagnostics and scores. A `train`
measurement shows them for its own run, `training_history` for an imported one."""

from __future__ import annotations

from runner.kinds.shared.episode_scores import gif_sections
from runner.report.section import Section


def training_sections(con, run_id: str, measurement: str) -> list[Section]:
    """The report of one training measurement of a run, by name: also how another kind shows
    a stored training (the shipped agent's history)."""
    from runner.report.html import MAX_CHART_POINTS, altair, table_html

    alt = altair()

    summary = con.execute(
        "SELECT s.trial, s.training_seed, s.episodes, s.last_episode_transition, s.last20_mean, s.last20_median, "
        "s.last20_trend, s.best_return, r.transitions, r.updates, r.wall_s, r.transitions_per_s "
        "FROM train_trial_summary s LEFT JOIN (SELECT * FROM train_results QUALIFY row_number() OVER (PARTITION BY "
        "run_id, measurement, trial, training_seed ORDER BY attempt DESC) = 1) r "
        "USING (run_id, measurement, trial, training_seed) WHERE s.run_id = ? AND s.measurement = ? "
        "ORDER BY s.trial, s.training_seed", [run_id, measurement]).df()
    sections = [Section(f"{measurement}: trials by training seed (training returns of the last 20 episodes; "
                        "trend = mean of last 10 − mean of the 10 before)", html=table_html(summary))]
    sections += _score_sections(con, run_id, measurement)
    curve = con.execute(
        "SELECT trial || ' · seed ' || training_seed AS run, trial, transition, episode_return, moving_avg_20 "
        "FROM train_curve WHERE run_id = ? AND measurement = ? ORDER BY trial, training_seed, transition",
        [run_id, measurement]).df()
    if not curve.empty:
        if len(curve) > MAX_CHART_POINTS:
            curve = curve.iloc[:: len(curve) // MAX_CHART_POINTS + 1]
        base = alt.Chart(curve).encode(x=alt.X("transition:Q", title="transitions"), color="run:N")
        chart = (base.mark_circle(size=12, opacity=0.25).encode(y=alt.Y("episode_return:Q", title="raw episode return"))
                 + base.mark_line(strokeWidth=2).encode(y="moving_avg_20:Q"))
        sections.append(Section(f"{measurement}: learning curves (points: episodes; lines: 20-episode moving average)",
                                charts=[chart.properties(width=720, height=320).to_dict()]))
    diagnostics = con.execute(
        "SELECT trial || ' · seed ' || training_seed AS run, transition, loss, q_mean, target_mean, td_abs_mean, "
        "td_abs_max, grad_norm, epsilon FROM train_diagnostics_valid WHERE run_id = ? AND measurement = ? "
        "ORDER BY trial, training_seed, transition", [run_id, measurement]).df()
    if not diagnostics.empty:
        long = diagnostics.melt(id_vars=["run", "transition"], var_name="quantity", value_name="value")
        chart = alt.Chart(long).mark_line().encode(
            x=alt.X("transition:Q", title="transitions"), y=alt.Y("value:Q", title=None), color="run:N"
        ).properties(width=330, height=140).facet(facet="quantity:N", columns=2).resolve_scale(y="independent")
        sections.append(Section(f"{measurement}: diagnostics over time", charts=[chart.to_dict()]))
    evaluated = con.execute(
        "SELECT policy AS checkpoint, episodes, distinct_scores, distinct_lengths, mean, median, std, p10, p90, "
        "min, max, time_limit_episodes FROM episode_summary WHERE run_id = ? AND measurement = ? "
        "ORDER BY split_part(policy, '@', 1), TRY_CAST(split_part(policy, '@', 2) AS BIGINT)",  # 25K before 100K
        [run_id, measurement]).df()
    if not evaluated.empty:
        sections.append(Section(f"{measurement}: checkpoints evaluated on fixed seeds (raw score, full games)",
                                html=table_html(evaluated)))
    return sections + gif_sections(con, run_id, measurement,
                                   f"{measurement}: checkpoints playing one fixed seed at epsilon 0 "
                                   "(what the agent sees)")


def _score_sections(con, run_id: str, measurement: str) -> list[Section]:
    """Each training's greedy score, and each trial's mean and IQM over training seeds with 95% CIs."""
    from breakout_core.statistics.stats import MIN_SEEDS_FOR_INTERVAL, seed_statistics
    from runner.report.html import table_html

    per_seed = con.execute(
        "SELECT trial, training_seed, transition, episodes, score, distinct_scores, distinct_lengths, "
        "time_limit_episodes FROM train_seed_scores WHERE run_id = ? AND measurement = ? ORDER BY trial, training_seed",
        [run_id, measurement]).df()
    if per_seed.empty:
        return []
    rows = []
    for trial, group in per_seed.groupby("trial", sort=False):
        stats = seed_statistics(group["score"].to_numpy())
        rows.append({"trial": trial, "training_seeds": len(group), **{k: round(v, 3) for k, v in stats.items()}})
    import pandas as pd

    return [Section(f"{measurement}: score of each training seed (its final checkpoint, greedy, mean raw score "
                    "over the score seeds)", html=table_html(per_seed)),
            Section(f"{measurement}: scores over training seeds (mean and IQM with 95% t intervals over "
                    f"seeds, the IQM's on the winsorized variance; no interval from fewer than "
                    f"{MIN_SEEDS_FOR_INTERVAL} seeds)", html=table_html(pd.DataFrame(rows)))]
