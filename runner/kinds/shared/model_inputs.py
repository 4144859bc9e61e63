"""The file a runtime loads for an artifact: the file itself, or, for an ONNX model whose input is
not the agent's uint8 observations (its `input:` convention, or its own `breakout.input`
metadata), that file with the input adapter in front, written under the run's folder
(runs/<run_id>/inputs/<artifact>.onnx) and checked on the spec's fixed states. The adapted file
records the adapter and its source's sha256 in its metadata, which runtime_status keeps in the
runtime's description."""

from __future__ import annotations

from pathlib import Path

import numpy as np

ADAPTED_FOLDER = "inputs"
CHECK_STATES = 60  # states the adapter is checked on when the spec has no fixed states


def runtime_file(ctx, name: str) -> Path:
    """The path a runtime loads for artifact `name` (adapted once per run, then reused)."""
    import onnx

    from breakout_core.common.hashing import model_sha256
    from breakout_core.conversion import input_convention as inputs

    artifact = ctx.spec.artifacts[name]
    path = Path(artifact.path)
    if artifact.type != "onnx":
        return path
    model = onnx.load(path, load_external_data=False)
    declared = inputs.InputConvention.parse(artifact.input) if artifact.input else inputs.declared_in(model)
    _, dtype, shape = inputs.model_input(model)
    plain = dtype == "uint8" and tuple(shape[1:]) != (84, 84, 4)
    if declared is None and plain and not inputs.needs_adapter(model, inputs.InputConvention()):
        return path  # the agent's own observations: the runtime checks the rest
    convention = inputs.convention_of(model, declared)
    if not inputs.needs_adapter(model, convention):
        return path
    target = Path(ctx.artifacts_dir) / ADAPTED_FOLDER / f"{name}.onnx"
    if target.is_file():
        meta = _metadata(target)
        if meta.get("breakout.input_source_sha256") == model_sha256(path) \
                and meta.get("breakout.input_source") == str(convention):
            return target
    inputs.write_adapted(path, convention, target, check_states(ctx))
    return target


def source_convention(ctx, name: str):
    """The input convention ONNX artifact `name` takes as it is (its `input:`, else its own
    metadata, else uint8): what a conversion of it keeps, and what its states are fed as."""
    import onnx

    from breakout_core.conversion import input_convention as inputs

    artifact = ctx.spec.artifacts[name]
    model = onnx.load(artifact.path, load_external_data=False)
    declared = inputs.InputConvention.parse(artifact.input) if artifact.input else inputs.declared_in(model)
    _, dtype, shape = inputs.model_input(model)
    if declared is None and dtype == "uint8" and tuple(shape[1:]) != (84, 84, 4):
        return inputs.InputConvention()  # the agent's own observations, fed as they are (whatever their size)
    return inputs.convention_of(model, declared)


def adapted_source_sha256(adapted: Path) -> str | None:
    """The sha256 of the file an adapted copy was made from, as its metadata records it."""
    return _metadata(adapted).get("breakout.input_source_sha256")


def _metadata(path: Path) -> dict[str, str]:
    import onnx

    return {p.key: p.value for p in onnx.load(path, load_external_data=False).metadata_props}


def check_states(ctx) -> np.ndarray:
    """The spec's first fixed states (uint8 (N, 4, 84, 84)), else seeded random observations."""
    from breakout_core.evaluation.fixed_states import load_fixed_states

    for artifact in ctx.spec.artifacts.values():
        if artifact.type == "fixed_states" and Path(artifact.path).is_file():
            return load_fixed_states(artifact.path).obs
    return np.random.default_rng(0).integers(0, 256, (CHECK_STATES, 4, 84, 84), dtype=np.uint8)
