"""Full games in stages against a baseline until a non-inferiority decision or the cap: the
staged mode of the `episodes` kind.

Its seeds are the cap, taken in order, `games` at a time: every runtime and the baseline play
the same seeds of a stage, the games land in the shared `episodes` table as any others, and
after each stage every candidate still undecided gets one look of
breakout_core.statistics.sequential's group-sequential test on its paired differences so far (alpha
spent over the planned looks, at least breakout_core.statistics.sequential.MIN_LOOKS of them). A
candidate that decides stops; the baseline plays on while any candidate goes on. Every look
is a row of `episode_looks`.

The margin is either score points or a fraction of the baseline's mean over the same games
so far (10% by default), computed afresh at each look and stored with it. Verdicts read the
last look: `diff_plus_margin_ci_low > 0` is non-inferiority, and the cap reached without a
decision is inconclusive with the figures, never decided on them. Beside the decision stand
the robust figures of its differences (episode_scores.robust_figures) and, where removing
one game alone would change it, which game and what it would become.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Callable

from pydantic import Field, model_validator

from runner.kinds.shared.episode_scores import distinct_games
from runner.kinds.shared.runtime_lifecycle import open_runtime
from runner.kinds.shared.runtime_status import found_unavailable
from runner.spec.fields import StrictModel

if TYPE_CHECKING:
    from runner.report.section import Section
    from runner.run.context import RunContext

DEFAULT_MARGIN_FRACTION = 0.1
DECISIONS = ("non-inferior", "inferior", "continue", "inconclusive")  # breakout_core.statistics.sequential's


class StagesSpec(StrictModel):
    games: int = Field(ge=2, le=10_000, description="games per stage, every runtime on the same seeds; "
                       "the measurement's seeds are the cap")
    margin: float | None = Field(default=None, gt=0, description="the largest mean score loss still non-inferior, in "
                                 "score points; default: margin_fraction of the baseline's mean")
    margin_fraction: float | None = Field(default=None, gt=0, lt=1, description="the margin as a fraction of the "
                                          f"baseline's mean over the same games (default {DEFAULT_MARGIN_FRACTION})")
    alpha: float = Field(default=0.05, gt=0, lt=0.5, description="the chance that any look's interval misses, at most")

    @model_validator(mode="after")
    def _one_margin(self) -> "StagesSpec":
        if self.margin is not None and self.margin_fraction is not None:
            raise ValueError("give margin (score points) or margin_fraction (of the baseline's mean), not both")
        return self

    @property
    def fraction(self) -> float | None:
        """The margin's fraction of the baseline's mean; None where the margin is in points."""
        if self.margin is not None:
            return None
        return self.margin_fraction if self.margin_fraction is not None else DEFAULT_MARGIN_FRACTION

    def plan(self, seed_count: int):
        """The sequential test's plan for `seed_count` seeds (the cap) in these stages."""
        from breakout_core.statistics.sequential import SequentialPlan

        return SequentialPlan(margin=self.margin, stage_games=self.games, max_games=seed_count, alpha=self.alpha)

    def described(self) -> str:
        return (f"{self.margin:g} score points" if self.margin is not None
                else f"{self.fraction:.0%} of the baseline's mean over the same games")


def stages_problem(stages: StagesSpec, seed_count: int) -> str | None:
    """Why `seed_count` seeds cannot be played in these stages (None: they can)."""
    from breakout_core.statistics.sequential import MIN_LOOKS

    looks = -(-seed_count // stages.games)
    if looks < MIN_LOOKS:
        return (f"{seed_count} seeds in stages of {stages.games} games are {looks} look(s); the staged test plans "
                f"at least {MIN_LOOKS} (the seeds are the cap: give more seeds or smaller stages)")
    return None


MIGRATIONS = [
    (
        "0460_episode_looks",
        """
        CREATE TABLE episode_looks (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL,
            candidate VARCHAR NOT NULL, baseline VARCHAR NOT NULL,
            stage INTEGER NOT NULL, games INTEGER NOT NULL, max_games INTEGER NOT NULL, planned_looks INTEGER NOT NULL,
            candidate_mean DOUBLE NOT NULL, baseline_mean DOUBLE NOT NULL, mean_diff DOUBLE NOT NULL,
            sd_diff DOUBLE NOT NULL, ci_low DOUBLE NOT NULL, ci_high DOUBLE NOT NULL, confidence DOUBLE NOT NULL,
            margin DOUBLE NOT NULL,
            decision VARCHAR NOT NULL CHECK (decision IN ('non-inferior', 'inferior', 'continue', 'inconclusive'))
        );
        """,
    )
]

METRIC_NAMES = ("staged_games", "staged_looks", "staged_mean_diff", "staged_diff_ci_low", "staged_diff_ci_high",
                "staged_margin", "diff_plus_margin_ci_low", "diff_plus_margin_ci_high")

INTERVAL_METRICS = ("staged_diff_ci_low", "staged_diff_ci_high", "diff_plus_margin_ci_low", "diff_plus_margin_ci_high")

# (runtime name, the loaded runtime, the seeds of one stage, the progress task it advances a game at a time)
PlayStage = Callable[[str, object, list[int], int], None]


def play_in_stages(m, ctx: "RunContext", seeds: list[int], play: PlayStage) -> None:
    """Play `m`'s runtimes in stages of `m.stages.games` seeds until each candidate decides
    or the seeds run out, storing a look per candidate and stage. On --resume, the games and
    looks already stored are kept, and the test is recomputed from them."""
    from breakout_core.statistics.sequential import CONTINUE, SequentialTest

    stages: StagesSpec = m.stages
    plan = stages.plan(len(seeds))
    baseline = m.baseline_runtime
    if found_unavailable(ctx, m.name, baseline):
        return
    candidates = [r for r in m.ordered_runtimes()[1:] if not found_unavailable(ctx, m.name, r)]
    tests = {c: SequentialTest(plan) for c in candidates}
    stored_games, stored_looks = _stored(ctx, m.name)
    with contextlib.ExitStack() as stack:
        # every runtime is opened before a game is played: one unavailable here (recorded in
        # runtime_status) plays nothing, and no stage is played for a test that cannot be made
        loaded = {name: stack.enter_context(open_runtime(ctx, m.name, name)) for name in [baseline, *candidates]}
        candidates = [c for c in candidates if loaded[c] is not None]
        if loaded[baseline] is None or not candidates:
            return
        task = ctx.progress.add_task(f"{m.name} · games in stages of {stages.games}",
                                     total=len(seeds) * (1 + len(candidates)), unit="games")
        for stage, start in enumerate(range(0, len(seeds), stages.games), start=1):
            block = seeds[start:start + stages.games]
            active = [c for c in candidates if tests[c].decision == CONTINUE]
            if not active:
                break
            for name in [baseline, *active]:
                if stored_games.get(name, set()).issuperset(block):
                    ctx.progress.advance(task, len(block))
                    continue
                play(name, loaded[name], block, task)
            for candidate in active:
                look = _look(ctx, m, tests[candidate], candidate, baseline, seeds[:start + len(block)], block)
                if (candidate, stage) not in stored_looks:
                    ctx.store.append_rows("episode_looks", [look])
        played = next(t for t in ctx.progress.tasks if t.id == task).completed
        ctx.progress.update(task, total=played)  # the bar ends where the test stopped


def _stored(ctx: "RunContext", measurement: str) -> tuple[dict[str, set[int]], set[tuple[str, int]]]:
    """On --resume: the seeds each runtime has played and the looks stored; nothing otherwise."""
    if not ctx.resume:
        return {}, set()
    with ctx.store.reader() as con:
        games = con.execute("SELECT policy, list(seed) FROM episodes WHERE run_id = ? AND measurement = ? "
                            "GROUP BY policy", [ctx.run_id, measurement]).fetchall()
        looks = con.execute("SELECT candidate, stage FROM episode_looks WHERE run_id = ? AND measurement = ?",
                            [ctx.run_id, measurement]).fetchall()
    return {policy: set(played) for policy, played in games}, {(c, s) for c, s in looks}


def _scores(ctx: "RunContext", measurement: str, policy: str, seeds: list[int]):
    import numpy as np

    with ctx.store.reader() as con:
        found = dict(con.execute("SELECT seed, score FROM episodes WHERE run_id = ? AND measurement = ? AND policy = ? "
                                 "AND list_contains(?, seed)", [ctx.run_id, measurement, policy, seeds]).fetchall())
    return np.array([found[s] for s in seeds], dtype=np.float64)


def _look(ctx: "RunContext", m, test, candidate: str, baseline: str, so_far: list[int], block: list[int]) -> dict:
    """Add one stage's differences to `test` and return the look's row."""
    candidate_scores, baseline_scores = (_scores(ctx, m.name, p, so_far) for p in (candidate, baseline))
    fraction = m.stages.fraction
    margin = None if fraction is None else max(0.0, fraction * float(baseline_scores.mean()))
    stage = slice(len(so_far) - len(block), len(so_far))
    look = test.add(candidate_scores[stage] - baseline_scores[stage], margin=margin)
    return {"run_id": ctx.run_id, "measurement": m.name, "candidate": candidate, "baseline": baseline,
            "stage": look.stage, "games": look.n, "max_games": test.plan.max_games, "planned_looks": test.plan.looks,
            "candidate_mean": float(candidate_scores.mean()), "baseline_mean": float(baseline_scores.mean()),
            "mean_diff": look.mean, "sd_diff": look.sd, "ci_low": look.low, "ci_high": look.high,
            "confidence": look.confidence, "margin": look.margin, "decision": look.decision}


def staged_metrics(con, run_id: str, measurement: str, candidate: str, baseline: str) -> dict:
    """The last look of candidate against baseline, and which single game's removal would change
    its decision; when it decided nothing, the reason a verdict that straddles its threshold
    gives for being inconclusive."""
    from breakout_core.statistics.sequential import INTERVAL_METHOD

    row = con.execute(
        "SELECT stage, games, max_games, planned_looks, mean_diff, sd_diff, ci_low, ci_high, confidence, margin, "
        "decision, candidate_mean, baseline_mean FROM episode_looks WHERE run_id = ? AND measurement = ? "
        "AND candidate = ? AND baseline = ? ORDER BY stage DESC LIMIT 1",
        [run_id, measurement, candidate, baseline]).fetchone()
    if row is None:
        return {}
    stage, games, cap, looks, mean, sd, low, high, confidence, margin, decision, c_mean, b_mean = row
    found = {"staged_games": float(games), "staged_looks": float(stage), "staged_mean_diff": mean,
             "staged_diff_ci_low": low, "staged_diff_ci_high": high, "staged_margin": margin,
             "diff_plus_margin_ci_low": low + margin, "diff_plus_margin_ci_high": high + margin,
             "candidate_mean_score": c_mean, "baseline_mean_score": b_mean, "staged_decision": decision,
             "interval_method": f"{INTERVAL_METHOD}: {confidence:.6%} at look {stage} of {looks} planned"}
    fragile = _fragility(con, run_id, measurement, candidate, baseline,
                         (stage, games, cap, mean, sd, low, high, confidence, margin, decision))
    if fragile:
        found["fragility"] = fragile
    figures = (f"mean difference {mean:+.2f}, {confidence:.4%} interval [{low:.2f}, {high:.2f}] against a margin of "
               f"-{margin:.2f} after {games} games a runtime in {stage} look(s)")
    stage_games = -(-cap // looks)
    distinct = distinct_games(con, run_id, measurement, candidate, baseline) if _replays_starts(con, run_id) \
        else stage_games
    if decision in ("inconclusive", "continue"):
        found["undecided_metrics"] = INTERVAL_METRICS
        found["undecided_reason"] = (f"the cap of {cap} games was reached without a decision: {figures}"
                                     if decision == "inconclusive" else
                                     f"the staged games stopped before the cap of {cap} games, undecided: {figures}")
    elif distinct < stage_games:  # neither way: the interval's games are not the independent games it counts
        for metric in INTERVAL_METRICS:
            del found[metric]
        found["inconclusive_reason"] = (
            f"the {games} games a runtime are only {distinct} distinct games (the same start played again: this "
            f"contract's games are deterministic from their start), fewer than a stage of {stage_games} the plan "
            f"counts as independent; the test said {decision}: {figures}")
    return found



def _replays_starts(con, run_id: str) -> bool:
    """Whether the run's contract plays a game as a function of its start (no sticky actions), so
    that two seeds may play one game; with sticky actions every seed's game is its own."""
    row = con.execute("SELECT CAST(contract->>'$.repeat_action_probability' AS DOUBLE) FROM runs WHERE run_id = ?",
                      [run_id]).fetchone()
    return row is not None and row[0] == 0.0


def _fragility(con, run_id: str, measurement: str, candidate: str, baseline: str, last: tuple) -> str | None:
    """A line naming the games whose removal alone would change the last look's decision (the
    same confidence and margin over the others); None where no single game would."""
    import numpy as np

    from breakout_core.statistics.sequential import Look, fragile_games

    stage, games, cap, mean, sd, low, high, confidence, margin, decision = last
    pairs = con.execute("SELECT seed, diff FROM episode_pairs WHERE run_id = ? AND measurement = ? AND candidate = ? "
                        "AND baseline = ? ORDER BY seed", [run_id, measurement, candidate, baseline]).fetchall()
    if len(pairs) != games:  # the stored games are not the look's (a look that was not stored): nothing to say
        return None
    look = Look(stage=stage, n=games, mean=mean, sd=sd, low=low, high=high, confidence=confidence, margin=margin,
                decision=decision)
    changed = fragile_games(np.array([d for _, d in pairs]), look, at_cap=games >= cap)
    if not changed:
        return None
    shown = ", ".join(f"seed {pairs[i][0]} ({pairs[i][1]:+g}) -> {becomes}" for i, becomes in changed[:5])
    more = ", ..." if len(changed) > 5 else ""
    return (f"fragile: removing any one of {len(changed)} of the {games} games alone would change {decision}: "
            f"{shown}{more}")


def looks_report(con, run_id: str, measurement: str, stages: StagesSpec) -> "list[Section]":
    """The looks as a table, and each candidate's interval against games played with its margin."""
    from runner.report.html import altair, table_html
    from runner.report.section import Section

    looks = con.execute("SELECT candidate, baseline, stage, games, candidate_mean, baseline_mean, mean_diff, sd_diff, "
                        "ci_low, ci_high, confidence, margin, decision FROM episode_looks WHERE run_id = ? AND "
                        "measurement = ? ORDER BY candidate, stage", [run_id, measurement]).df()
    if looks.empty:
        return []
    alt = altair()
    looks["minus_margin"] = -looks["margin"]
    base = alt.Chart(looks).encode(x=alt.X("games:Q", title="games a runtime"), color=alt.Color("candidate:N"))
    chart = (base.mark_rule(strokeWidth=3).encode(y=alt.Y("ci_low:Q", title="mean paired difference"), y2="ci_high:Q")
             + base.mark_point(filled=True, size=60).encode(y="mean_diff:Q", tooltip=list(looks.columns))
             + base.mark_line(strokeDash=[4, 4]).encode(y="minus_margin:Q"))
    return [Section(f"{measurement}: looks after each stage of {stages.games} games (margin: {stages.described()}; "
                    "non-inferior once an interval's low end is above minus the margin, dashed)",
                    html=table_html(looks.drop(columns="minus_margin")),
                    charts=[chart.properties(width=640).to_dict()])]
