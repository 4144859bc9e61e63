"""What a loaded runtime actually ran, as a typed record every backend fills in.

The fields are what the runner reads of every backend (runtime_status's columns and views,
the episodes kind's device): a backend sets them, and puts everything else it knows in
`details`. `as_json()` is the stored form (runtime_status.runtime_describe's `actual`): the
fields, then the details beside them, so a stored description reads as one flat object.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class Int8Run:
    """An INT8 file: how its quantizer made it (its metadata) and what ran on integers."""

    method: str | None = None  # the quantizer's method as the file records it ("static", "dynamic")
    calibrate_method: str | None = None
    nodes_quantized: tuple[str, ...] | None = None  # the source graph's nodes; None: the file does not say
    nodes_excluded: tuple[str, ...] = ()  # nodes kept in float on request
    integer_kernels: tuple[str, ...] | None = None  # nodes (or layers) that computed on integers; None: not read

    @classmethod
    def from_metadata(cls, metadata: dict[str, str], integer_kernels: tuple[str, ...] | None) -> "Int8Run":
        """The record of an INT8 file from what its quantizer wrote (breakout_core.conversion.quantize's
        `breakout.int8_*` metadata) and what a backend saw run on integers."""
        recorded = metadata.get("breakout.int8_nodes_quantized")
        return cls(
            method=metadata.get("breakout.int8_method"),
            calibrate_method=metadata.get("breakout.int8_calibrate_method") or None,
            nodes_quantized=tuple(recorded.split(",")) if recorded else None,
            nodes_excluded=tuple(n for n in metadata.get("breakout.int8_nodes_excluded", "").split(",") if n),
            integer_kernels=integer_kernels,
        )


@dataclass(frozen=True)
class ActualRun:
    """What ran: read back from the backend's library after load(), never assumed from the request."""

    device: str  # "cpu", "cuda:0", or a description of the adapter
    precision: str  # "fp32", "fp16", "int8" or "bf16": what it computed in
    provider: str | None = None  # the execution provider or plugin that ran it, where the library has one
    software_device: bool = False  # the device is emulated on the CPU (WebGPU on SwiftShader)
    cpu_isa: dict[str, Any] | None = None  # for a run on the CPU: quantize.cpu_isa()
    int8: Int8Run | None = None  # for an INT8 file
    nodes_by_provider: dict[str, int] | None = None  # where its placement was read: nodes per provider
    nodes_not_on_requested_provider: tuple[str, ...] | None = None
    details: dict[str, Any] = field(default_factory=dict)  # the backend's own facts, stored beside the fields

    def __post_init__(self) -> None:
        clash = sorted(set(self.details) & {f.name for f in fields(self)})
        if clash:
            raise ValueError(f"details may not repeat the fields of ActualRun: {clash}")

    def as_json(self) -> dict[str, Any]:
        """The fields (tuples as lists, the INT8 record as an object) and the details, in one object."""
        found = {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name != "details"}
        return {**found, **self.details}


def _plain(value: Any) -> Any:
    if isinstance(value, Int8Run):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, tuple):
        return list(value)
    return value
