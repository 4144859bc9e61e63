"""The shipped specs as every test that reads them all loads them: each spec in specs/ but the
base-only ones, where this CPU can run it. The bf16 study asks for bf16, which a CPU that would
emulate it refuses at the spec's line (as it must): there it is left out, and only for that."""

from __future__ import annotations

import re
from pathlib import Path

from runner.spec.document import LoadedSpec, SpecError, load_spec
from runner.spec.extends import is_base_only

SPECS = Path(__file__).resolve().parents[1] / "specs"
BF16_REFUSED = re.compile(r".*/learner_bf16_study\.yaml:\d+: measurements\[0\]\.sweep\.learner_precision.*: "
                          r"learner_precision bf16 needs a CPU with AMX or avx512_bf16; .*")


def but_bf16_refused_here(problems: list[str]) -> list[str]:
    """`problems` less the bf16 study's refusal, on a CPU that would emulate bf16 (as it must be)."""
    from test_learner_precision import this_cpu_runs_bf16

    return problems if this_cpu_runs_bf16() else [line for line in problems if not BF16_REFUSED.fullmatch(line)]


def shipped_specs(pattern: str = "*.yaml") -> list[tuple[Path, LoadedSpec]]:
    """(path, loaded) of each shipped spec matching `pattern` that this CPU can run; any other
    problem is raised."""
    loaded = []
    for path in sorted(SPECS.glob(pattern)):
        if is_base_only(path):
            continue
        try:
            loaded.append((path, load_spec(path)))
        except SpecError as exc:
            if but_bf16_refused_here(exc.problems):
                raise
    return loaded
