"""`evaluate`: policies play full games on fixed episode seeds; raw scores per episode, in
the shared `episodes` table (runner.kinds.shared.episode_scores: its views, metrics and report).

Each checkpoint policy's file is recorded in `policy_files` with whether this measurement's
seeds are held out from the seeds its training chose it on (runner.kinds.shared.selection_seeds):
the report and every verdict's reason say so, and a verdict may require it
(`candidate_held_out: "== 1"`; an unknown lineage is not held out)."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Literal

import duckdb
from pydantic import Field, model_validator

from breakout_core.common.files import same_file
from breakout_core.common.hashing import file_sha256
from runner.compare.rows import Row, RunSide, differences, episode_rows
from runner.kinds.kind import Kind
from runner.kinds.shared.drawn_seeds import played_seeds, seeds_report
from runner.kinds.shared.episode_scores import (
    METRIC_NAMES,
    BootstrapSpec,
    episode_row,
    gif_row,
    score_metrics,
    score_report,
)
from runner.kinds.shared.runtime_lifecycle import check_loaded
from runner.kinds.shared.selection_seeds import HELD_OUT, describe, seed_ranges, selection_of
from runner.kinds.shared.stalls import METRIC_NAMES as STALL_METRIC_NAMES
from runner.kinds.shared.stalls import stall_metrics
from runner.report.section import Section
from runner.run.context import RunContext
from runner.spec.fields import DrawnSeeds, EpisodeSeed, Name, PlayedSeeds, StrictModel, possible_seeds
from runner.spec.yaml_source import PlacedError, raise_placed

MIGRATIONS = [
    (
        "0110_evaluate_policy_files",  # which bytes each checkpoint policy played; unknown for runs stored before
        """
        CREATE TABLE policy_files (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, policy VARCHAR NOT NULL,
            path VARCHAR NOT NULL, sha256 VARCHAR NOT NULL
        )
        """,
    ),
    (
        "0111_evaluate_selection_seeds",  # held out from the training's selection seeds or not; NULL before
        """
        ALTER TABLE policy_files ADD COLUMN selection VARCHAR;
        ALTER TABLE policy_files ADD COLUMN selection_overlap INTEGER;
        ALTER TABLE policy_files ADD COLUMN selection_seeds INTEGER;
        ALTER TABLE policy_files ADD COLUMN selection_trainings JSON;
        ALTER TABLE policy_files ADD COLUMN lineage VARCHAR;
        """,
    ),
]

SELECTION_METRIC_NAMES = ("candidate_held_out", "candidate_selection_seed_overlap")


class GifSpec(StrictModel):
    policy: Name
    seed: EpisodeSeed


class EvaluateMeasurement(StrictModel):
    kind: Literal["evaluate"]
    name: Name
    policies: list[Name] = Field(min_length=1, description="names from the spec's policies")
    seeds: PlayedSeeds = Field(description="episode seeds: a list, {start, count}, or {drawn: N}: N seeds drawn "
                               "for the checkpoint files of the policies")
    batch_size: int = Field(default=4, ge=1, le=256, description="episodes played side by side")
    policy_seed: int = Field(default=0, ge=0,
                             description="seeds each episode's action randomness with the episode seed")
    gif: GifSpec | None = None
    bootstrap: BootstrapSpec = BootstrapSpec()

    @model_validator(mode="after")
    def _consistent(self) -> "EvaluateMeasurement":
        if len(set(self.policies)) != len(self.policies):
            raise ValueError("policies must be distinct")
        if self.gif is not None:
            raise_placed(
                ([] if self.gif.policy in self.policies else
                 [PlacedError(f"gif.policy {self.gif.policy!r} is not one of this measurement's policies",
                              ("gif", "policy"))])
                + ([PlacedError("gif.seed names a seed, and drawn seeds are known only once the run draws them: "
                                "give the seeds as a list or {start, count}", ("gif", "seed"))]
                   if isinstance(self.seeds, DrawnSeeds) else [] if self.gif.seed in possible_seeds(self.seeds) else
                   [PlacedError(f"gif.seed {self.gif.seed} is not one of this measurement's seeds", ("gif", "seed"))]))
        return self


def build_policy(policy_spec, name: str, num_actions: int):
    from breakout_core.evaluation.policies import QNetworkPolicy, RandomPolicy

    if policy_spec.type == "random":
        return RandomPolicy(num_actions)
    policy = QNetworkPolicy.from_checkpoint(policy_spec.path, epsilon=policy_spec.epsilon)
    policy.name = name
    return policy


def execute(m: EvaluateMeasurement, ctx: RunContext) -> None:
    from breakout_core.game.driver import evaluation_driver

    seeds = played_seeds(ctx, m.name, m.seeds, {name: ctx.spec.policies[name].path for name in m.policies
                                                 if ctx.spec.policies[name].type != "random"})
    pending = [name for name in m.policies if not ctx.already_stored("episodes", m.name, policy=name)]
    if pending:
        with closing(evaluation_driver(ctx.contract, m.batch_size, len(seeds), len(pending))) as driver:
            for policy_name in pending:  # one driver serves every policy
                _evaluate_policy(m, ctx, policy_name, seeds, driver)


def _evaluate_policy(m: EvaluateMeasurement, ctx: RunContext, policy_name: str, seeds: list[int], driver) -> None:
    from breakout_core.evaluation.evaluator import evaluate, write_gif

    policy_spec = ctx.spec.policies[policy_name]
    played_file = None
    if policy_spec.type != "random":
        with same_file(policy_spec.path):  # the bytes hashed are the bytes that play, those the run recorded
            sha256 = file_sha256(policy_spec.path)
            check_loaded(ctx, f"policies.{policy_name}", sha256, f"measurement {m.name}")
            policy = build_policy(policy_spec, policy_name, ctx.contract.num_actions)
        with ctx.store.reader() as con:
            chosen = selection_of(con, policy_spec.path, sha256, seeds)
        played_file = {"run_id": ctx.run_id, "measurement": m.name, "policy": policy_name,
                       "path": str(Path(policy_spec.path).resolve()), "sha256": sha256, **chosen}
    else:
        policy = build_policy(policy_spec, policy_name, ctx.contract.num_actions)
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
    ctx.store.append_together({"episodes": [episode_row(ctx, m.name, policy_name, e) for e in result.episodes],
                               "policy_files": [] if played_file is None else [played_file]})
    if result.frames:
        path = write_gif(result.frames,
                         ctx.reports_dir / "gifs" / f"{ctx.run_id}-{m.name}-{policy_name}-{record_seed}.gif")
        episode = next(e for e in result.episodes if e.seed == record_seed)
        ctx.store.append_rows("artifacts", [gif_row(ctx, m.name, path, policy_name, episode, len(result.frames))])


def _selection_rows(con, run_id: str, measurement: str) -> list[tuple]:
    """(policy, selection, overlap, seeds played) of each checkpoint policy; none before the columns."""
    return con.execute(
        "SELECT f.policy, f.selection, f.selection_overlap, count(DISTINCT e.seed) FROM policy_files f "
        "JOIN episodes e ON e.run_id = f.run_id AND e.measurement = f.measurement AND e.policy = f.policy "
        "WHERE f.run_id = ? AND f.measurement = ? AND f.selection IS NOT NULL GROUP BY ALL ORDER BY f.policy",
        [run_id, measurement]).fetchall()


def metrics(con, run_id: str, m: EvaluateMeasurement, candidate: str, baseline: str) -> dict:
    found = score_metrics(con, run_id, m.name, m.bootstrap, candidate, baseline)
    if baseline is not None:
        found.update(stall_metrics(con, run_id, m.name, candidate, baseline))
    rows = {row[0]: row for row in _selection_rows(con, run_id, m.name)}
    if candidate in rows:
        found["candidate_held_out"] = 1.0 if rows[candidate][1] == HELD_OUT else 0.0  # unknown is not held out
        if rows[candidate][2] is not None:
            found["candidate_selection_seed_overlap"] = float(rows[candidate][2])
    notes = [describe(*rows[p]) for p in (candidate, baseline) if p in rows]
    if notes:
        found["note"] = "; ".join(notes)
    return found


def report(con, run_id: str, m: EvaluateMeasurement) -> list[Section]:
    from runner.report.html import blank_nulls, table_html

    sections = score_report(con, run_id, m.name, m.bootstrap, baseline=m.policies[0])
    files = con.execute(
        "SELECT policy, selection, selection_overlap, selection_seeds, selection_trainings, lineage, sha256 "
        "FROM policy_files WHERE run_id = ? AND measurement = ? AND selection IS NOT NULL ORDER BY policy",
        [run_id, m.name]).df()
    if not files.empty:
        sections.insert(1, Section(
            f"{m.name}: held out, or played on the seeds it was chosen on "
            f"(seeds {seed_ranges(_played(con, run_id, m))})",
            html=table_html(blank_nulls(files))))
    return sections + seeds_report(con, run_id, m.name)


def _played(con, run_id: str, m: EvaluateMeasurement) -> list[int]:
    return [s for (s,) in con.execute("SELECT DISTINCT seed FROM episodes WHERE run_id = ? AND measurement = ? "
                                      "ORDER BY seed", [run_id, m.name]).fetchall()]


# -- runner compare ---------------------------------------------------------------------------

def _policy_files(con, run_id: str, measurement: str) -> dict[str, str]:
    """{policy: sha256} of the checkpoint files a run's evaluate measurement played; none where
    the database predates the table (a file this runner may read but not migrate)."""
    try:
        return dict(con.execute("SELECT policy, sha256 FROM policy_files WHERE run_id = ? AND measurement = ?",
                                [run_id, measurement]).fetchall())
    except duckdb.CatalogException:
        return {}

def compare_evaluate(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    files = [_policy_files(con, side.run_id, m_a["name"]) for side in (a, b)]

    def policy_problem(policy: str) -> str | None:
        settings = differences(a.spec.get("policies", {}).get(policy), b.spec.get("policies", {}).get(policy))
        if settings:
            return f"policy {policy} differs: {'; '.join(settings)}"
        sha_a, sha_b = (side.get(policy) for side in files)
        if sha_a and sha_b and sha_a != sha_b:
            return f"model file of policy {policy} differs: sha256 {sha_a[:12]}… → {sha_b[:12]}…"
        return None

    rows = episode_rows(con, a, b, m_a, policy_problem)
    for row in rows:
        policy = row.subject.removeprefix("policy ")
        unrecorded = [label for label, side in zip("AB", files) if policy not in side]
        if (a.spec.get("policies", {}).get(policy) or {}).get("type") == "checkpoint" and unrecorded:
            row.note = "; ".join(filter(None, [row.note, f"its model file's sha256 is not recorded in run "
                                                         f"{' or '.join(unrecorded)}"]))
    return rows


KIND = Kind(
    name="evaluate",
    model=EvaluateMeasurement,
    migrations=MIGRATIONS,  # its episodes go to the shared `episodes` table
    views=[],
    execute=execute,
    participants=lambda m: list(m.policies),
    metric_names=METRIC_NAMES + STALL_METRIC_NAMES + SELECTION_METRIC_NAMES,
    metrics=metrics,
    report=report,
    compare=compare_evaluate,
    episode_seeds=lambda m: [(("seeds",), possible_seeds(m.seeds))],
    not_settings=frozenset({"policies", "seeds", "batch_size", "gif", "bootstrap"}),
)
