"""The shipped checkpoint's model card, written from the database, not by hand.

Everything on the card comes from stored rows or the files themselves: the training run
(spec text, git commit, host, CPU) from `runs`; the transitions from the checkpoint's own
metadata; the wall time of the attempts that led to this checkpoint from their start
(`train_attempts.started_at`) and the modification times of the checkpoint files they wrote; the
evaluation table from `episode_summary` of the evaluation run, with its verdicts; the
greedy-score curve from the checkpoints the training run scored as it wrote them.

The headline is the held-out figure: the first evaluation whose seeds are held out from the
seeds the training chose this checkpoint on (`policy_files.selection`), with the training's own
score of it on those selection seeds beside it and the difference. A best checkpoint's score
on the seeds that picked it is biased upward; the card never leads with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from breakout_core.common.files import write_whole
from breakout_core.common.hashing import file_sha256
from runner.kinds.shared.selection_seeds import describe, seed_ranges
from runner.store.database import Store
from runner.store.errors import NoSuchRun

SUMMARY_COLUMNS = ("episodes", "distinct_scores", "distinct_lengths", "mean", "median", "std", "p10", "p90", "min",
                   "max", "time_limit_episodes")


def _run(con, run_id: str, columns: str) -> tuple:
    """These columns of one row of `runs`; a clear error when the run is not stored."""
    row = con.execute(f"SELECT {columns} FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        raise NoSuchRun(f"no run {run_id!r} in the database")
    return row


@dataclass(frozen=True)
class CardTraining:
    """The (trial, training seed) training of a run that wrote the card's checkpoint."""

    trial: str
    training_seed: int

    def where(self) -> str:
        return "run_id = ? AND measurement = ? AND trial = ? AND training_seed = ?"

    def args(self, run_id: str, measurement: str) -> list:
        return [run_id, measurement, self.trial, self.training_seed]


def _card_training(con, run_id: str, measurement: str, checkpoint: Path) -> CardTraining:
    """The run's only training, or the one whose checkpoint files hold the card's checkpoint's bytes."""
    trainings = [CardTraining(*row) for row in con.execute(
        "SELECT DISTINCT trial, training_seed FROM train_attempts WHERE run_id = ? AND measurement = ? ORDER BY ALL",
        [run_id, measurement]).fetchall()]
    if not trainings:
        raise ValueError(f"run {run_id} trained no measurement {measurement!r}")
    if len(trainings) == 1:
        return trainings[0]
    sha256 = file_sha256(checkpoint)
    files = con.execute("SELECT DISTINCT trial, training_seed, path FROM train_checkpoints WHERE run_id = ? "
                        "AND measurement = ?", [run_id, measurement]).fetchall()
    for trial, seed, path in files:
        if Path(path).is_file() and file_sha256(path) == sha256:
            return CardTraining(trial, seed)
    raise ValueError(f"run {run_id} ran {len(trainings)} trainings of measurement {measurement!r} and none of their "
                     f"checkpoint files on this machine is {checkpoint}: the card cannot tell which training it is")


def _training_wall_s(con, run_id: str, measurement: str, training: CardTraining,
                     card_at: int) -> dict[int, float | None]:
    """Wall seconds to each of the training's checkpoints (and to the card's) over the attempts that
    built it, None when a file the time is read from is gone.

    An attempt counts from its start to the modification time of the last checkpoint file it
    wrote that the chain used (up to the checkpoint the next attempt resumed from, or the one
    timed); what an attempt did past that before it was stopped is not counted. The rows hold
    no times of their own, so on a machine without the run's files the time is not known.
    """
    attempts = con.execute(f"SELECT attempt, from_transition, started_at FROM train_attempts WHERE {training.where()} "
                           "ORDER BY attempt", training.args(run_id, measurement)).fetchall()
    files = con.execute(f"SELECT attempt, transition, path FROM train_checkpoints WHERE {training.where()} "
                        "ORDER BY attempt, transition", training.args(run_id, measurement)).fetchall()
    mtimes = {(a, t): datetime.fromtimestamp(Path(p).stat().st_mtime, timezone.utc)
              for a, t, p in files if Path(p).is_file()}
    checkpoints = {t for _, t, _ in files} | {from_transition for _, from_transition, _ in attempts} | {card_at}
    return {transitions: _wall_s_to(attempts, files, mtimes, transitions) for transitions in checkpoints}


def _wall_s_to(attempts: list, files: list, mtimes: dict, transitions: int) -> float | None:
    total = 0.0
    for i, (attempt, _, started) in enumerate(attempts):
        until = min(attempts[i + 1][1], transitions) if i + 1 < len(attempts) else transitions
        wrote = [t for a, t, _ in files if a == attempt and t <= until]
        if not wrote:
            continue
        last = (attempt, max(wrote))  # the attempt's last checkpoint in the chain: its time ends the attempt
        if last not in mtimes:
            return None
        total += (mtimes[last] - started).total_seconds()
    return total


def _greedy_curve(con, run_id: str, measurement: str, training: CardTraining, started_at: int | None, card_at: int,
                  wall_s: dict[int, float | None]) -> list[str]:
    """The training's checkpoints as `evaluate_checkpoints` scored them (greedy, fixed seeds),
    against transitions and the wall hours that led to each; nothing when none was scored."""
    # without and with the study's seed list
    labels = [training.trial, f"{training.trial},seed={training.training_seed}"]
    rows = con.execute(
        "SELECT policy, CAST(split_part(policy, '@', 2) AS BIGINT) AS transition, episodes, mean, median, "
        "distinct_scores, time_limit_episodes FROM episode_summary "
        "WHERE run_id = ? AND measurement = ? AND split_part(policy, '@', 1) IN (?, ?) ORDER BY transition",
        [run_id, measurement, *labels]).fetchall()
    if not rows:
        return []
    start = (" Its first row is the checkpoint it started from, scored before it learned." if rows[0][1] == started_at
             else "")
    table = ["| checkpoint | transitions | wall hours | episodes | mean | median | distinct_scores "
             "| time_limit_episodes |",
             "|" + " --- |" * 8]
    for policy, transitions, episodes, mean, median, distinct, stalled in rows:
        seconds = wall_s.get(transitions)
        hours = "not known here" if seconds is None else f"{seconds / 3600:.2f}"
        this = " (this checkpoint)" if transitions == card_at else ""
        table.append(f"| `{policy}`{this} | {transitions:,} | {hours} | {episodes} | {mean:.2f} | {median:g} | "
                     f"{distinct} | {stalled} |")
    return [
        "## Greedy score against transitions and hours",
        f"Each checkpoint of training run `{run_id}` as the training scored it when it was written "
        "(`evaluate_checkpoints` in the spec below: its seeds and epsilon, games as the run's contract plays "
        "them). Wall hours count from this run's start, as above, and include the scoring of the checkpoints "
        f"before.{start}",
        "",
        *table,
        "",
    ]


def _mean_on(con, run_id: str, measurement: str, policy: str) -> tuple[float, int, str] | None:
    """(mean score, episodes, seed ranges) of one policy's episodes in a run's measurement."""
    row = con.execute("SELECT avg(score), count(*), list(seed) FROM episodes WHERE run_id = ? AND measurement = ? "
                      "AND policy = ?", [run_id, measurement, policy]).fetchone()
    return None if not row[1] else (row[0], row[1], seed_ranges(row[2]))


def _headline(con, sha256: str, eval_runs: list[str], train_run: str, measurement: str, training: CardTraining,
              transitions: int) -> list[str]:
    """The held-out mean first (the first evaluation under the training's contract whose seeds are held
    out), the selection-seed mean beside it, and their difference."""
    labels = (training.trial, f"{training.trial},seed={training.training_seed}")
    selection = next(filter(None, (_mean_on(con, train_run, measurement, f"{label}@{transitions}")
                                   for label in labels)), None)
    chosen = (f"the training's own score of this checkpoint on the seeds it was chosen on: **{selection[0]:.2f}** "
              f"({selection[1]} games, seeds {selection[2]}, run `{train_run}`)") if selection else \
        "the training's own score of this checkpoint on its selection seeds is not stored"
    held = None
    trained_under = _run(con, train_run, "contract_hash")[0]
    for run in (r for r in eval_runs if _run(con, r, "contract_hash")[0] == trained_under):  # same game, same rules
        row = con.execute("SELECT measurement, policy FROM policy_files WHERE run_id = ? AND sha256 = ? "
                          "AND selection = 'held_out' ORDER BY measurement, policy LIMIT 1", [run, sha256]).fetchone()
        if row:
            held = (run, *row, _mean_on(con, run, *row), _run(con, run, "spec_name")[0])
            break
    lines = ["## Headline"]
    if held is None:
        lines.append(f"No held-out figure: no evaluation below under the training's contract is held out from the "
                     f"seeds the training chose this checkpoint on. Beside it, {chosen}.")
    else:
        run, m, policy, (mean, games, seeds), spec = held
        lines.append(f"**Held-out mean score: {mean:.2f}** ({games} games, seeds {seeds}: `{spec}` run `{run}`, "
                     f"none of them a seed the training chose this checkpoint on). Beside it, {chosen}.")
        if selection:
            lines.append(f"Difference, held-out minus selection seeds: **{mean - selection[0]:+.2f}**. The best of "
                         "several checkpoints scored on the same seeds is biased upward there; the held-out "
                         "figure is the one to expect.")
    return lines + [""]


def _evaluation_section(con, eval_run: str) -> list[str]:
    spec_name, spec_path, commit, started, contract_hash, contract = _run(
        con, eval_run, "spec_name, spec_path, git_commit, started_at, contract_hash, contract")
    summary = con.execute(f"SELECT measurement, policy, {', '.join(SUMMARY_COLUMNS)} FROM episode_summary "
                          "WHERE run_id = ? ORDER BY measurement, policy DESC", [eval_run]).fetchall()
    if not summary:
        raise ValueError(f"run {eval_run} has no evaluation episodes")
    verdicts = con.execute("SELECT verdict, outcome, reason FROM verdicts WHERE run_id = ? ORDER BY verdict",
                           [eval_run]).fetchall()
    seeds = con.execute(
        "SELECT f.policy, f.selection, f.selection_overlap, count(DISTINCT e.seed) FROM policy_files f "
        "JOIN episodes e USING (run_id, measurement, policy) WHERE f.run_id = ? AND f.selection IS NOT NULL "
        "GROUP BY ALL ORDER BY ALL", [eval_run]).fetchall()
    played = json.loads(contract or "{}")
    serving = " plus a forced serve after each lost life" if played.get("serve_after_life_loss") else ""
    table = ["| measurement | policy | " + " | ".join(SUMMARY_COLUMNS) + " |",
             "|" + " --- |" * (len(SUMMARY_COLUMNS) + 2)]
    for row in summary:
        table.append("| " + " | ".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row) + " |")
    return [
        f"### `{spec_name}`: contract `{played.get('name', '?')}`{serving} (hash `{contract_hash}`)",
        f"Run `{eval_run}` ({started:%Y-%m-%d}, commit `{commit}`); reproduce with `runner run {spec_path}`.",
        "",
        *table,
        "",
        *[f"Seeds: {describe(*row)}." for row in seeds],
        *([""] if seeds else []),
        "Verdicts:",
        *[f"- `{v}`: **{o}** — {r}" for v, o, r in verdicts],
        "",
    ]


def _precision_line(precision: dict) -> str:
    flags = precision.get("cpu_flags")
    on = f"; CPU flags {', '.join(flags) or 'none of those that decide it'}" if flags is not None else ""
    return (f"- Learner precision: **{precision['chosen']}** (requested {precision['requested']}: "
            f"{precision['reason']}{on})")


def write_model_card(store: Store, checkpoint: Path, train_run: str, eval_runs: list[str], out: Path,
                     measurement: str = "reference") -> Path:
    from breakout_core.learning.qnetwork import load_checkpoint

    _, meta = load_checkpoint(checkpoint)
    transitions = int(meta["transitions"])
    with store.reader() as con:
        spec_name, spec_text, commit, host, cpu, packages = _run(
            con, train_run, "spec_name, spec_text, git_commit, host, cpu, packages")
        training = _card_training(con, train_run, measurement, checkpoint)
        walls = _training_wall_s(con, train_run, measurement, training, transitions)
        wall_s = walls.get(transitions)
        evaluations = [line for run in eval_runs for line in _evaluation_section(con, run)]
        headline = _headline(con, file_sha256(checkpoint), eval_runs, train_run, measurement, training, transitions)
        episodes = con.execute(f"SELECT count(*), max(transition) FROM train_episodes_valid WHERE {training.where()} "
                               "AND transition <= ?", [*training.args(train_run, measurement), transitions]).fetchone()
        started_from = con.execute(f"SELECT from_transition, resumed_from, resumed_from_sha256 FROM train_attempts "
                                   f"WHERE {training.where()} AND attempt = 0 AND resume_mode = 'checkpoint'",
                                   training.args(train_run, measurement)).fetchone()
        precisions = [json.loads(row[0]) for row in con.execute(
            f"SELECT DISTINCT learner_precision FROM train_attempts WHERE {training.where()} ORDER BY ALL",
            training.args(train_run, measurement)).fetchall() if row[0]]
        curve = _greedy_curve(con, train_run, measurement, training, started_from[0] if started_from else None,
                              transitions, walls)
    versions = json.loads(packages) if packages else {}
    # a training that goes on from the shipped agent names that agent's path, which the ship then overwrites
    replaced = (" (the agent shipped there before this one)" if started_from
                and Path(started_from[1]).resolve() == checkpoint.resolve() else "")
    start_sha256 = f", sha256 `{started_from[2]}`," if started_from and started_from[2] else ""
    lines = [
        f"# Model card: {checkpoint.name}",
        "",
        "Written by `runner model-card` from the results database; regenerate it rather than edit it.",
        "",
        *headline,
        "## What it is",
        f"- File: `{checkpoint.name}`, sha256 `{file_sha256(checkpoint)}`",
        f"- Architecture: {meta.get('architecture')}; contract `{meta['contract']['name']}` "
        f"(hash `{meta['contract_hash']}`)",
        f"- Trained for **{transitions:,} transitions** (agent steps over all envs; x{meta['contract']['frame_skip']} "
        f"emulator frames), {episodes[0]:,} training episodes",
        f"- Training run `{train_run}` of spec `{spec_name}`, git commit `{commit}`",
        *([f"- Started from the checkpoint `{started_from[1]}`{replaced}{start_sha256} at {started_from[0]:,} "
           "transitions (its weights, a "
           "fresh optimizer, a replay refilled by its policy): the training episodes and wall time here are "
           f"this run's, from {started_from[0]:,} transitions on"] if started_from else []),
        f"- Machine: {host}, {cpu}; torch {versions.get('torch', '?')}, ale-py {versions.get('ale-py', '?')}",
        *[_precision_line(p) for p in precisions],
        (f"- Wall time to this checkpoint: **{wall_s / 3600:.2f} h** over the attempts that led to it (work "
         "lost to a stop after an attempt's last checkpoint not counted), on the machine above, often beside "
         "other jobs") if wall_s is not None else
        ("- Wall time to this checkpoint: not known here (it is read from the training run's checkpoint "
         "files, which are not on the machine that wrote this card)"),
        "",
        "## Evaluation (raw Atari score, full games, epsilon 0, fixed seeds)",
        "`time_limit_episodes`: episodes ended by the 108,000-frame limit instead of game over "
        "(an agent that stalls without serving after a lost life ends that way). "
        "`distinct_scores`, `distinct_lengths`: how many different scores and episode lengths the seeds "
        "gave. Under breakout-v2 (no sticky actions) a seed varies only the 0-30 no-op start, and many "
        "seeds replay nearly the same game; under breakout-v3 sticky actions make each seed its own game.",
        "",
        *evaluations,
        *curve,
        "## Training spec",
        "```yaml",
        spec_text.rstrip(),
        "```",
        "",
    ]
    write_whole(out, "\n".join(lines).encode("utf-8"))
    return out
