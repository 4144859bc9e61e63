"""Selection seeds: the episode seeds a training scored its checkpoints on, and so chose one on.

A training that scores its checkpoints (`evaluate_checkpoints`, `score_seeds`) and ships the
best has picked the maximum of noisy estimates on those seeds: its score there is biased
upward. `selection_of` finds, through what the database holds, which training wrote a
checkpoint file and on which seeds it scored that training's checkpoints, and says whether an
evaluation's own seeds overlap them. Three states, never more sure than the rows allow:

- `held_out`: the training is found and none of the evaluation's seeds is one of its seeds;
- `selection_seeds`: some are (how many is kept);
- `unknown`: no stored training wrote this file (an outside file, or its training's rows are
  not in this database): never read as held out.

A training is found by the file's bytes (a checkpoint file it wrote, still on this machine,
with the same sha256), else by the checkpoint's own metadata: the training config, contract
and transition count it was saved with, matched against a training's attempts and the
checkpoints they recorded (rows shipped without their files still find it). An ONNX file is
followed to the checkpoint its export recorded; one that records none is unknown.
"""

from __future__ import annotations

import json
from pathlib import Path

from breakout_core.common.hashing import file_sha256

HELD_OUT, SELECTION_SEEDS, UNKNOWN = "held_out", "selection_seeds", "unknown"


def _by_sha256(con, sha256: str) -> list[tuple]:
    rows = con.execute("SELECT DISTINCT run_id, measurement, trial, training_seed, path FROM train_checkpoints "
                       "ORDER BY ALL").fetchall()
    return sorted({row[:4] for row in rows if Path(row[4]).is_file() and file_sha256(row[4]) == sha256})


def _by_metadata(con, meta: dict) -> list[tuple]:
    """Trainings whose attempt ran with the checkpoint's config under its contract and recorded a
    checkpoint at its transition count."""
    config = json.loads(json.dumps(meta.get("train_config") or {}))  # tuples as the stored JSON holds them
    if not config:
        return []
    rows = con.execute(
        "SELECT DISTINCT a.run_id, a.measurement, a.trial, a.training_seed, a.config FROM train_attempts a "
        "JOIN runs r ON r.run_id = a.run_id AND r.contract_hash = ? "
        "JOIN train_checkpoints c ON c.run_id = a.run_id AND c.measurement = a.measurement AND c.trial = a.trial "
        "AND c.training_seed = a.training_seed AND c.attempt = a.attempt AND c.transition = ? ORDER BY ALL",
        [meta.get("contract_hash"), int(meta.get("transitions", -1))]).fetchall()
    return sorted({row[:4] for row in rows if json.loads(row[4]) == config})


def training_seeds(con, run_id: str, measurement: str, trial: str, training_seed: int) -> set[int]:
    """The seeds a training scored its (trial, training seed) pair's checkpoints on."""
    labels = [trial, f"{trial},seed={training_seed}"]  # the policy label without and with a seed list
    seeds = {row[0] for row in con.execute(
        "SELECT DISTINCT seed FROM episodes WHERE run_id = ? AND measurement = ? "
        "AND split_part(policy, '@', 1) IN (?, ?)",
        [run_id, measurement, *labels]).fetchall()}
    seeds |= {row[0] for row in con.execute(
        "SELECT DISTINCT eval_seed FROM train_scores WHERE run_id = ? AND measurement = ? AND trial = ? "
        "AND training_seed = ?", [run_id, measurement, trial, training_seed]).fetchall()}
    return seeds


def seed_ranges(seeds) -> str:
    """'5000-5029, 6001' for a set of seeds."""
    ordered, parts = sorted(seeds), []
    for seed in ordered:
        if parts and seed == parts[-1][1] + 1:
            parts[-1][1] = seed
        else:
            parts.append([seed, seed])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts)


def _trainings(con, path: Path, sha256: str) -> tuple[list[tuple], str]:
    """The trainings that wrote the checkpoint at `path` (an ONNX file: the checkpoint its export
    recorded), and how they were found or why none was."""
    if path.suffix == ".onnx":
        from breakout_core.conversion.export import META_PREFIX, inspect_onnx

        recorded = inspect_onnx(path).metadata.get(META_PREFIX + "checkpoint_sha256")
        if not recorded:
            return [], "an ONNX file that records no checkpoint it was exported from"
        return _by_sha256(con, recorded), "sha256 of the checkpoint the ONNX export records"
    from breakout_core.learning.qnetwork import load_checkpoint

    found = _by_sha256(con, sha256)
    if found:
        return found, "sha256 of a checkpoint file the training wrote"
    return (_by_metadata(con, load_checkpoint(path)[1]),
            "the checkpoint's training config, contract and transition count")


def selection_of(con, path: str | Path, sha256: str, seeds: list[int]) -> dict:
    """The policy_files columns saying whether `seeds` overlap the selection seeds of the
    training that wrote the checkpoint (or the ONNX file's checkpoint) at `path`."""
    trainings, lineage = _trainings(con, Path(path), sha256)
    if not trainings:
        return {"selection": UNKNOWN, "selection_overlap": None, "selection_seeds": None, "selection_trainings": None,
                "lineage": f"unknown: {lineage}" if lineage.startswith("an ONNX") else
                "unknown: no training in this database wrote this file"}
    chosen_on: set[int] = set()
    found = []
    for run_id, measurement, trial, training_seed in trainings:
        pair_seeds = training_seeds(con, run_id, measurement, trial, training_seed)
        chosen_on |= pair_seeds
        found.append({"run_id": run_id, "measurement": measurement, "trial": trial, "training_seed": training_seed,
                      "seeds": seed_ranges(pair_seeds)})
    overlap = len(chosen_on & set(seeds))
    return {"selection": SELECTION_SEEDS if overlap else HELD_OUT, "selection_overlap": overlap,
            "selection_seeds": len(chosen_on), "selection_trainings": json.dumps(found), "lineage": lineage}


def describe(policy: str, selection: str | None, overlap: int | None, seeds: int) -> str:
    """One line a reader sees beside the policy's figures."""
    if selection == HELD_OUT:
        return f"{policy}: held out (none of its {seeds} seeds is one its training chose it on)"
    if selection == SELECTION_SEEDS:
        return f"{policy}: played on the seeds it was chosen on ({overlap} of its {seeds} seeds)"
    return f"{policy}: unknown whether held out (no stored training wrote this file)"
