"""Pieces of the spec language shared by every measurement kind."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Annotated, Literal, Union

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationInfo,
    field_validator,
    model_validator,
)

from breakout_core.game.contract import DEFAULT_CONTRACT, MAX_EPISODE_SEED, MAX_REPEAT_ACTION_PROBABILITY
from runner.spec.seed_pools import CHECK_RANGE, DRAWABLE, confirmation_overlap, shown

NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_\-]*$"  # safe as a file name and a SQL string
Name = Annotated[str, Field(pattern=NAME_PATTERN, max_length=64)]
# what a verdict compares: a policy, runtime or trial name such as "num_envs=2,seed=42"
Participant = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_\-=.,@:+]*$", max_length=200)]


def spec_relative(path: str, info: ValidationInfo) -> Path:
    """A path written in a spec, resolved against the spec file's folder (validation context
    `base_dir`; as written when there is none)."""
    base = (info.context or {}).get("base_dir")
    return Path(base, path) if base is not None else Path(path)


def checks_files(info: ValidationInfo) -> bool:
    """Whether this validation checks that named files exist (context `check_files`, default yes)."""
    return (info.context or {}).get("check_files", True)


MAX_SEED = MAX_EPISODE_SEED  # ALE's sticky-action seed (a C int); the store's BIGINT holds more
MAX_SEEDS = 100_000  # seeds in one list or range


class StrictModel(BaseModel):
    """Every spec model refuses unknown keys and is immutable once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)  # "4" or true is not a count


class SeedRange(StrictModel):
    start: int = Field(ge=0, le=MAX_SEED, description="first episode seed")
    count: int = Field(gt=0, le=MAX_SEEDS, description="how many consecutive seeds")

    @model_validator(mode="after")
    def _last_fits(self) -> "SeedRange":
        if self.start + self.count - 1 > MAX_SEED:
            raise ValueError(f"the last seed, {self.start + self.count - 1}, is above {MAX_SEED}, the largest "
                             "episode seed (ALE's sticky-action seed is a 32-bit int)")
        if problem := confirmation_overlap(range(self.start, self.start + self.count)):
            raise ValueError(problem)
        return self

    def values(self) -> list[int]:
        return list(range(self.start, self.start + self.count))


def _check_seed_list(value: list[int]) -> list[int]:
    if not value:
        raise ValueError("the seed list is empty")
    if len(value) > MAX_SEEDS:
        raise ValueError(f"{len(value)} seeds; a list holds at most {MAX_SEEDS}, as {{start, count}} does")
    if any(s < 0 or s > MAX_SEED for s in value):
        raise ValueError(f"seeds must be from 0 to {MAX_SEED}, the largest episode seed "
                         "(ALE's sticky-action seed is a 32-bit int)")
    if len(set(value)) != len(value):
        raise ValueError("seeds must be distinct")
    if problem := confirmation_overlap(value):
        raise ValueError(problem)
    return value


def _check_one_seed(value: int) -> int:
    if problem := confirmation_overlap([value]):
        raise ValueError(problem)
    return value


# one episode seed a spec names (a closed loop's game, a GIF's): in range, and never a confirmation seed
EpisodeSeed = Annotated[int, Field(ge=0, le=MAX_SEED), AfterValidator(_check_one_seed)]

# a list of seeds or {start, count}; the input's own shape picks the branch, so a bad
# range is not also reported as "not a list"
Seeds = Annotated[
    Union[Annotated[list[int], AfterValidator(_check_seed_list), Tag("list")], Annotated[SeedRange, Tag("range")]],
    Discriminator(lambda v: "list" if isinstance(v, list) else "range"),
]


def seed_list(seeds: "list[int] | SeedRange") -> list[int]:
    if isinstance(seeds, DrawnSeeds):
        raise TypeError("drawn seeds are known once the run draws them: runner.kinds.shared.drawn_seeds")
    return seeds.values() if isinstance(seeds, SeedRange) else list(seeds)


class DrawnSeeds(StrictModel):
    """Seeds drawn for the candidate when the run starts (runner.spec.seed_pools)."""

    drawn: int = Field(gt=0, le=MAX_SEEDS, description=f"how many seeds to draw from the reserved range "
                       f"{shown(CHECK_RANGE)}, keyed by the sha256 of the candidate files, so new files play new "
                       "games; `--confirm` draws from the confirmation range instead")


# what a kind that plays a candidate's games takes: explicit seeds, or seeds drawn for it
PlayedSeeds = Annotated[
    Union[Annotated[list[int], AfterValidator(_check_seed_list), Tag("list")], Annotated[SeedRange, Tag("range")],
          Annotated[DrawnSeeds, Tag("drawn seeds")]],
    Discriminator(lambda v: "list" if isinstance(v, list) else
                  "drawn seeds" if isinstance(v, DrawnSeeds) or (isinstance(v, dict) and "drawn" in v) else "range"),
]


def seed_count(seeds: "list[int] | SeedRange | DrawnSeeds") -> int:
    return seeds.drawn if isinstance(seeds, DrawnSeeds) else len(seed_list(seeds))


def possible_seeds(seeds: "list[int] | SeedRange | DrawnSeeds") -> "list[int] | range":
    """Every seed these may play: drawn seeds may be any of the reserved ranges'."""
    return DRAWABLE if isinstance(seeds, DrawnSeeds) else seed_list(seeds)


class ContractSpec(StrictModel):
    """A named contract, optionally with fields changed (the hash records the change)."""

    name: str = Field(default=DEFAULT_CONTRACT, description="a shipped preset (docs/contracts.md)")
    max_episode_frames: int | None = Field(default=None, gt=0)
    noop_start_max: int | None = Field(default=None, ge=0)
    repeat_action_probability: float | None = Field(default=None, ge=0.0, le=MAX_REPEAT_ACTION_PROBABILITY)
    serve_after_life_loss: bool | None = Field(default=None, description="a forced FIRE after each lost life")
    full_action_space: bool | None = Field(
        default=None, description="ALE's 18 legal actions, the agent's outputs in ALE's order, as ale-py's "
        "full_action_space=True (else Breakout's minimal 4); a model gives one Q-value per action")
    other_contracts: Literal["refused", "deliberate"] = Field(
        default="refused", description="checkpoints trained under another contract: refused when the spec loads, "
        "or used deliberately (e.g. a breakout-v2 agent played under breakout-v3); fixed states must always be "
        "captured under the spec's own contract")

    @field_validator("name")
    @classmethod
    def _known(cls, name: str) -> str:
        from breakout_core.game.contract import CONTRACTS

        if name not in CONTRACTS:
            raise ValueError(f"unknown contract {name!r}; known: {', '.join(sorted(CONTRACTS))}")
        return name

    def build(self):
        from breakout_core.game.contract import contract_by_name

        changes = {k: v for k, v in self.model_dump(exclude={"name", "other_contracts"}).items() if v is not None}
        return contract_by_name(self.name).replace(**changes)


class RandomPolicySpec(StrictModel):
    type: Literal["random"]


class CheckpointPolicySpec(StrictModel):
    type: Literal["checkpoint"]
    path: str = Field(description="checkpoint file, relative to the spec file")
    epsilon: float = Field(default=0.0, ge=0.0, le=1.0)
    runtime: Literal["torch"] = "torch"

    @field_validator("path")
    @classmethod
    def _exists(cls, path: str, info: ValidationInfo) -> str:
        resolved = spec_relative(path, info)
        if checks_files(info) and not resolved.is_file():
            raise ValueError(f"model file not found: {resolved}")
        return str(resolved)


PolicySpec = Annotated[Union[RandomPolicySpec, CheckpointPolicySpec], Field(discriminator="type")]

_RULE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)\s*$")


def parse_rule(text: str) -> tuple[str, float]:
    """'>= 1.0' -> ('>=', 1.0). Rules are comparisons with a number, never code."""
    match = _RULE.match(text)
    if match is None:
        raise ValueError(f"rule {text!r} is not '<op> <number>' with op one of >= <= > < == !=")
    number = float(match.group(2))
    if not math.isfinite(number):
        raise ValueError(f"rule {text!r}: {match.group(2)} is beyond what a float holds")
    return match.group(1), number


def _check_rule(text: str) -> str:
    parse_rule(text)
    return text


Rule = Annotated[str, AfterValidator(_check_rule)]


OUTCOMES = ("deployment-worthy", "rejected", "inconclusive", "unavailable")

# What a check of one file against another asks (runner.spec.questions says which, and why)
Question = Literal["identical", "as-good"]


class VerdictSpec(StrictModel):
    name: Name
    measurement: Name
    candidate: Participant
    baseline: Participant | None = Field(default=None, description="omit for a verdict on the candidate alone")
    deployment_worthy_when: dict[str, Rule] = Field(min_length=1)
    labels: dict[Literal["deployment-worthy", "rejected", "inconclusive", "unavailable"], str] = Field(
        default_factory=dict, description="words shown beside an outcome, e.g. {deployment-worthy: healthy}")
    diagnostic_for: list[Question] = Field(
        default_factory=list, description="the questions under which this verdict is shown and does not gate "
                                          "(`runner check`: identical, as-good)")

    @model_validator(mode="after")
    def _distinct(self) -> "VerdictSpec":
        if self.candidate == self.baseline:
            raise ValueError("candidate and baseline must differ")
        return self
