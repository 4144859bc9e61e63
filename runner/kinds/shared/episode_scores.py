"""The `episodes` table: full games on fixed seeds, one row per episode, written by the
`evaluate` kind (policies), the `episodes` kind (runtimes) and a training's checkpoint
evaluations; this module owns it, its views and what is computed from them.

View `episode_summary` holds the distribution per policy (std is the sample std,
percentiles interpolate linearly like numpy's default); view `episode_pairs` the same-seed
differences that verdicts bootstrap.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import Field

from runner.spec.fields import StrictModel
from runner.store import schema

if TYPE_CHECKING:
    from runner.report.section import Section
    from runner.run.context import RunContext


class BootstrapSpec(StrictModel):
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    resamples: int = Field(default=10_000, ge=1_000, le=1_000_000)
    seed: int = 0


MIGRATIONS = [
    (
        "0100_episodes",
        """
        CREATE TABLE episodes (
            run_id VARCHAR NOT NULL,
            measurement VARCHAR NOT NULL,
            policy VARCHAR NOT NULL,
            seed BIGINT NOT NULL,
            score DOUBLE NOT NULL,
            steps INTEGER NOT NULL,
            frames INTEGER NOT NULL,
            ended_by VARCHAR NOT NULL CHECK (ended_by IN ('game_over', 'time_limit')),
            action_noop INTEGER NOT NULL,
            action_fire INTEGER NOT NULL,
            action_right INTEGER NOT NULL,
            action_left INTEGER NOT NULL,
            wall_s DOUBLE NOT NULL,
            contract_hash VARCHAR NOT NULL
        )
        """,
    )
]

VIEWS = [
    """
    CREATE OR REPLACE VIEW episode_summary AS
    SELECT run_id, measurement, policy,
           count(*) AS episodes,
           avg(score) AS mean, median(score) AS median, stddev_samp(score) AS std,
           quantile_cont(score, 0.1) AS p10, quantile_cont(score, 0.9) AS p90,
           min(score) AS min, max(score) AS max,
           avg(steps) AS mean_steps,
           count(*) FILTER (WHERE ended_by = 'time_limit') AS time_limit_episodes,
           -- how many different games the seeds gave: under breakout-v2 (no sticky actions) a seed
           -- only picks the no-op start, and 15 seeds can be one game 15 times
           count(DISTINCT score) AS distinct_scores, count(DISTINCT steps) AS distinct_lengths
    FROM episodes GROUP BY run_id, measurement, policy
    """,
    """
    CREATE OR REPLACE VIEW episode_pairs AS
    SELECT c.run_id, c.measurement, c.policy AS candidate, b.policy AS baseline, c.seed,
           c.score AS candidate_score, b.score AS baseline_score, c.score - b.score AS diff
    FROM episodes c JOIN episodes b
      ON c.run_id = b.run_id AND c.measurement = b.measurement AND c.seed = b.seed AND c.policy <> b.policy
    """,
]

schema.declare("episodes", MIGRATIONS, VIEWS)

# beside every games verdict's rules (its evidence, the report, `--json`): the same paired
# differences seen without the mean's sensitivity to a few games
ROBUST_FIGURES = ("paired_diff_median", "paired_diff_iqm", "identical_games_share", "fragility")

METRIC_NAMES = (  # what score_metrics() gives a verdict
    "candidate_mean_score",
    "baseline_mean_score",
    "mean_score_diff",
    "paired_score_diff_ci_low",
    "paired_score_diff_ci_high",
    "candidate_time_limit_fraction",
)


def gif_row(ctx: "RunContext", measurement: str, path: Path, subject: str, episode, frames: int) -> dict:
    """The artifacts row of a GIF of `episode`, labelled with its result and, when the GIF
    holds only the episode's first GIF_MAX_FRAMES steps, with that."""
    from breakout_core.evaluation.evaluator import GIF_MAX_FRAMES

    cut = f"; the GIF shows its first {GIF_MAX_FRAMES} steps" if frames > GIF_MAX_FRAMES else ""
    return {"run_id": ctx.run_id, "measurement": measurement, "path": str(path), "bytes": path.stat().st_size,
            "label": f"{subject}, seed {episode.seed}: score {episode.score:g} in {episode.steps} steps "
                     f"({episode.ended_by}){cut}"}


def episode_row(ctx: "RunContext", measurement: str, policy: str, e) -> dict:
    """An episode's row; its action columns count NOOP, FIRE, RIGHT and LEFT by name, so under the
    contract option full_action_space the other 14 actions are in none of them (steps less their sum)."""
    noop, fire, right, left = (e.action_counts[i] for i in ctx.contract.minimal_outputs())
    return {
        "run_id": ctx.run_id, "measurement": measurement, "policy": policy, "seed": e.seed,
        "score": e.score, "steps": e.steps, "frames": e.frames, "ended_by": e.ended_by,
        "action_noop": noop, "action_fire": fire, "action_right": right, "action_left": left,
        "wall_s": e.wall_s, "contract_hash": ctx.contract.hash,
    }


def robust_figures(diffs) -> dict[str, float]:
    """The median and interquartile mean (the mean of the middle half) of paired differences,
    and the share of seeds on which both played the same score."""
    import numpy as np
    from scipy import stats

    diffs = np.asarray(diffs, dtype=np.float64)
    return {"paired_diff_median": float(np.median(diffs)), "paired_diff_iqm": float(stats.trim_mean(diffs, 0.25)),
            "identical_games_share": float(np.mean(diffs == 0))}


def robust_figures_text(found: dict) -> str | None:
    """The robust figures of a verdict's evidence in one line; None where it has none."""
    if "paired_diff_median" not in found:
        return None
    text = (f"paired differences: median {found['paired_diff_median']:+.4g}, IQM {found['paired_diff_iqm']:+.4g}, "
            f"{found['identical_games_share']:.0%} of games identical")
    return f"{text}; {found['fragility']}" if found.get("fragility") else text


def distinct_games(con, run_id: str, measurement: str, candidate: str, baseline: str) -> int:
    """How many different paired games were played: pairs with the same score, length and action
    counts on both sides count once (under a contract without sticky actions a seed's game is a
    function of its no-op start, so many seeds replay a few games)."""
    game = ", ".join(f"{side}.{column}" for side in ("c", "b") for column in
                     ("score", "steps", "action_noop", "action_fire", "action_right", "action_left"))
    return con.execute(
        f"SELECT count(DISTINCT ({game})) FROM episodes c JOIN episodes b "
        "ON c.run_id = b.run_id AND c.measurement = b.measurement AND c.seed = b.seed "
        "WHERE c.run_id = ? AND c.measurement = ? AND c.policy = ? AND b.policy = ?",
        [run_id, measurement, candidate, baseline]).fetchone()[0]


def score_metrics(con, run_id: str, measurement: str, bootstrap: BootstrapSpec, candidate: str,
                  baseline: str) -> dict[str, float]:
    """Mean scores of both and the bootstrap interval of their same-seed differences ({} when
    either played no episodes or fewer than two seeds pair up)."""
    from breakout_core.statistics.stats import paired_bootstrap_ci

    summary = {
        row[0]: row[1:]
        for row in con.execute(
            "SELECT policy, mean, episodes, time_limit_episodes, distinct_scores FROM episode_summary "
            "WHERE run_id = ? AND measurement = ? AND policy IN (?, ?)",
            [run_id, measurement, candidate, baseline],
        ).fetchall()
    }
    diffs = con.execute(
        "SELECT diff FROM episode_pairs WHERE run_id = ? AND measurement = ? AND candidate = ? AND baseline = ? "
        "ORDER BY seed",
        [run_id, measurement, candidate, baseline],
    ).fetchnumpy()["diff"]
    if candidate not in summary or baseline not in summary or len(diffs) < 2:
        return {}
    interval = paired_bootstrap_ci(diffs, confidence=bootstrap.confidence, n_resamples=bootstrap.resamples,
                                   seed=bootstrap.seed)
    distinct = distinct_games(con, run_id, measurement, candidate, baseline)
    return {
        "candidate_mean_score": summary[candidate][0],
        "baseline_mean_score": summary[baseline][0],
        "mean_score_diff": float(diffs.mean()),
        "paired_score_diff_ci_low": interval.low,
        "paired_score_diff_ci_high": interval.high,
        "candidate_time_limit_fraction": summary[candidate][2] / summary[candidate][1],
        "paired_episodes": float(len(diffs)),
        "distinct_paired_games": float(distinct),
        "candidate_distinct_scores": float(summary[candidate][3]),
        "baseline_distinct_scores": float(summary[baseline][3]),
        **robust_figures(diffs),
        "interval_method": f"{interval.method} interval of the mean paired difference, {interval.confidence:.0%}, "
        f"{interval.n_resamples} resamples, seed {interval.seed}",
    }


def score_report(con, run_id: str, measurement: str, bootstrap: BootstrapSpec, baseline: str, *,
                 bootstrap_intervals: bool = True) -> "list[Section]":
    """The score distribution per player, the paired differences against `baseline` (with their
    bootstrap intervals unless `bootstrap_intervals` is False: games in stages have their own), and any GIF."""
    from runner.report.html import MAX_CHART_POINTS, altair, table_html
    from runner.report.section import Section

    alt = altair()

    summary = con.execute(
        "SELECT policy, episodes, distinct_scores, distinct_lengths, mean, median, std, p10, p90, min, max, "
        "mean_steps, time_limit_episodes FROM episode_summary WHERE run_id = ? AND measurement = ? ORDER BY policy",
        [run_id, measurement],
    ).df()
    episodes = con.execute(
        "SELECT policy, seed, score, steps, ended_by FROM episodes WHERE run_id = ? AND measurement = ? "
        "ORDER BY policy, seed LIMIT ?",  # chart points; the summary table uses every row
        [run_id, measurement, MAX_CHART_POINTS],
    ).df()
    sections = [Section(f"{measurement}: score distribution per policy (raw Atari score, full games)",
                        html=table_html(summary))]
    if episodes.empty:
        return sections
    strip = alt.Chart(episodes).mark_circle(size=40, opacity=0.6).encode(
        x=alt.X("score:Q", title="raw score"),
        y=alt.Y("policy:N", title=None),
        yOffset=alt.YOffset("jitter:Q"),
        tooltip=["policy", "seed", "score", "steps", "ended_by"],
    ).transform_calculate(jitter="random()")
    box = alt.Chart(episodes).mark_boxplot(extent="min-max", opacity=0.3).encode(x="score:Q", y="policy:N")
    sections.append(Section(f"{measurement}: episodes (strip) and box per policy",
                            charts=[(box + strip).properties(width=640).to_dict()]))
    pairs = con.execute(
        "SELECT candidate, baseline, seed, diff FROM episode_pairs WHERE run_id = ? AND measurement = ? "
        "AND baseline = ? ORDER BY candidate, seed LIMIT ?",  # chart points; intervals use every row
        [run_id, measurement, baseline, MAX_CHART_POINTS],
    ).df()
    if not pairs.empty:
        rows = []
        for candidate, group in (pairs.groupby("candidate") if bootstrap_intervals else ()):
            found = score_metrics(con, run_id, measurement, bootstrap, candidate, baseline)
            if found:
                rows.append({"pair": f"{candidate} − {baseline}", "mean": found["mean_score_diff"],
                             "low": found["paired_score_diff_ci_low"], "high": found["paired_score_diff_ci_high"]})
        pairs["pair"] = pairs["candidate"] + " − " + pairs["baseline"]
        points = alt.Chart(pairs).mark_circle(size=35, opacity=0.5).encode(
            x=alt.X("diff:Q", title="same-seed score difference"), y=alt.Y("pair:N", title=None),
            tooltip=["seed", "diff"])
        chart = points
        if rows:
            import pandas as pd

            intervals = pd.DataFrame(rows)
            chart = (points
                     + alt.Chart(intervals).mark_rule(strokeWidth=3, color="black").encode(
                         x="low:Q", x2="high:Q", y="pair:N")
                     + alt.Chart(intervals).mark_tick(color="red", thickness=3, size=18).encode(
                         x="mean:Q", y="pair:N"))
        zero = alt.Chart().mark_rule(strokeDash=[4, 4], color="gray").encode(x=alt.datum(0))
        shown = (f"mean in red, {bootstrap.confidence:.0%} bootstrap CI in black" if bootstrap_intervals
                 else "the staged looks above hold their intervals")
        sections.append(Section(
            f"{measurement}: paired differences against {baseline} ({shown})",
            charts=[alt.layer(chart, zero).properties(width=640).to_dict()],
        ))
    return sections + gif_sections(con, run_id, measurement, f"{measurement}: one episode as the agent sees it (84×84)")


def gif_sections(con, run_id: str, measurement: str, title: str) -> "list[Section]":
    """The measurement's GIFs (its `artifacts` rows, in path order) inlined under `title`; none
    where it stored none."""
    from runner.report.html import gif_figure
    from runner.report.section import Section

    gifs = con.execute("SELECT label, path FROM artifacts WHERE run_id = ? AND measurement = ? ORDER BY path",
                       [run_id, measurement]).fetchall()
    return [Section(title, html="".join(gif_figure(label, path) for label, path in gifs))] if gifs else []
