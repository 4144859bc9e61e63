"""`closed_loop` (Day 23): each runtime drives the real game for K agent steps from the same seed.

One game on the ALE per runtime, played by the episode driver as the evaluator plays an
episode of that seed (the seed's game and no-op start), then one greedy decision per
step from the runtime (batch 1). A game that ends before K steps is followed by a fresh one,
so every runtime plays exactly K steps. Every step is stored (`closed_loop_steps`: action and its
name, reward, lives, the Q-values of NOOP, FIRE, RIGHT and LEFT); the views give each runtime's
score and action counts and, for each pair, the first step where the actions differ.

Once two runtimes choose differently the games differ from there on; a divergence alone
says nothing about playing strength (Day 26): the `episodes` kind decides that.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from runner.compare.rows import Row, RunSide, runtime_problem, samples_row, unavailable_rows
from runner.kinds.kind import Kind
from runner.kinds.shared.runtime_lifecycle import greedy, open_runtime
from runner.kinds.shared.runtime_status import found_unavailable, runtime_sections, with_unavailable
from runner.kinds.shared.verdict_words import closed_loop_words
from runner.report.section import Section
from runner.run.context import RunContext
from runner.spec.fields import EpisodeSeed, Name
from runner.spec.runtimes import RuntimeMeasurement


class ClosedLoopMeasurement(RuntimeMeasurement):
    kind: Literal["closed_loop"]
    name: Name
    seed: EpisodeSeed = Field(default=0, description="episode seed: the game the first episode plays")
    steps: int = Field(default=256, ge=1, le=1_000_000, description="agent steps each runtime plays")


MIGRATIONS = [
    (
        "0440_closed_loop",
        """
        CREATE TABLE closed_loop_steps (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, runtime VARCHAR NOT NULL, seed BIGINT NOT NULL,
            step INTEGER NOT NULL, game INTEGER NOT NULL, forced_noop BOOLEAN NOT NULL, action INTEGER NOT NULL,
            reward DOUBLE NOT NULL, lives INTEGER, game_over BOOLEAN NOT NULL,
            q_noop DOUBLE, q_fire DOUBLE, q_right DOUBLE, q_left DOUBLE, contract_hash VARCHAR NOT NULL
        );
        """,
    ),
    # the action each step played by name: under full_action_space an output is one of ALE's 18 (rows
    # from before it hold the minimal set's index)
    ("0441_closed_loop_action_names", "ALTER TABLE closed_loop_steps ADD COLUMN action_name VARCHAR"),
]

VIEWS = [
    """
    CREATE OR REPLACE VIEW closed_loop_summary AS
    SELECT run_id, measurement, runtime, any_value(seed) AS seed, count(*) AS steps, sum(reward) AS score,
           count(*) FILTER (WHERE game_over) AS games_ended,
           count(*) FILTER (WHERE named = 'NOOP') AS action_noop,
           count(*) FILTER (WHERE named = 'FIRE') AS action_fire,
           count(*) FILTER (WHERE named = 'RIGHT') AS action_right,
           count(*) FILTER (WHERE named = 'LEFT') AS action_left
    FROM (SELECT *, coalesce(action_name, ['NOOP', 'FIRE', 'RIGHT', 'LEFT'][action + 1]) AS named
          FROM closed_loop_steps)
    GROUP BY run_id, measurement, runtime
    """,
    """
    CREATE OR REPLACE VIEW closed_loop_pairs AS
    SELECT c.run_id, c.measurement, c.runtime AS candidate, b.runtime AS baseline,
           sc.score AS candidate_score, sb.score AS baseline_score, sc.score - sb.score AS score_diff,
           abs(sc.action_noop - sb.action_noop) + abs(sc.action_fire - sb.action_fire)
             + abs(sc.action_right - sb.action_right) + abs(sc.action_left - sb.action_left) AS action_count_l1,
           min(c.step) FILTER (WHERE c.action <> b.action) AS first_divergence_step,
           count(*) AS steps_compared
    FROM closed_loop_steps c
    JOIN closed_loop_steps b ON b.run_id = c.run_id AND b.measurement = c.measurement AND b.step = c.step
         AND b.runtime <> c.runtime
    JOIN closed_loop_summary sc ON sc.run_id = c.run_id AND sc.measurement = c.measurement AND sc.runtime = c.runtime
    JOIN closed_loop_summary sb ON sb.run_id = b.run_id AND sb.measurement = b.measurement AND sb.runtime = b.runtime
    GROUP BY ALL
    """,
]

METRIC_NAMES = ("candidate_score", "baseline_score", "score_diff", "action_count_l1", "first_divergence_step",
                "diverged")


def play(runtime, contract, seed: int, steps: int) -> dict[str, np.ndarray]:
    """K agent steps of greedy play through `runtime`, as arrays per step. The first game is
    episode `seed`; a game that ends before K steps is followed by the slot's next game."""
    from breakout_core.game.driver import EpisodeDriver
    from breakout_core.game.greedy import finite_q

    out = {k: [] for k in ("game", "forced_noop", "action", "reward", "lives", "game_over", "q")}
    driver = EpisodeDriver(contract, 1)
    driver.start(0, seed)
    game = 0
    for _ in range(steps):
        forced = bool(driver.forced()[0])  # the contract's no-op start or serve (forced_noop is true for both)
        q = np.full(contract.num_actions, np.nan) if forced else runtime.infer(driver.obs[:1])[0].astype(np.float64)
        action = 0 if forced else int(greedy(finite_q(q[None], f"closed-loop step {len(out['game'])}"))[0])
        result = driver.step(np.array([action]))
        ended = bool(result.finished)
        for key, value in (("game", game), ("forced_noop", forced), ("action", int(result.actions[0])),
                           ("reward", float(result.reward[0])), ("lives", driver.games[0].lives),
                           ("game_over", ended), ("q", q)):
            out[key].append(value)
        if ended:
            game += 1
            driver.start(0, None)
    return {k: np.asarray(v) for k, v in out.items()}


def execute(m: ClosedLoopMeasurement, ctx: RunContext) -> None:
    import pyarrow as pa

    task = ctx.progress.add_task(f"{m.name} · {m.steps} steps from seed {m.seed}", total=len(m.runtimes),
                                 unit="runtimes")
    for name in m.ordered_runtimes():
        if not (ctx.already_stored("closed_loop_steps", m.name, runtime=name) or found_unavailable(ctx, m.name, name)):
            with open_runtime(ctx, m.name, name) as runtime:
                if runtime is not None:
                    t = play(runtime, ctx.contract, m.seed, m.steps)
                    n = m.steps
                    q = t.pop("q")
                    columns = ("q_noop", "q_fire", "q_right", "q_left")
                    qcols = {key: np.where(np.isnan(q[:, j]), None, q[:, j]).tolist()
                             for j, key in zip(ctx.contract.minimal_outputs(), columns)}
                    t["action_name"] = [ctx.contract.action_names[a] for a in t["action"]]
                    ctx.store.append_arrow("closed_loop_steps", pa.table({
                        "run_id": [ctx.run_id] * n, "measurement": [m.name] * n, "runtime": [name] * n,
                        "seed": [m.seed] * n, "step": np.arange(n, dtype=np.int32), **t, **qcols,
                        "contract_hash": [ctx.contract.hash] * n}))
        ctx.progress.advance(task)


def metrics(con, run_id: str, m: ClosedLoopMeasurement, candidate: str, baseline: str) -> dict:
    found = {}
    row = con.execute("SELECT candidate_score, baseline_score, score_diff, action_count_l1, first_divergence_step, "
                      "steps_compared FROM closed_loop_pairs WHERE run_id = ? AND measurement = ? AND candidate = ? "
                      "AND baseline = ?", [run_id, m.name, candidate, baseline]).fetchone()
    if row:
        first = row[4]
        found = {"candidate_score": row[0], "baseline_score": row[1], "score_diff": row[2],
                 "action_count_l1": float(row[3]),
                 "first_divergence_step": float(row[5] if first is None else first),  # K: no divergence in K steps
                 "diverged": float(first is not None)}
    return with_unavailable(found, con, run_id, [m.name], [candidate, baseline])


def report(con, run_id: str, m: ClosedLoopMeasurement) -> list[Section]:
    from runner.report.html import altair, blank_nulls, table_html

    alt = altair()
    sections = runtime_sections(con, run_id, m.name)
    summary = con.execute("SELECT runtime, seed, steps, score, games_ended, action_noop, action_fire, action_right, "
                          "action_left FROM closed_loop_summary WHERE run_id = ? AND measurement = ? ORDER BY runtime",
                          [run_id, m.name]).df()
    if summary.empty:
        sections.append(Section(f"{m.name}: closed loop", html="<p>No runtime could run here.</p>"))
        return sections
    pairs = con.execute("SELECT candidate, baseline, candidate_score, baseline_score, score_diff, action_count_l1, "
                        "first_divergence_step FROM closed_loop_pairs WHERE run_id = ? AND measurement = ? "
                        "AND baseline = ? ORDER BY candidate", [run_id, m.name, m.baseline_runtime]).df()
    sections.append(Section(
        f"{m.name}: {m.steps} steps of real play from seed {m.seed} per runtime (score, action counts); "
        f"first step where actions differ from {m.baseline_runtime} (empty: none)",
        html=table_html(summary) + table_html(blank_nulls(pairs))))
    steps = con.execute("SELECT runtime, step, action, sum(reward) OVER (PARTITION BY runtime ORDER BY step) AS score "
                        "FROM closed_loop_steps WHERE run_id = ? AND measurement = ? ORDER BY runtime, step",
                        [run_id, m.name]).df()
    chart = alt.Chart(steps).mark_line(interpolate="step-after").encode(
        x=alt.X("step:Q"), y=alt.Y("score:Q", title="cumulative score"), color="runtime:N",
        strokeDash="runtime:N", tooltip=["runtime", "step", "action", "score"])
    sections.append(Section(f"{m.name}: cumulative score per step", charts=[chart.properties(width=640).to_dict()]))
    return sections


# -- runner compare ---------------------------------------------------------------------------

def compare_closed_loop(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    name = m_a["name"]
    scores = {label: dict(con.execute("SELECT runtime, score FROM closed_loop_summary WHERE run_id = ? AND "
                                      "measurement = ?", [side.run_id, name]).fetchall())
              for label, side in (("A", a), ("B", b))}
    rows = []
    for runtime in sorted(set(scores["A"]) | set(scores["B"])):
        va, vb = scores["A"].get(runtime), scores["B"].get(runtime)
        row = samples_row(name, runtime, "score", np.asarray([] if va is None else [va]),
                           np.asarray([] if vb is None else [vb]), lower_is_better=False, machine_bound=False,
                           note="one game from one seed")
        row.problem = row.problem or runtime_problem(con, a, b, name, [runtime])
        rows.append(row)
    return rows + unavailable_rows(con, a, b, name, "score", set(scores["A"]) | set(scores["B"]))


KIND = Kind(
    name="closed_loop",
    model=ClosedLoopMeasurement,
    migrations=MIGRATIONS,
    views=VIEWS,
    execute=execute,
    participants=lambda m: list(m.runtimes),
    metric_names=METRIC_NAMES,
    metrics=metrics,
    report=report,
    references=ClosedLoopMeasurement.references,
    compare=compare_closed_loop,
    # the one seeded game: a game that ends before K steps is followed by an unseeded continuation
    # (`driver.start(slot, None)`: the slot's emulator and no-op generator go on), which is no
    # episode seed's game, so `seed` is every seed the loop plays
    episode_seeds=lambda m: [(("seed",), [m.seed])],
    not_settings=frozenset({"runtimes", "baseline"}),
    in_words=closed_loop_words,
)
