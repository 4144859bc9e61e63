"""`episodes` (Day 26): each runtime plays the same fixed episode seeds, greedy, full games.

The evaluator plays `batch_size` episodes side by side and asks the policy once per vector
step for every deciding slot; here the policy is the runtime itself, so each vector step is
one runtime.infer() of a (B, 4, 84, 84) batch. Rows land in the shared `episodes` table
(runner.kinds.shared.episode_scores) with policy = the runtime's name, so its views (`episode_summary`,
`episode_pairs`), its paired bootstrap metrics and its report serve unchanged.
`episode_inference` records how many inference calls and states each runtime needed, the
clock that timed them and the device that ran them (a software WebGPU adapter flagged);
`episode_inference_calls` holds each call's time inside the game loop, by the runtime's own
clock (`Runtime.CALL_TIMER`: the page's performance.now() for the browser): the candidate's P50
and P95 over all its calls, and over rounds (its calls in call order cut into blocks of
GAME_CALL_BLOCK, each block's P50 and P95, the interval of their geometric mean), and the ratio
of two runtimes' P95s. They are shown and decide nothing: a runtime's own time is the
machine's load of the moment (runtime_metrics.OWN_TIME_REASON), and the runtimes play their
games one after another, never in interleaved rounds, so the load each met is in neither's
figures. A latency measurement's interleaved rounds compare runtimes.

A verdict here may also use parity and latency metrics (action_agreement,
latency_p95_ratio_ci_high, ...) of the parity / latency measurements this one names: Day 26's
decision takes the three together. Trajectory divergence is no rule: the scores decide.

With `stages`, the seeds are a cap played in stages until a sequential non-inferiority
test decides (runner.kinds.shared.staged_games): its verdicts read the last look
(`diff_plus_margin_ci_low`, ...), not the bootstrap interval, which knows nothing of the looks.
"""

from __future__ import annotations

import time
from contextlib import closing
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator

from runner.compare.rows import Row, RunSide, episode_rows, runtime_problem, unavailable_rows
from runner.kinds.kind import Kind
from runner.kinds.shared import episode_scores, staged_games, stalls
from runner.kinds.shared.baseline_games import game_key, played_marks, reuse_games, reused_count
from runner.kinds.shared.drawn_seeds import played_seeds, seeds_report
from runner.kinds.shared.episode_scores import BootstrapSpec, episode_row, score_metrics, score_report
from runner.kinds.shared.runtime_lifecycle import RuntimePolicy, open_runtime
from runner.kinds.shared.runtime_metrics import (
    LATENCY_METRIC_NAMES,
    OWN_TIME_REASON,
    PARITY_METRIC_NAMES,
    latency_pair_metrics,
    latency_rule_problem,
    parity_pair_metrics,
)
from runner.kinds.shared.runtime_status import found_unavailable, runtime_sections, with_unavailable
from runner.kinds.shared.staged_games import StagesSpec, looks_report, play_in_stages, staged_metrics, stages_problem
from runner.kinds.shared.stalls import stall_metrics
from runner.kinds.shared.verdict_words import games_words
from runner.report.section import Section
from runner.run.context import RunContext
from runner.spec.fields import Name, PlayedSeeds, possible_seeds, seed_count
from runner.spec.runtimes import RuntimeMeasurement


class EpisodesMeasurement(RuntimeMeasurement):
    kind: Literal["episodes"]
    name: Name
    seeds: PlayedSeeds = Field(description="episode seeds: a list, {start, count}, or {drawn: N}: N seeds drawn "
                               "for the files of the runtimes other than the baseline")
    batch_size: int = Field(default=8, ge=1, le=256,
                            description="episodes played side by side (one inference per step)")
    bootstrap: BootstrapSpec = BootstrapSpec()
    parity: Name | None = Field(default=None, description="a parity measurement of this spec, for parity metrics")
    latency: Name | None = Field(default=None, description="a latency measurement of this spec, for latency metrics")
    stages: StagesSpec | None = Field(default=None, description="play the seeds in stages until a sequential "
                                      "non-inferiority test against the baseline decides, or the seeds run out")

    @field_validator("stages")
    @classmethod
    def _stages_fit(cls, stages: StagesSpec | None, info: ValidationInfo) -> StagesSpec | None:
        seeds = info.data.get("seeds")  # validated before stages; absent when they were refused
        if stages is not None and seeds is not None and (problem := stages_problem(stages, seed_count(seeds))):
            raise ValueError(problem)
        return stages

    def references(self):
        refs = super().references()
        if self.parity is not None:
            refs.append((("parity",), "measurement:parity", self.parity))
        if self.latency is not None:
            refs.append((("latency",), "measurement:latency", self.latency))
        return refs

    def metric_problem(self, metric: str) -> str | None:
        if metric in PARITY_METRIC_NAMES and self.parity is None:
            return f"{metric} is a parity metric: name the parity measurement with `parity:` in {self.name!r}"
        if metric in LATENCY_METRIC_NAMES and self.latency is None:
            return f"{metric} is a latency metric: name the latency measurement with `latency:` in {self.name!r}"
        if metric in LATENCY_METRIC_NAMES and (problem := latency_rule_problem(metric)):
            return problem
        if metric in GAME_CALL_METRIC_NAMES:
            return game_call_rule_problem(metric)
        if metric in staged_games.METRIC_NAMES and self.stages is None:
            return f"{metric} comes from games in stages: give `stages:` in {self.name!r}"
        if metric in BOOTSTRAP_INTERVAL and self.stages is not None:
            return (f"{metric} is a bootstrap interval that knows nothing of the looks of {self.name!r}'s stages: "
                    "use staged_diff_ci_low / staged_diff_ci_high or diff_plus_margin_ci_low")
        return None


MIGRATIONS = [
    (
        "0450_episode_inference",
        """
        CREATE TABLE episode_inference (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, runtime VARCHAR NOT NULL,
            episodes INTEGER NOT NULL, batch_size INTEGER NOT NULL, inference_calls BIGINT NOT NULL,
            states_inferred BIGINT NOT NULL, transitions BIGINT NOT NULL, wall_s DOUBLE NOT NULL,
            episodes_per_minute DOUBLE NOT NULL
        );
        """,
    ),
    (
        "0451_episode_inference_calls",
        """
        ALTER TABLE episode_inference ADD COLUMN call_timer VARCHAR;
        ALTER TABLE episode_inference ADD COLUMN device VARCHAR;
        ALTER TABLE episode_inference ADD COLUMN software_adapter BOOLEAN;
        CREATE TABLE episode_inference_calls (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, runtime VARCHAR NOT NULL,
            call INTEGER NOT NULL, states INTEGER NOT NULL, ms DOUBLE NOT NULL
        );
        """,
    ),
]

GAME_CALL_BLOCK = 100  # in-game calls per round: a block's P95 rests on 5 calls beyond it (min_calls_per_round)
GAME_CALL_METRIC_NAMES = ("candidate_game_call_p50_ms", "candidate_game_call_p95_ms", "baseline_game_call_p95_ms",
                          "game_call_p95_ratio") + tuple(f"candidate_game_call_{s}_ms_ci_{end}" for s in ("p50", "p95")
                                                         for end in ("low", "high"))  # shown, never a rule
METRIC_NAMES = (episode_scores.METRIC_NAMES + GAME_CALL_METRIC_NAMES + PARITY_METRIC_NAMES + LATENCY_METRIC_NAMES
                + staged_games.METRIC_NAMES + stalls.METRIC_NAMES)
BOOTSTRAP_INTERVAL = ("paired_score_diff_ci_low", "paired_score_diff_ci_high")


def execute(m: EpisodesMeasurement, ctx: RunContext) -> None:
    from breakout_core.game.driver import evaluation_driver

    seeds = played_seeds(ctx, m.name, m.seeds, candidate_files(m, ctx))
    if m.stages is not None:
        with closing(evaluation_driver(ctx.contract, m.batch_size, m.stages.games, len(m.runtimes))) as driver:
            play_in_stages(m, ctx, seeds, lambda name, runtime, block, task: _play_games(
                m, ctx, name, runtime, block, driver, task))
        return
    pending = [name for name in m.ordered_runtimes()
               if not (ctx.already_stored("episodes", m.name, policy=name) or found_unavailable(ctx, m.name, name))]
    if pending:
        with closing(evaluation_driver(ctx.contract, m.batch_size, len(seeds), len(pending))) as driver:
            for name in pending:  # one driver serves every runtime
                _play_runtime(m, ctx, name, seeds, driver)


def candidate_files(m: EpisodesMeasurement, ctx: RunContext) -> dict[str, str]:
    """The files whose sha256 keys drawn seeds: those of every runtime but the baseline."""
    spec = ctx.spec
    return {name: spec.artifacts[spec.runtimes[name].artifact].path for name in m.ordered_runtimes()[1:]}


def _play_runtime(m: EpisodesMeasurement, ctx: RunContext, name: str, seeds: list[int], driver) -> None:
    with open_runtime(ctx, m.name, name) as runtime:
        if runtime is None:
            return
        task = ctx.progress.add_task(f"{m.name} · {name}", total=len(seeds), unit="episodes")
        _play_games(m, ctx, name, runtime, seeds, driver, task)


def _play_games(m: EpisodesMeasurement, ctx: RunContext, name: str, runtime, seeds: list[int], driver, task) -> None:
    """One loaded runtime plays `seeds`, advancing the progress `task` a game at a time and
    adding to its transitions; its games, its inference counts and each call's time are stored.
    The baseline's games stored under the same key are copied instead (shared.baseline_games)."""
    from breakout_core.evaluation.evaluator import evaluate as play

    key = None
    if name == m.baseline_runtime:
        key, keyed_by = game_key(ctx, name, driver.num_slots)
        left = reuse_games(ctx, m.name, name, seeds, key, keyed_by)
        ctx.progress.advance(task, len(seeds) - len(left))
        if not (seeds := left):
            return
    policy = RuntimePolicy(runtime, name)
    made = [next(t for t in ctx.progress.tasks if t.id == task).fields["transitions"]]

    def on_step(n: int) -> None:
        made[0] += n
        if made[0] % 256 < n:
            ctx.progress.update(task, transitions=made[0])

    started = time.perf_counter()
    result = play(policy, seeds, ctx.contract, on_step=on_step, on_episode=lambda _e: ctx.progress.advance(task),
                  driver=driver)
    wall = time.perf_counter() - started
    with ctx.store.reader() as con:  # games in stages call this once a stage: calls are numbered on
        first_call = con.execute("SELECT count(*) FROM episode_inference_calls WHERE run_id = ? AND measurement = ? "
                                 "AND runtime = ?", [ctx.run_id, m.name, name]).fetchone()[0]
    # one transaction: a kill leaves all of these games' rows or none, so a resume replays none or all
    episodes = [episode_row(ctx, m.name, name, e) for e in result.episodes]
    ctx.store.append_together({
        "episodes": episodes,
        "episode_inference": [{
            "run_id": ctx.run_id, "measurement": m.name, "runtime": name, "episodes": len(seeds),
            "batch_size": driver.num_slots, "inference_calls": policy.calls, "states_inferred": policy.states,
            "transitions": result.transitions, "wall_s": wall, "episodes_per_minute": 60 * len(seeds) / wall,
            "call_timer": runtime.CALL_TIMER, **_device(runtime)}],
        "episode_inference_calls": [
            {"run_id": ctx.run_id, "measurement": m.name, "runtime": name, "call": first_call + i, "states": states,
             "ms": 1000 * s}
            for i, (states, s) in enumerate(zip(policy.call_states, policy.call_seconds))],
        "baseline_games": [] if key is None else played_marks(ctx, m.name, name, episodes, key, keyed_by)})


def game_call_rule_problem(metric: str) -> str:
    """Why a verdict may not judge one of GAME_CALL_METRIC_NAMES, and what to judge instead."""
    if metric in ("game_call_p95_ratio", "baseline_game_call_p95_ms"):
        return (f"{metric} compares runtimes that played their games one after another, not in interleaved rounds, "
                "so the load each met is in neither's figures: it is shown, never a rule; compare runtimes by a "
                "latency measurement's rounds (name it with `latency:` and judge latency_p95_ratio_ci_high)")
    return (f"{metric} is shown, never a rule: {OWN_TIME_REASON}; compare runtimes by a latency measurement's "
            "rounds (name it with `latency:` and judge latency_p95_ratio_ci_high)")


def _device(runtime) -> dict:
    """The device that ran, and whether it is a software adapter (WebGPU on SwiftShader)."""
    actual = runtime.actual()
    return {"device": actual.device, "software_adapter": actual.software_device}


def _game_call_metrics(con, run_id: str, m: EpisodesMeasurement, candidate: str, baseline: str) -> dict:
    """P50/P95 of each inference call inside the game loop, and a note when either side ran
    on a software adapter, so its time is never read as a GPU's."""
    rows = {runtime: (p50, p95) for runtime, p50, p95 in con.execute(
        "SELECT runtime, quantile_cont(ms, 0.5), quantile_cont(ms, 0.95) FROM episode_inference_calls "
        "WHERE run_id = ? AND measurement = ? AND runtime IN (?, ?) GROUP BY runtime",
        [run_id, m.name, candidate, baseline]).fetchall()}
    found: dict = {}
    if candidate in rows:
        found["candidate_game_call_p50_ms"], found["candidate_game_call_p95_ms"] = rows[candidate]
    if baseline in rows:
        found["baseline_game_call_p95_ms"] = rows[baseline][1]
    if candidate in rows and baseline in rows and rows[baseline][1] > 0:
        found["game_call_p95_ratio"] = rows[candidate][1] / rows[baseline][1]
    found.update(_game_call_intervals(con, run_id, m, candidate) if candidate in rows else {})
    software = list(con.execute(
        "SELECT runtime, device FROM episode_inference WHERE run_id = ? AND measurement = ? AND software_adapter "
        "AND runtime IN (?, ?) ORDER BY runtime", [run_id, m.name, candidate, baseline]).fetchall())
    if software:
        found["note"] = "; ".join(f"{r} ran on {d}: its times are not a GPU's" for r, d in software)
    return found


def _game_call_intervals(con, run_id: str, m: EpisodesMeasurement, runtime: str) -> dict:
    """The candidate's in-game calls over rounds, shown: consecutive blocks of GAME_CALL_BLOCK calls
    (the last, shorter one left out), each block's P50 and P95, and the interval of their
    geometric mean; a statistic gets one only with its least rounds (min_rounds: 10 for a P95)."""
    from breakout_core.statistics.latency_rounds import min_rounds, round_level

    blocks = con.execute(
        "SELECT call // ? AS block, count(*), quantile_cont(ms, 0.5), quantile_cont(ms, 0.95) "
        "FROM episode_inference_calls WHERE run_id = ? AND measurement = ? AND runtime = ? GROUP BY block "
        "HAVING count(*) = ? ORDER BY block", [GAME_CALL_BLOCK, run_id, m.name, runtime, GAME_CALL_BLOCK]).fetchall()
    found: dict = {"candidate_game_call_blocks": float(len(blocks))} if blocks else {}
    for column, statistic in ((2, "p50"), (3, "p95")):
        values = [b[column] for b in blocks]
        if len(values) >= min_rounds(statistic) and min(values) > 0:
            level = round_level(values)
            found[f"candidate_game_call_{statistic}_ms_ci_low"] = level.ci_low
            found[f"candidate_game_call_{statistic}_ms_ci_high"] = level.ci_high
    return found


def metrics(con, run_id: str, m: EpisodesMeasurement, candidate: str, baseline: str) -> dict:
    found = score_metrics(con, run_id, m.name, m.bootstrap, candidate, baseline)
    found.update(stall_metrics(con, run_id, m.name, candidate, baseline))
    if baseline == m.baseline_runtime and (reused := reused_count(con, run_id, m.name, baseline)):
        found["baseline_games_reused"] = float(reused)  # copied from an earlier run under the same key
    if m.stages is not None:
        found.update(staged_metrics(con, run_id, m.name, candidate, baseline))
    calls = _game_call_metrics(con, run_id, m, candidate, baseline)
    if found.get("fragility"):  # said in the reason line, whatever the outcome
        calls["note"] = "; ".join(n for n in (found["fragility"], calls.get("note")) if n)
    found.update(calls)
    if m.parity is not None:
        found.update(parity_pair_metrics(con, run_id, m.parity, candidate, baseline))
    if m.latency is not None:
        found.update(latency_pair_metrics(con, run_id, m.latency, candidate, baseline, None))
    return with_unavailable(found, con, run_id, [m.name, m.parity, m.latency], [candidate, baseline])


def report(con, run_id: str, m: EpisodesMeasurement) -> list[Section]:
    from runner.report.html import blank_nulls, table_html

    sections = runtime_sections(con, run_id, m.name)
    if m.stages is not None:
        sections += looks_report(con, run_id, m.name, m.stages)
    sections += score_report(con, run_id, m.name, m.bootstrap, baseline=m.baseline_runtime,
                             bootstrap_intervals=m.stages is None)
    inference = con.execute(
        "SELECT i.runtime, episodes, batch_size, inference_calls, states_inferred, transitions, wall_s, "
        "episodes_per_minute, c.p50_ms AS call_p50_ms, c.p95_ms AS call_p95_ms, call_timer, device, software_adapter "
        "FROM episode_inference i LEFT JOIN (SELECT runtime, quantile_cont(ms, 0.5) AS p50_ms, "
        "quantile_cont(ms, 0.95) AS p95_ms FROM episode_inference_calls WHERE run_id = ? AND measurement = ? "
        "GROUP BY runtime) c ON c.runtime = i.runtime WHERE run_id = ? AND measurement = ? ORDER BY i.runtime",
        [run_id, m.name, run_id, m.name]).df()
    if not inference.empty:
        sections.append(Section(f"{m.name}: inference per runtime (one call per vector step of {m.batch_size} games; "
                                "each call timed inside the game loop by the runtime's clock)",
                                html=table_html(blank_nulls(inference))))
    return sections + seeds_report(con, run_id, m.name)


# -- runner compare ---------------------------------------------------------------------------

def compare_episodes(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    rows = episode_rows(con, a, b, m_a, lambda runtime: runtime_problem(con, a, b, m_a["name"], [runtime]))
    played = {r.subject.removeprefix("policy ") for r in rows}
    return rows + unavailable_rows(con, a, b, m_a["name"], "mean_score", played)


KIND = Kind(
    name="episodes",
    model=EpisodesMeasurement,
    migrations=MIGRATIONS + staged_games.MIGRATIONS,
    views=[],  # episode_summary and episode_pairs come with the shared episodes table
    execute=execute,
    participants=lambda m: list(m.runtimes),
    metric_names=METRIC_NAMES,
    metrics=metrics,
    report=report,
    references=EpisodesMeasurement.references,
    metric_problem=EpisodesMeasurement.metric_problem,
    compare=compare_episodes,
    episode_seeds=lambda m: [(("seeds",), possible_seeds(m.seeds))],
    not_settings=frozenset({"runtimes", "baseline", "seeds", "batch_size", "bootstrap", "parity", "latency"}),
    in_words=games_words,
)
