"""Exports must come from the spec's own checkpoint: an ONNX file or fixed states made from
other weights are refused before any runtime runs them."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

# (run id, artifact name) pairs already checked: each file is read once per run, not per runtime
_CHECKED: set[tuple[str, str]] = set()


def check_lineage(ctx, names) -> None:
    """Refuse ONNX files or fixed states made from another checkpoint than the spec's own.

    An export records the sha256 of the checkpoint it came from (ONNX metadata, fixed-states
    header). When the spec also names that checkpoint and its file changed since (a newer
    checkpoint copied in place), comparing torch on the new weights with ONNX Runtime on the
    old ones would measure the wrong thing: the run stops and says which spec to run again."""
    from breakout_core.evaluation.fixed_states import file_sha256

    artifacts = ctx.spec.artifacts
    checkpoints = {file_sha256(a.path): n for n, a in artifacts.items()
                   if a.type == "checkpoint" and Path(a.path).is_file()}
    if not checkpoints:
        return
    for name in names:
        if (ctx.run_id, name) in _CHECKED or name not in artifacts:
            continue
        artifact = artifacts[name]
        recorded = None
        if artifact.type == "onnx":
            from breakout_core.conversion.export import inspect_onnx
            from breakout_core.conversion.onnx_checks import META_PREFIX

            recorded = inspect_onnx(artifact.path).metadata.get(META_PREFIX + "checkpoint_sha256") or None
        elif artifact.type == "fixed_states":
            with np.load(artifact.path, allow_pickle=False) as data:
                recorded = json.loads(str(data["header"])).get("checkpoint_sha256")
        if recorded and recorded not in checkpoints:
            maker = f"run `runner run` on spec {artifact.made_by!r} again" if artifact.made_by else "export it again"
            own = ", ".join(f"{n} {s[:12]}" for s, n in checkpoints.items())
            raise ValueError(f"artifacts.{name} ({artifact.path}) was made from a checkpoint with sha256 "
                             f"{recorded[:12]}, but this spec's checkpoint(s) are {own}: "
                             f"{maker} so that every runtime runs the same weights")
        _CHECKED.add((ctx.run_id, name))
