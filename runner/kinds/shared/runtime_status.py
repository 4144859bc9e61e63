"""The `runtime_status` table, shared by every kind that runs runtimes: one row per runtime
of a measurement, available with what actually ran (describe()) and its load time, or
unavailable with the reason. Verdicts that need an unavailable runtime say `unavailable`
with that reason; the report shows the table first.

Its columns are read by field from the runtime's `ActualRun` (breakout_core.runtimes.actual):
the device, provider and precision that ran, where its nodes ran and, where the backend says
so, an INT8 file's quantized nodes (the source
graph's, as its quantizer recorded them), how many nodes ran integer kernels, and, for a
runtime on the CPU, its INT8 instruction sets: `cpu_int8_dot_product` is true only with
AVX-512 VNNI, AVX-VNNI or AMX, so a figure from an AVX2-only CPU is never read as one from a
VNNI CPU."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from runner.store import schema

if TYPE_CHECKING:
    from breakout_core.runtimes.actual import ActualRun

MIGRATIONS = [
    (
        "0400_runtime_status",
        """
        CREATE TABLE runtime_status (
            run_id VARCHAR NOT NULL,
            measurement VARCHAR NOT NULL,
            runtime VARCHAR NOT NULL,
            backend VARCHAR NOT NULL,
            artifact VARCHAR NOT NULL,
            artifact_sha256 VARCHAR,
            precision VARCHAR NOT NULL,
            requested JSON NOT NULL,
            available BOOLEAN NOT NULL,
            reason VARCHAR,
            runtime_describe JSON,
            load_s DOUBLE,
            recorded_at TIMESTAMPTZ NOT NULL
        )
        """,
    ),
    (
        "0401_runtime_status_int8",
        """
        ALTER TABLE runtime_status ADD COLUMN quantized_nodes JSON;
        ALTER TABLE runtime_status ADD COLUMN integer_kernels INTEGER;
        ALTER TABLE runtime_status ADD COLUMN cpu_int8_dot_product BOOLEAN;
        ALTER TABLE runtime_status ADD COLUMN cpu_isa JSON;
        """,
    ),
    (
        "0402_runtime_status_actual",
        """
        ALTER TABLE runtime_status ADD COLUMN device VARCHAR;
        ALTER TABLE runtime_status ADD COLUMN provider VARCHAR;
        ALTER TABLE runtime_status ADD COLUMN actual_precision VARCHAR;
        ALTER TABLE runtime_status ADD COLUMN software_device BOOLEAN;
        ALTER TABLE runtime_status ADD COLUMN nodes_by_provider JSON;
        ALTER TABLE runtime_status ADD COLUMN nodes_off_provider JSON;
        UPDATE runtime_status SET device = runtime_describe->>'$.actual.device',
            provider = runtime_describe->>'$.actual.provider',
            actual_precision = runtime_describe->>'$.actual.precision',
            software_device = coalesce(CAST(runtime_describe->>'$.actual.adapter.software' AS BOOLEAN), false),
            nodes_by_provider = runtime_describe->'$.actual.nodes_by_provider',
            nodes_off_provider = runtime_describe->'$.actual.nodes_not_on_requested_provider'
        WHERE json_extract(runtime_describe, '$.actual') IS NOT NULL;
        """,
    ),
]

VIEWS = [
    """
    CREATE OR REPLACE VIEW runtime_summary AS
    SELECT run_id, measurement, runtime, backend, precision, available, reason,
           device, provider, actual_precision, software_device, nodes_by_provider, nodes_off_provider,
           load_s, artifact, artifact_sha256,
           json_array_length(quantized_nodes) AS quantized_node_count, integer_kernels,
           cpu_int8_dot_product, cpu_isa->>'$.avx512_vnni' AS cpu_avx512_vnni, cpu_isa->>'$.avx2' AS cpu_avx2,
           cpu_isa->>'$.avx512f' AS cpu_avx512f,
           runtime_describe->>'$.actual.model_metadata."breakout.input_source"' AS input,
           runtime_describe->>'$.actual.model_metadata."breakout.input_adapter"' AS input_adapter,
           CAST(runtime_describe->>'$.actual.static_batch' AS INTEGER) AS static_batch
    FROM runtime_status
    """,
]

schema.declare("runtime_status", MIGRATIONS, VIEWS)


def record(ctx, row: dict[str, Any], available: bool, reason: str | None, describe: dict | None = None,
           actual: "ActualRun | None" = None) -> None:
    """One runtime_status row: `row` names the runtime and its artifact; when it loaded, its
    describe() (stored as JSON) and its ActualRun, whose fields fill the columns."""
    from runner.store.database import utcnow

    int8 = actual.int8 if actual is not None else None
    isa = actual.cpu_isa if actual is not None else None
    kernels = int8.integer_kernels if int8 is not None else None
    quantized = int8.nodes_quantized if int8 is not None else None
    ctx.store.append_rows("runtime_status", [{
        **row, "available": available, "reason": reason or None, "recorded_at": utcnow(),
        "runtime_describe": None if describe is None else json.dumps(describe, default=str),
        "quantized_nodes": None if quantized is None else json.dumps(list(quantized)),
        "integer_kernels": None if kernels is None else len(kernels),
        "cpu_int8_dot_product": None if isa is None else isa.get("int8_dot_product"),
        "cpu_isa": None if isa is None else json.dumps(isa),
        "device": None if actual is None else actual.device,
        "provider": None if actual is None else actual.provider,
        "actual_precision": None if actual is None else actual.precision,
        "software_device": None if actual is None else actual.software_device,
        "nodes_by_provider": None if actual is None or actual.nodes_by_provider is None
        else json.dumps(actual.nodes_by_provider),
        "nodes_off_provider": None if actual is None or actual.nodes_not_on_requested_provider is None
        else json.dumps(list(actual.nodes_not_on_requested_provider))}])


def unavailable_reason(con, run_id: str, measurements, runtimes) -> str | None:
    """Why any of `runtimes` could not run in any of `measurements` of a run (None: all ran)."""
    measurements = [m for m in measurements if m]
    runtimes = [r for r in runtimes if r]
    if not measurements or not runtimes:
        return None
    rows = con.execute(
        f"SELECT DISTINCT runtime, backend, reason FROM runtime_status WHERE run_id = ? AND NOT available "
        f"AND measurement IN ({', '.join('?' * len(measurements))}) AND runtime IN ({', '.join('?' * len(runtimes))}) "
        f"ORDER BY runtime", [run_id, *measurements, *runtimes]).fetchall()
    if not rows:
        return None
    return "; ".join(f"runtime {name} ({backend}) unavailable here: {reason}" for name, backend, reason in rows)


def with_unavailable(found: dict, con, run_id: str, measurements, runtimes) -> dict:
    """`found` metrics, marked with why a runtime they need could not run (verdict: unavailable)."""
    reason = unavailable_reason(con, run_id, measurements, runtimes)
    if reason:
        found["unavailable_reason"] = reason
    return found


def found_unavailable(ctx, measurement: str, runtime: str) -> bool:
    """On --resume: this runtime was already found unavailable in this measurement (its row stands)."""
    return ctx.already_stored("runtime_status", measurement, runtime=runtime, available=False)


def runtimes_ran(con, run_id: str) -> list[dict]:
    """Each runtime of a run, in order of recording: its measurement, the file it was given and
    the sha256 of the bytes it loaded (null where it could not run)."""
    rows = con.execute("SELECT measurement, runtime, artifact, artifact_sha256, available FROM runtime_status "
                       "WHERE run_id = ? ORDER BY recorded_at, measurement, runtime", [run_id]).fetchall()
    return [dict(zip(("measurement", "runtime", "artifact", "artifact_sha256", "available"), row)) for row in rows]


def runtime_sections(con, run_id: str, measurement: str) -> list:
    """The report's runtime table (none when no runtime was recorded), to start a kind's sections:
    each runtime's availability, reason, what actually ran and the sha256 of the file it loaded."""
    from runner.report.html import blank_nulls, table_html
    from runner.report.section import Section

    frame = con.execute(
        "SELECT runtime, backend, precision, available, reason, device, provider, actual_precision, "
        "nodes_by_provider, nodes_off_provider, quantized_node_count, integer_kernels, cpu_int8_dot_product, "
        "input, input_adapter, static_batch, load_s, left(artifact_sha256, 12) AS artifact_sha256 "
        "FROM runtime_summary WHERE run_id = ? AND measurement = ? "
        "ORDER BY runtime", [run_id, measurement]).df()
    if frame.empty:
        return []
    return [Section(f"{measurement}: runtimes (requested, available here, what actually ran)",
                    html=table_html(blank_nulls(frame)))]
