"""Whether a spec that a run stored (its text, or its settings) is shaped as a spec, whatever
runner stored it: `runner compare` and `runner import` read such specs without validating
them against this runner's model."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from runner.kinds.shared.episode_scores import BootstrapSpec


def stored_spec_problem(tree: Any) -> str | None:
    """Why a stored spec (a run's text read as YAML, or its settings) is not shaped as a spec,
    whatever runner stored it: a mapping whose policies, artifacts and runtimes are mappings and
    whose measurements are a list of mappings, each with a name. None when it is."""
    if not isinstance(tree, dict):
        return f"a spec is a mapping of keys, not {type(tree).__name__}"
    for key in ("policies", "artifacts", "runtimes"):
        section = tree.get(key, {})
        if not isinstance(section, dict) or not all(isinstance(entry, dict) for entry in section.values()):
            return f"{key} is not a mapping of named mappings"
    measurements = tree.get("measurements", [])
    if not isinstance(measurements, list) or not all(
            isinstance(m, dict) and isinstance(m.get("name"), str) and isinstance(m.get("kind"), str)
            for m in measurements):
        return "measurements is not a list of named measurements, each of a kind"
    for m in measurements:  # compare draws its intervals with a measurement's own bootstrap settings
        try:
            BootstrapSpec.model_validate(m.get("bootstrap") or {})
        except ValidationError as exc:
            return f"measurement {m['name']}: bootstrap is not valid ({exc.errors()[0]['msg']})"
    return None
