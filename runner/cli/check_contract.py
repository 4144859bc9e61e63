"""The game `runner check` plays: the contract a `--contract` preset and the `--set` arguments make
of the check spec, said in words before anything runs, and the fixed states it needs under it.

A contract other than the check spec's own (breakout-v3) needs fixed states captured under it:
the shipped ones are breakout-v3 states. The reference agent plays the chosen game
deliberately, from its FP32 ONNX file, as a user's baseline file plays
(runner.cli.check_inputs.baseline_states: 60 states captured once per file and contract, kept
under runs/baseline_states/; played under breakout-v3 they are the shipped
fixed_states_60.npz, state for state); without `--baseline`, the reference FP32 file is the
baseline played in that game. A `--set artifacts.fixed_states...` of the user's comes after
and wins.
"""

from __future__ import annotations

from pathlib import Path

from breakout_core.game.contract import DEFAULT_CONTRACT, Contract, contract_by_name
from runner.cli.exit_codes import ExitCode, fail

REFERENCE_ONNX = Path(__file__).resolve().parents[2] / "models" / "reference" / "dqn_breakout.onnx"


def played_contract(spec_path: Path, overrides: tuple[str, ...]) -> Contract:
    """The contract `spec_path` plays with `overrides` laid on it, read before any file is. Where they
    do not make one, the spec's problems are said as `runner run` says them, and exit 2."""
    from pydantic import ValidationError

    from runner.cli.spec_loading import load_or_exit
    from runner.spec.extends import resolve_extends
    from runner.spec.fields import ContractSpec
    from runner.spec.overrides import apply_overrides
    from runner.spec.yaml_source import SpecSourceError, load_yaml

    try:
        data = apply_overrides(resolve_extends(load_yaml(spec_path)), overrides).data
        return ContractSpec.model_validate(data.get("contract") or {}).build()
    except (SpecSourceError, ValidationError, AttributeError):
        return load_or_exit(spec_path, overrides, check_files=False).spec.contract.build()


def contract_sets(contract: Contract, baseline: Path | None, overrides: tuple[str, ...] = ()) -> list[str]:
    """The `--set` arguments a check under `contract` needs besides the contract itself.

    Under another game than the shipped fixed states', the states are the reference agent's
    under that game (unless `overrides` name the user's own); without a baseline of the user's
    own, the reference FP32 file plays that game deliberately (it was trained under breakout-v3)."""
    if contract.hash == contract_by_name(DEFAULT_CONTRACT).hash:
        return []
    own_states = any(o.startswith("artifacts.fixed_states") for o in overrides)
    states = [] if own_states else [f"artifacts.fixed_states.path={reference_states_under(contract)}"]
    return states if baseline is not None else ["contract.other_contracts=deliberate", *states]


def reference_states_under(contract: Contract) -> Path:
    """The reference agent's fixed states under `contract`, from its FP32 ONNX file's own games
    (6 full games, seeds 0-5, epsilon 0.05, as day22_export captures them), captured once and
    reused while the file is the same."""
    from breakout_core.conversion.input_convention import InputConvention
    from runner.cli.check_inputs import baseline_states

    try:
        return baseline_states(REFERENCE_ONNX, REFERENCE_ONNX, InputConvention(), contract, "reference").resolve()
    except KeyboardInterrupt:
        fail("interrupted while capturing the fixed states; nothing was stored", ExitCode.INTERRUPTED)
    except (OSError, ValueError) as exc:
        fail(f"capturing the fixed states under {contract.name} failed: {exc}", ExitCode.ENVIRONMENT)


def unlabelled_line(models: dict[str, Path | None], contract: Contract) -> str | None:
    """One line for the model files (by their argument) that record no contract: the game they are
    judged in anyway."""
    from breakout_core.conversion.export import onnx_contract

    bare = [f"{label} {path}" for label, path in models.items() if path is not None and onnx_contract(path)[1] is None]
    if not bare:
        return None
    records = "records no contract in its" if len(bare) == 1 else "record no contract in their"
    return (f"{' and '.join(bare)} {records} metadata: judged under {contract.name} ({contract.hash}); "
            "--contract names another game")
