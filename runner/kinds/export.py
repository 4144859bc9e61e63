"""`export` (Day 22): fixed states from real play of a checkpoint, and its ONNX FP32, FP16 and INT8 files.

The states come from full games of the checkpoint's own (slightly epsilon-greedy) play on
fixed episode seeds, spread over each game (breakout_core.evaluation.fixed_states); the FP32 ONNX
file is checked with onnx.checker and against torch on those very states (ONNX Runtime
CPU); the FP16 copy keeps uint8 in / float32 out. Every file is written under the run's
own folder, then published to the path its artifact names (made_by: this spec) in one
rename, and recorded in `export_files` with size, sha256 and the checks it passed;
`fixed_state_index` says where each state came from. INT8 files (`int8:`,
runner.kinds.shared.int8_files) are made from an FP32 file by ONNX Runtime's quantizer or by
NNCF's (`quantizer: nncf`), calibrated on states from the checkpoint's own games on seeds the rest of the spec never
plays; `int8_files` records how each was made.
"""

from __future__ import annotations

import json
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from runner.compare.rows import Row, RunSide, samples_row
from runner.kinds.kind import Kind
from runner.kinds.shared import int8_files
from runner.kinds.shared.int8_files import Int8Export
from runner.kinds.shared.state_capture import CaptureSpec, capture_states
from runner.report.section import Section
from runner.run.context import RunContext
from runner.spec.fields import Name, StrictModel, seed_list


class ExportMeasurement(StrictModel):
    kind: Literal["export"]
    name: Name
    checkpoint: Name = Field(description="artifact: the checkpoint to export")
    onnx: Name | None = Field(default=None, description="artifact written: the FP32 ONNX file")
    onnx_fp16: Name | None = Field(default=None, description="artifact written: the FP16 ONNX file")
    fixed_states: Name | None = Field(default=None, description="artifact written: the fixed states (.npz)")
    n_states: int = Field(default=60, ge=1, le=10_000)
    capture: CaptureSpec = CaptureSpec()
    opset: int = Field(default=18, ge=13, le=23)
    exporter: Literal["dynamo", "torchscript"] = "dynamo"
    int8: list[Int8Export] = Field(default_factory=list, description="INT8 files made with onnxruntime's "
                                   "quantizer or NNCF's")

    @model_validator(mode="after")
    def _something_written(self) -> "ExportMeasurement":
        if self.onnx_fp16 is not None and self.onnx is None:
            raise ValueError("onnx_fp16 is converted from the FP32 file: give `onnx:` too")
        if not self.outputs():
            raise ValueError("nothing to write: give `onnx:`, `fixed_states:` or `int8:`")
        return self

    def outputs(self) -> list[str]:
        own = [n for n in (self.onnx, self.onnx_fp16, self.fixed_states) if n is not None]
        return own + [variant.onnx for variant in self.int8]

    def references(self) -> list[tuple[tuple, str, str]]:
        refs = [(("checkpoint",), "artifact:checkpoint", self.checkpoint)]
        for field, what in (("onnx", "onnx"), ("onnx_fp16", "onnx"), ("fixed_states", "fixed_states")):
            if getattr(self, field) is not None:
                refs.append(((field,), f"artifact_out:{what}", getattr(self, field)))
        for j, variant in enumerate(self.int8):
            refs.append((("int8", j, "onnx"), "artifact_out:onnx", variant.onnx))
            if variant.source not in (None, self.onnx):  # its own FP32 file is written before it
                refs.append((("int8", j, "source"), "artifact:onnx", variant.source))
        return refs

    def episode_seeds(self) -> list[tuple[tuple, list[int]]]:
        """The games the fixed states are captured from."""
        return [(("capture", "episode_seeds"), seed_list(self.capture.episode_seeds))] if self.fixed_states else []

    def held_out_seeds(self) -> list[tuple[tuple, list[int]]]:
        """The calibration games: no other part of the spec may play them."""
        return [(("int8", j, "calibration", "episode_seeds"), seed_list(v.calibration.episode_seeds))
                for j, v in enumerate(self.int8) if v.calibration is not None]

    def spec_problems(self, spec, context: dict) -> list[tuple[tuple, str]]:
        return int8_files.problems(self.int8, self.onnx, spec, context.get("check_files", True))


MIGRATIONS = [
    (
        "0410_export",
        """
        CREATE TABLE export_files (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, artifact VARCHAR NOT NULL, path VARCHAR NOT NULL,
            format VARCHAR NOT NULL, precision VARCHAR, bytes BIGINT NOT NULL, sha256 VARCHAR NOT NULL,
            opset INTEGER, exporter VARCHAR, checks JSON, verify_states INTEGER, verify_max_abs_dq DOUBLE,
            contract_hash VARCHAR, checkpoint_sha256 VARCHAR, versions JSON, details JSON
        );
        CREATE TABLE fixed_state_index (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, state INTEGER NOT NULL,
            episode_seed BIGINT NOT NULL, step BIGINT NOT NULL, action INTEGER NOT NULL
        );
        """,
    )
]

VIEWS = [
    """
    CREATE OR REPLACE VIEW export_sizes AS
    SELECT f.run_id, f.measurement, f.artifact, f.format, f.precision, f.bytes, f.bytes / 1e6 AS megabytes,
           CASE WHEN f.format = 'onnx' THEN f.bytes / nullif(coalesce(i.source_bytes, b.bytes), 0) END AS size_vs_fp32,
           f.verify_states, f.verify_max_abs_dq
    FROM export_files f
    LEFT JOIN export_files b ON b.run_id = f.run_id AND b.measurement = f.measurement
         AND b.format = 'onnx' AND b.precision = 'fp32'
    LEFT JOIN int8_files i ON i.run_id = f.run_id AND i.measurement = f.measurement AND i.artifact = f.artifact
    """,
]

# size_vs_fp32: an FP16 file against the measurement's FP32 file, an INT8 file against the FP32 file it was made from
METRIC_NAMES = ("size_bytes", "size_ratio", "size_vs_fp32", "verify_max_abs_dq", "verify_states", "n_states")


def execute(m: ExportMeasurement, ctx: RunContext) -> None:
    """Each file is written under the run's folder, checked, then published to its artifact's
    path (runner.run.artifact_files); the checkpoint read is the one the run recorded."""
    if ctx.already_stored("export_files", m.name):
        return
    with ctx.files.loaded(m.checkpoint, f"measurement {m.name}") as (checkpoint, _):
        rows, index_rows = _export_own_files(m, ctx, checkpoint)
        provenance = []
        if m.int8:
            int8_rows, provenance = _export_int8(m, ctx, checkpoint)
            rows += int8_rows
    base = {"run_id": ctx.run_id, "measurement": m.name}
    columns = sorted({key for row in rows for key in row})  # Arrow takes its columns from the first row
    ctx.store.append_rows("export_files", [{key: row.get(key) for key in columns} for row in rows])
    ctx.store.append_rows("fixed_state_index", index_rows)
    ctx.store.append_rows("int8_files", provenance)
    ctx.store.append_rows("artifacts", [{**base, "label": f"{r['artifact']} ({r['format']})", "path": r["path"],
                                         "bytes": r["bytes"]} for r in rows])


def _export_own_files(m: ExportMeasurement, ctx: RunContext, checkpoint) -> tuple[list, list]:
    """The fixed states and the FP32 and FP16 ONNX files: their export_files and fixed_state_index rows."""
    from breakout_core.common.hashing import file_sha256
    from breakout_core.conversion.export import export_onnx
    from breakout_core.evaluation.fixed_states import save_fixed_states

    files = ctx.files
    base = {"run_id": ctx.run_id, "measurement": m.name}
    rows, index_rows, states = [], [], None
    deliberate = ctx.spec.contract.other_contracts == "deliberate"  # a checkpoint trained under another contract
    if m.fixed_states is not None:
        task = ctx.progress.add_task(f"{m.name} · capture {m.n_states} states", total=1, unit="capture")
        states = capture_states(ctx, checkpoint, m.n_states, m.capture)
        written = save_fixed_states(files.output_path(m.fixed_states), states)
        sha256 = file_sha256(written)
        path = files.publish(m.fixed_states, written, sha256)
        ctx.progress.advance(task)
        rows.append({**base, "artifact": m.fixed_states, "path": str(path), "format": "fixed_states",
                     "bytes": written.stat().st_size, "sha256": sha256, "contract_hash": states.contract_hash,
                     "checkpoint_sha256": states.checkpoint_sha256, "details": json.dumps(states.meta, default=str)})
        index_rows = [{**base, "state": i, "episode_seed": int(states.episode_seeds[i]), "step": int(states.steps[i]),
                       "action": int(states.actions[i])} for i in range(len(states))]

    if m.onnx is not None:
        task = ctx.progress.add_task(f"{m.name} · export ONNX", total=1, unit="export")
        result = export_onnx(checkpoint, files.output_path(m.onnx),
                             fp16_path=files.output_path(m.onnx_fp16) if m.onnx_fp16 else None,
                             opset=m.opset, exporter=m.exporter, verify_obs=states.obs if states is not None else None,
                             # the file keeps its training contract
                             contract_hash=None if deliberate else ctx.contract.hash)
        fp32_path = files.publish(m.onnx, result.fp32.path, result.fp32.sha256)
        fp16_path = files.publish(m.onnx_fp16, result.fp16.path, result.fp16.sha256) if result.fp16 else None
        ctx.progress.advance(task)
        verify_states = len(states) if states is not None else 4
        fp16_checks = [c for c in result.checks if c.startswith("fp16")]
        common = {"opset": result.opset, "exporter": result.exporter, "verify_states": verify_states,
                  "contract_hash": result.contract_hash, "checkpoint_sha256": result.checkpoint_sha256,
                  "versions": json.dumps(result.versions)}
        rows.append({**base, **common, "artifact": m.onnx, "path": str(fp32_path), "format": "onnx",
                     "precision": "fp32", "bytes": result.fp32.size_bytes, "sha256": result.fp32.sha256,
                     "checks": json.dumps([c for c in result.checks if c not in fp16_checks]),
                     "verify_max_abs_dq": result.verify_max_abs_diff})
        if result.fp16 is not None:
            rows.append({**base, **common, "artifact": m.onnx_fp16, "path": str(fp16_path), "format": "onnx",
                         "precision": "fp16", "bytes": result.fp16.size_bytes, "sha256": result.fp16.sha256,
                         "checks": json.dumps(fp16_checks), "verify_max_abs_dq": result.fp16_verify_max_abs_diff})
    return rows, index_rows


def _export_int8(m: ExportMeasurement, ctx: RunContext, checkpoint) -> tuple[list, list]:
    """Each INT8 variant quantized from its FP32 source: its export_files rows and int8_files rows.
    Variants with the same calibration settings share one capture; the source quantized is the
    file the run recorded for it (its own copy, where the run wrote it)."""
    import onnx

    from breakout_core.conversion.export import inspect_onnx
    from breakout_core.conversion.nncf_quantize import require_nncf

    files, base = ctx.files, {"run_id": ctx.run_id, "measurement": m.name}
    for j, variant in enumerate(m.int8):  # before any game is played for calibration
        if variant.quantizer == "nncf":
            require_nncf(f"measurements[{m.name}].int8[{j}].quantizer")
    task = ctx.progress.add_task(f"{m.name} · INT8 files", total=len(m.int8), unit="files")
    captured: dict[str, object] = {}
    rows, provenance = [], []
    for j, variant in enumerate(m.int8):
        states = None
        if variant.method == "static":
            key = int8_files.capture_key(variant)
            if key not in captured:
                captured[key] = capture_states(ctx, checkpoint, variant.states, variant.calibration)
            states = captured[key]
        source, where = variant.source or m.onnx, f"measurements[{m.name}].int8[{j}]"
        made, columns = int8_files.quantize(where, variant, str(files.readable_path(source)),
                                            str(files.output_path(variant.onnx)), states)
        files.check(source, made.source_sha256, f"{where}'s quantizer")
        meta = inspect_onnx(made.path).metadata
        path = files.publish(variant.onnx, made.path, made.sha256)
        rows.append({**base, "artifact": variant.onnx, "path": str(path), "format": "onnx", "precision": "int8",
                     "bytes": made.size_bytes, "sha256": made.sha256, "checks": json.dumps(list(made.checks)),
                     "contract_hash": meta.get("breakout.contract_hash") or None,
                     "checkpoint_sha256": meta.get("breakout.checkpoint_sha256") or None,
                     "versions": json.dumps({"onnxruntime": made.onnxruntime_version, "onnx": onnx.__version__,
                                             "numpy": np.__version__, "quantizer": made.quantizer})})
        provenance.append({**base, "artifact": variant.onnx, "source_artifact": source, **columns})
        ctx.progress.advance(task)
    return rows, provenance


def metrics(con, run_id: str, m: ExportMeasurement, candidate: str, baseline: str | None) -> dict[str, float]:
    files = {r[0]: r[1:] for r in con.execute(
        "SELECT artifact, bytes, verify_max_abs_dq, verify_states, format FROM export_files "
        "WHERE run_id = ? AND measurement = ?", [run_id, m.name]).fetchall()}
    if candidate not in files:
        return {}
    size, verify, verify_states, fmt = files[candidate]
    found: dict = {"size_bytes": float(size)}
    vs_fp32 = con.execute("SELECT size_vs_fp32 FROM export_sizes WHERE run_id = ? AND measurement = ? AND artifact = ?",
                          [run_id, m.name, candidate]).fetchone()[0]
    if vs_fp32 is not None and fmt == "onnx":
        found["size_vs_fp32"] = vs_fp32
    if verify is not None:
        found["verify_max_abs_dq"] = verify
        found["verify_states"] = float(verify_states)
    if fmt == "fixed_states":
        found["n_states"] = float(con.execute("SELECT count(*) FROM fixed_state_index WHERE run_id = ? "
                                              "AND measurement = ?",
                                              [run_id, m.name]).fetchone()[0])
    if baseline is not None and baseline in files and files[baseline][0]:
        found["size_ratio"] = size / files[baseline][0]
    return found


def report(con, run_id: str, m: ExportMeasurement) -> list[Section]:
    from runner.report.html import altair, blank_nulls, table_html

    alt = altair()
    sizes = con.execute("SELECT artifact, format, precision, bytes, megabytes, size_vs_fp32, verify_states, "
                        "verify_max_abs_dq FROM export_sizes WHERE run_id = ? AND measurement = ? ORDER BY artifact",
                        [run_id, m.name]).df()
    checks = con.execute("SELECT artifact, checks FROM export_files WHERE run_id = ? AND measurement = ? "
                         "AND checks IS NOT NULL ORDER BY artifact", [run_id, m.name]).fetchall()
    sections = [Section(f"{m.name}: exported files (sizes; max |dQ| of ONNX Runtime CPU vs torch on the verify states)",
                        html=table_html(blank_nulls(sizes), float_format="{:.4g}"))]
    if checks:
        items = "".join(f"<li><b>{a}</b>: {'; '.join(json.loads(c))}</li>" for a, c in checks)
        sections.append(Section(f"{m.name}: checks passed", html=f"<ul>{items}</ul>"))
    sections += _int8_sections(con, run_id, m)
    states = con.execute("SELECT state, episode_seed, step, action FROM fixed_state_index WHERE run_id = ? "
                         "AND measurement = ? ORDER BY state", [run_id, m.name]).df()
    if not states.empty:
        chart = alt.Chart(states).mark_circle(size=50).encode(
            x=alt.X("step:Q", title="agent step of the game"), y=alt.Y("episode_seed:N", title="episode seed"),
            color=alt.Color("action:N"), tooltip=["state", "episode_seed", "step", "action"])
        sections.append(Section(f"{m.name}: where the {len(states)} fixed states were taken (spread over each game)",
                                charts=[chart.properties(width=640).to_dict()]))
    return sections


def _int8_sections(con, run_id: str, m: ExportMeasurement) -> list[Section]:
    from runner.report.html import blank_nulls, table_html

    made = con.execute(
        "SELECT artifact, source_artifact, method, calibrate_method, calibration_states, calibration_seeds, "
        "nodes_excluded, json_array_length(nodes_quantized) AS quantized, excluded_quantized_at_load, "
        "quantizer, left(source_sha256, 12) AS source_sha256 FROM int8_files "
        "WHERE run_id = ? AND measurement = ? ORDER BY artifact", [run_id, m.name]).df()
    if made.empty:
        return []
    return [Section(f"{m.name}: INT8 files, how each was made (calibration seeds are "
                    "disjoint from every seed the spec plays)", html=table_html(blank_nulls(made)))]


# -- runner compare ---------------------------------------------------------------------------

def compare_export(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    name = m_a["name"]
    files = {label: {art: (size, checkpoint) for art, size, checkpoint in con.execute(
        "SELECT artifact, bytes, checkpoint_sha256 FROM export_files WHERE run_id = ? AND measurement = ?",
        [side.run_id, name]).fetchall()} for label, side in (("A", a), ("B", b))}
    rows = []
    for artifact in sorted(set(files["A"]) | set(files["B"])):
        fa, fb = files["A"].get(artifact), files["B"].get(artifact)
        row = samples_row(name, artifact, "bytes", np.asarray([fa[0]] if fa else []),
                           np.asarray([fb[0]] if fb else []), lower_is_better=True, machine_bound=False)
        if row.problem is None:  # a file's size is exact: any difference is real, no noise to test
            row.test, row.significant = "exact sizes, one file per run", fa[0] != fb[0]
            if fa[1] != fb[1]:
                row.problem = f"exported from another checkpoint: sha256 {str(fa[1])[:12]} → {str(fb[1])[:12]}"
        rows.append(row)
    return rows


KIND = Kind(
    name="export",
    model=ExportMeasurement,
    migrations=MIGRATIONS,
    views=VIEWS,
    execute=execute,
    participants=lambda m: m.outputs(),
    metric_names=METRIC_NAMES,
    metrics=metrics,
    report=report,
    needs_baseline=False,
    comparison_metrics=("size_ratio",),
    references=ExportMeasurement.references,
    outputs=ExportMeasurement.outputs,
    episode_seeds=ExportMeasurement.episode_seeds,
    held_out_seeds=ExportMeasurement.held_out_seeds,
    spec_problems=ExportMeasurement.spec_problems,
    compare=compare_export,
)
