"""States from the agent's own games under the spec's contract: the export kind's fixed states and
the repair kind's calibration states are captured alike (breakout_core.evaluation.fixed_states), from the
spec's checkpoint or an ONNX file of the agent, on the seeds the spec declares."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from runner.spec.fields import Seeds, StrictModel, seed_list


class CaptureSpec(StrictModel):
    episode_seeds: Seeds = Field(default_factory=lambda: list(range(6)), description="one game per seed")
    epsilon: float = Field(default=0.05, ge=0.0, le=1.0, description="a little exploration so play does not loop")
    policy_seed: int = Field(default=0, ge=0)
    batch_size: int = Field(default=6, ge=1, le=64, description="games played side by side")
    max_steps_per_episode: int | None = Field(default=None, ge=1, description="agent steps; None: full games")
    candidates_per_episode: int = Field(default=256, ge=2)


def capture_states(ctx, checkpoint: str | Path, n_states: int, capture: CaptureSpec):
    """`n_states` states (breakout_core.evaluation.fixed_states.FixedStates) spread over the checkpoint's own
    games on the capture's seeds, under the spec's contract (another contract's checkpoint only
    where the spec says that is deliberate)."""
    from breakout_core.evaluation.fixed_states import capture_from_checkpoint

    return capture_from_checkpoint(
        checkpoint, n_states=n_states, episode_seeds=seed_list(capture.episode_seeds), epsilon=capture.epsilon,
        contract=ctx.contract, other_contract_deliberate=ctx.spec.contract.other_contracts == "deliberate",
        policy_seed=capture.policy_seed, batch_size=capture.batch_size,
        max_steps_per_episode=capture.max_steps_per_episode, candidates_per_episode=capture.candidates_per_episode)


def capture_onnx_states(ctx, name: str, n_states: int, capture: CaptureSpec, what: str):
    """(states, sha256 of the file) from the games of ONNX artifact `name` itself, fed through its
    declared input's adapter (runner.kinds.shared.model_inputs), as `capture_states` captures a
    checkpoint's; the adapted copy is held to the file the run recorded."""
    from breakout_core.evaluation.fixed_states import capture_from_onnx
    from runner.kinds.shared.model_inputs import adapted_source_sha256, runtime_file

    playable = runtime_file(ctx, name)
    with ctx.files.loaded(name, what) as (path, sha256):
        adapted_from = adapted_source_sha256(playable) if playable.resolve() != path.resolve() else None
        if adapted_from is not None:
            ctx.files.check(name, adapted_from, what)
        states = capture_from_onnx(
            playable, ctx.contract, n_states=n_states, episode_seeds=seed_list(capture.episode_seeds),
            epsilon=capture.epsilon, source=path, policy_seed=capture.policy_seed, batch_size=capture.batch_size,
            max_steps_per_episode=capture.max_steps_per_episode,
            candidates_per_episode=capture.candidates_per_episode)
    return states, sha256
