"""`evaluate`: policies play full games on fixed episode seeds; raw scores per episode.

Table `episodes` holds one row per episode; view `episode_summary` the distribution per
policy (std is the sample std, percentiles interpolate linearly like numpy's default);
view `episode_pairs` the same-seed differences that verdicts bootstrap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from runner.kinds.base import Kind, RunContext, Section
from runner.spec_base import MAX_SEED, Name, Seeds, StrictModel, seed_list


class GifSpec(StrictModel):
    policy: Name
    seed: int = Field(ge=0, le=MAX_SEED)


class BootstrapSpec(StrictModel):
    confidence: float = Field(default=0.95, gt=0.5, lt=1.0)
    resamples: int = Field(default=10_000, ge=1_000, le=1_000_000)
    seed: int = 0


class EvaluateMeasurement(StrictModel):
    kind: Literal["evaluate"]
    name: Name
    policies: list[Name] = Field(min_length=1, description="names from the spec's policies")
    seeds: Seeds = Field(description="episode seeds: a list, or {start, count}")
    batch_size: int = Field(default=4, ge=1, le=256, description="episodes played side by side")
    policy_seed: int = Field(default=0, ge=0, description="seeds each episode's action randomness with the episode seed")
    gif: GifSpec | None = None
    bootstrap: BootstrapSpec = BootstrapSpec()

    @model_validator(mode="after")
    def _consistent(self) -> "EvaluateMeasurement":
        if len(set(self.policies)) != len(self.policies):
            raise ValueError("policies must be distinct")
        if self.gif is not None:
            if self.gif.policy not in self.policies:
                raise ValueError(f"gif.policy {self.gif.policy!r} is not one of this measurement's policies")
            if self.gif.seed not in seed_list(self.seeds):
                raise ValueError(f"gif.seed {self.gif.seed} is not one of this measurement's seeds")
        return self


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

METRIC_NAMES = (
    "candidate_mean_score",
    "baseline_mean_score",
    "mean_score_diff",
    "paired_score_diff_ci_low",
    "paired_score_diff_ci_high",
    "candidate_time_limit_fraction",
)


def build_policy(policy_spec, name: str):
    from breakout_core.policies import QNetworkPolicy, RandomPolicy

    if policy_spec.type == "random":
        return RandomPolicy()
    policy = QNetworkPolicy.from_checkpoint(policy_spec.path, epsilon=policy_spec.epsilon)
    policy.name = name
    return policy


def execute(m: EvaluateMeasurement, ctx: RunContext) -> None:
    from breakout_core.driver import EpisodeDriver

    seeds = seed_list(m.seeds)
    driver = EpisodeDriver(ctx.contract, min(m.batch_size, len(seeds)))  # one driver serves every policy
    for policy_name in m.policies:
        if not (ctx.resume and _already_stored(ctx, m.name, policy_name)):
            _evaluate_policy(m, ctx, policy_name, seeds, driver)


def _evaluate_policy(m: EvaluateMeasurement, ctx: RunContext, policy_name: str, seeds: list[int], driver) -> None:
    from breakout_core.evaluator import evaluate, write_gif

    policy = build_policy(ctx.spec.policies[policy_name], policy_name)
    task = ctx.progress.add_task(f"{m.name} · {policy_name}", total=len(seeds), unit="episodes")
    made = [0]

    def on_step(n: int) -> None:
        made[0] += n
        if made[0] % 256 < n:  # redraw now and then, not every step
            ctx.progress.update(task, transitions=made[0])

    record_seed = m.gif.seed if m.gif is not None and m.gif.policy == policy_name else None
    result = evaluate(
        policy,
        seeds,
        ctx.contract,
        batch_size=m.batch_size,
        policy_seed=m.policy_seed,
        record_seed=record_seed,
        on_step=on_step,
        on_episode=lambda _episode: ctx.progress.advance(task),
        driver=driver,
    )
    ctx.store.append_rows("episodes", [episode_row(ctx, m.name, policy_name, e) for e in result.episodes])
    if result.frames:
        path = write_gif(result.frames, ctx.reports_dir / "gifs" / f"{ctx.run_id}-{m.name}-{policy_name}-{record_seed}.gif")
        episode = next(e for e in result.episodes if e.seed == record_seed)
        ctx.store.append_rows("artifacts", [gif_row(ctx, m.name, path, policy_name, episode, len(result.frames))])


def _already_stored(ctx: RunContext, measurement: str, policy: str) -> bool:
    with ctx.store.reader() as con:
        return con.execute("SELECT count(*) FROM episodes WHERE run_id = ? AND measurement = ? AND policy = ?",
                           [ctx.run_id, measurement, policy]).fetchone()[0] > 0


def gif_row(ctx: RunContext, measurement: str, path: Path, subject: str, episode, frames: int) -> dict:
    """The artifacts row of a GIF of `episode`, labelled with its result and, when the GIF
    holds only the episode's first GIF_MAX_FRAMES steps, with that."""
    from breakout_core.evaluator import GIF_MAX_FRAMES

    cut = f"; the GIF shows its first {GIF_MAX_FRAMES} steps" if frames > GIF_MAX_FRAMES else ""
    return {"run_id": ctx.run_id, "measurement": measurement, "path": str(path), "bytes": path.stat().st_size,
            "label": f"{subject}, seed {episode.seed}: score {episode.score:g} in {episode.steps} steps "
                     f"({episode.ended_by}){cut}"}


def episode_row(ctx: RunContext, measurement: str, policy: str, e) -> dict:
    noop, fire, right, left = e.action_counts
    return {
        "run_id": ctx.run_id, "measurement": measurement, "policy": policy, "seed": e.seed,
        "score": e.score, "steps": e.steps, "frames": e.frames, "ended_by": e.ended_by,
        "action_noop": noop, "action_fire": fire, "action_right": right, "action_left": left,
        "wall_s": e.wall_s, "contract_hash": ctx.contract.hash,
    }


def metrics(con, run_id: str, m: EvaluateMeasurement, candidate: str, baseline: str) -> dict[str, float]:
    from breakout_core.stats import paired_bootstrap_ci

    summary = {
        row[0]: row[1:]
        for row in con.execute(
            "SELECT policy, mean, episodes, time_limit_episodes, distinct_scores FROM episode_summary "
            "WHERE run_id = ? AND measurement = ? AND policy IN (?, ?)",
            [run_id, m.name, candidate, baseline],
        ).fetchall()
    }
    diffs = con.execute(
        "SELECT diff FROM episode_pairs WHERE run_id = ? AND measurement = ? AND candidate = ? AND baseline = ? ORDER BY seed",
        [run_id, m.name, candidate, baseline],
    ).fetchnumpy()["diff"]
    if candidate not in summary or baseline not in summary or len(diffs) < 2:
        return {}
    interval = paired_bootstrap_ci(diffs, confidence=m.bootstrap.confidence, n_resamples=m.bootstrap.resamples, seed=m.bootstrap.seed)
    return {
        "candidate_mean_score": summary[candidate][0],
        "baseline_mean_score": summary[baseline][0],
        "mean_score_diff": float(diffs.mean()),
        "paired_score_diff_ci_low": interval.low,
        "paired_score_diff_ci_high": interval.high,
        "candidate_time_limit_fraction": summary[candidate][2] / summary[candidate][1],
        "paired_episodes": float(len(diffs)),
        "candidate_distinct_scores": float(summary[candidate][3]),
        "baseline_distinct_scores": float(summary[baseline][3]),
        "interval_method": f"{interval.method} interval of the mean paired difference, {interval.confidence:.0%}, "
        f"{interval.n_resamples} resamples, seed {interval.seed}",
    }


def report(con, run_id: str, m: EvaluateMeasurement) -> list[Section]:
    from runner.report_html import MAX_CHART_POINTS, altair, gif_figure, table_html

    alt = altair()

    summary = con.execute(
        "SELECT policy, episodes, distinct_scores, distinct_lengths, mean, median, std, p10, p90, min, max, mean_steps, time_limit_episodes "
        "FROM episode_summary WHERE run_id = ? AND measurement = ? ORDER BY policy",
        [run_id, m.name],
    ).df()
    episodes = con.execute(
        "SELECT policy, seed, score, steps, ended_by FROM episodes WHERE run_id = ? AND measurement = ? "
        "ORDER BY policy, seed LIMIT ?",  # chart points; the summary table uses every row
        [run_id, m.name, MAX_CHART_POINTS],
    ).df()
    sections = [Section(f"{m.name}: score distribution per policy (raw Atari score, full games)", html=table_html(summary))]
    if episodes.empty:
        return sections
    strip = alt.Chart(episodes).mark_circle(size=40, opacity=0.6).encode(
        x=alt.X("score:Q", title="raw score"),
        y=alt.Y("policy:N", title=None),
        yOffset=alt.YOffset("jitter:Q"),
        tooltip=["policy", "seed", "score", "steps", "ended_by"],
    ).transform_calculate(jitter="random()")
    box = alt.Chart(episodes).mark_boxplot(extent="min-max", opacity=0.3).encode(x="score:Q", y="policy:N")
    sections.append(Section(f"{m.name}: episodes (strip) and box per policy", charts=[(box + strip).properties(width=640).to_dict()]))
    baseline = m.policies[0]
    pairs = con.execute(
        "SELECT candidate, baseline, seed, diff FROM episode_pairs WHERE run_id = ? AND measurement = ? AND baseline = ? "
        "ORDER BY candidate, seed LIMIT ?",  # chart points; intervals use every row
        [run_id, m.name, baseline, MAX_CHART_POINTS],
    ).df()
    if not pairs.empty:
        rows = []
        for candidate, group in pairs.groupby("candidate"):
            found = metrics(con, run_id, m, candidate, baseline)
            if found:
                rows.append({"pair": f"{candidate} − {baseline}", "mean": found["mean_score_diff"],
                             "low": found["paired_score_diff_ci_low"], "high": found["paired_score_diff_ci_high"]})
        pairs["pair"] = pairs["candidate"] + " − " + pairs["baseline"]
        points = alt.Chart(pairs).mark_circle(size=35, opacity=0.5).encode(
            x=alt.X("diff:Q", title="same-seed score difference"), y=alt.Y("pair:N", title=None), tooltip=["seed", "diff"]
        )
        chart = points
        if rows:
            import pandas as pd

            intervals = pd.DataFrame(rows)
            chart = points + alt.Chart(intervals).mark_rule(strokeWidth=3, color="black").encode(
                x="low:Q", x2="high:Q", y="pair:N") + alt.Chart(intervals).mark_tick(color="red", thickness=3, size=18).encode(
                x="mean:Q", y="pair:N")
        zero = alt.Chart().mark_rule(strokeDash=[4, 4], color="gray").encode(x=alt.datum(0))
        sections.append(Section(
            f"{m.name}: paired differences against {baseline} (mean in red, {m.bootstrap.confidence:.0%} bootstrap CI in black)",
            charts=[alt.layer(chart, zero).properties(width=640).to_dict()],
        ))
    gifs = con.execute("SELECT label, path FROM artifacts WHERE run_id = ? AND measurement = ? ORDER BY label",
                       [run_id, m.name]).fetchall()
    if gifs:
        sections.append(Section(f"{m.name}: one episode as the agent sees it (84×84)",
                                html="".join(gif_figure(label, path) for label, path in gifs)))
    return sections


KIND = Kind(
    name="evaluate",
    model=EvaluateMeasurement,
    migrations=MIGRATIONS,
    views=VIEWS,
    execute=execute,
    participants=lambda m: list(m.policies),
    metric_names=METRIC_NAMES,
    metrics=metrics,
    report=report,
)
