"""`repair`: the fewest nodes to keep in float (and, for INT8, the calibration method) that
bring an INT8 or FP16 model close enough to FP32 on a cheap proxy, and that file written as
an artifact.

`precision: int8` (the default): the calibration states come from the agent's own games under
the spec's contract: the checkpoint's where the measurement names one, else the source FP32
file's own (played through its declared input, breakout_core.evaluation.fixed_states.capture_from_onnx),
on seeds the spec declares, disjoint from the fixed states' seeds and every episode seed the spec
plays (its `held_out_seeds`, checked in runner.spec.deploy_checks). The run records which file
played them, by artifact and sha256. A source that takes float input (its `input:` convention) is
converted as it is, so the file written takes the same input; its check and calibration states
are fed to it converted to that convention.
For each calibration method, breakout_core.diagnosis.repair.repair_search ranks the nodes the
full INT8 model quantizes by the effect of quantizing each alone (mean |dQ| on the check states), then re-quantizes with
the k worst kept in float (onnxruntime's `nodes_to_exclude`), k = 0, 1, ..., until a step
meets the target: greedy-action agreement and/or max |dQ| against FP32 on the check states,
which no calibration state equals. `precision: fp16`: the same search over the nodes the
float16 converter converts, kept in float32 through onnxconverter-common's `node_block_list`
with their FP32 weights (breakout_core.conversion.fp16); no calibration, no checkpoint. The stored rows
of an FP16 search have no calibration method (NULL). Every step is stored with its agreement, |dQ| and batch-1 P50
timed in turns with FP32's (ONNX Runtime CPU, one thread): one series of calls, no rounds, so it is
shown and never a rule (a `latency` measurement of the output judges its speed over rounds). The chosen step
(breakout_core.diagnosis.repair.choose_step: fewest nodes in float, then the lowest mean |dQ| on the
check states; latency is reported, never a tie-break) is copied to the output artifact;
where none meets the target, the closest step is written and the report says so. Whether its games keep their scores is
for a games measurement to judge: the proxy does not predict scores.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, model_serializer, model_validator

from breakout_core.conversion.nncf_quantize import PER_CHANNEL_ONLY
from breakout_core.conversion.onnx_checks import not_a_node
from breakout_core.diagnosis.repair import NNCF_METHOD
from runner.kinds.kind import Kind
from runner.kinds.shared.calibration import CalibrationSpec
from runner.report.section import Section
from runner.run.context import RunContext
from runner.spec.fields import Name, StrictModel, seed_list
from runner.spec.yaml_source import PlacedError, raise_placed


class TargetSpec(StrictModel):
    min_agreement: float | None = Field(default=1.0, ge=0.0, le=1.0,
                                        description="fraction of check states whose greedy action is FP32's")
    max_abs_dq: float | None = Field(default=None, ge=0.0, description="largest |Q - Q_fp32| on the check states")

    @model_validator(mode="after")
    def _some(self) -> "TargetSpec":
        if self.min_agreement is None and self.max_abs_dq is None:
            raise ValueError("a repair target needs min_agreement, max_abs_dq or both")
        return self


INT8_ONLY = ("checkpoint", "calibration", "per_channel")  # what an FP16 search has no use for


class RepairMeasurement(StrictModel):
    kind: Literal["repair"]
    name: Name
    precision: Literal["int8", "fp16"] = Field(default="int8", description="what the source is converted to: "
                                               "int8 (onnxruntime's static quantizer) or fp16 (onnxconverter-common)")
    source: Name = Field(description="artifact: the FP32 ONNX file to convert")
    checkpoint: Name | None = Field(default=None, description="int8 only: artifact, the checkpoint whose games give "
                                    "the calibration states; none: the source FP32 file's own games")
    check_states: Name = Field(description="artifact: fixed states the proxy is measured on")
    output: Name = Field(description="artifact written: the chosen file (made_by: this spec, precision: as converted)")
    calibration: CalibrationSpec | None = Field(default=None, description="int8 only (required there)")
    keep_float: list[str] = Field(default_factory=list, description="nodes of the source graph always kept in float")
    target: TargetSpec = TargetSpec()
    per_channel: bool = Field(default=True, description="int8 only: one weight scale per output channel")
    latency_runs: int = Field(default=300, ge=64, le=100_000, description="timed calls per model and step")

    @model_validator(mode="after")
    def _precision_fields(self) -> "RepairMeasurement":
        if self.precision == "fp16":
            raise_placed([PlacedError(f"int8 only: an fp16 repair captures no calibration games and quantizes "
                                      f"nothing, so no {key} here", (key,))
                          for key in INT8_ONLY if key in self.model_fields_set])
            return self
        if self.calibration is None:
            raise PlacedError("an int8 repair needs calibration: `calibration: {capture: {episode_seeds: ...}}`, "
                              "seeds no other part of the spec plays", ("calibration",))
        if not self.per_channel and NNCF_METHOD in self.calibration.methods:
            raise PlacedError(f"{PER_CHANNEL_ONLY}: per_channel: false is for onnxruntime's methods", ("per_channel",))
        return self

    @model_serializer(mode="wrap")
    def _settings(self, handler) -> dict:
        """The settings a run stores. INT8 leaves out `precision`, the default: they then read as
        those of runs stored before the field existed, so `runner compare` and `--resume` take an
        INT8 repair run by this runner and one by an earlier runner as the same settings. FP16
        leaves out the INT8 settings it has no use for, so what it stores validates again."""
        data = handler(self)
        for key in ("precision",) if self.precision == "int8" else INT8_ONLY:
            data.pop(key)
        return data

    def outputs(self) -> list[str]:
        return [self.output]

    def metric_problem(self, metric: str) -> str | None:
        """The search's latency ratio is one sequence of calls per step, no rounds: shown, never a rule."""
        if metric == "latency_p50_ratio":
            return ("latency_p50_ratio is the repair search's point estimate (one series of calls a step, no "
                    "rounds), shown and never a rule: time the output against its source in a `latency` "
                    "measurement and judge latency_p50_ratio_ci_high, its interval over rounds")
        return None

    def references(self) -> list[tuple[tuple, str, str]]:
        checkpoint = [] if self.checkpoint is None else [(("checkpoint",), "artifact:checkpoint", self.checkpoint)]
        return [(("source",), "artifact:onnx", self.source), *checkpoint,
                (("check_states",), "artifact:fixed_states", self.check_states),
                (("output",), "artifact_out:onnx", self.output)]


def spec_problems(m: RepairMeasurement, spec, context: dict) -> list[tuple[tuple, str]]:
    """Keep-list nodes not in the source graph; an output not declared with the measurement's
    precision or a source that is not FP32. (Calibration seeds the spec also plays: its `held_out_seeds`.)"""
    problems: list[tuple[tuple, str]] = []
    source, output = spec.artifacts.get(m.source), spec.artifacts.get(m.output)
    if source is not None and source.precision != "fp32":
        problems.append((("source",), f"artifacts.{m.source} is {source.precision}; the repair converts an FP32 file"))
    if output is not None and output.precision != m.precision:
        problems.append((("output",), f"artifacts.{m.output} is written as {m.precision.upper()}: declare it with "
                                      f"precision: {m.precision}"))
    if source is not None and m.keep_float and context.get("check_files", True) and Path(source.path).is_file():
        import onnx

        try:
            nodes = [n.name for n in onnx.load_model(source.path, load_external_data=False).graph.node]
        except Exception:  # noqa: BLE001 -- not a model: the file checks report it
            return problems
        problems += [(("keep_float", j), not_a_node(node, nodes, Path(source.path).name))
                     for j, node in enumerate(m.keep_float) if node not in nodes]
    return problems


MIGRATIONS = [
    (
        "0480_repair",
        """
        CREATE TABLE repair_steps (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, calibrate_method VARCHAR NOT NULL,
            step INTEGER NOT NULL, kept_float JSON NOT NULL, n_kept_float INTEGER NOT NULL,
            nodes_quantized JSON NOT NULL, kept_float_quantized_at_load JSON NOT NULL,
            agreement DOUBLE NOT NULL, max_abs_dq DOUBLE NOT NULL, mean_abs_dq DOUBLE NOT NULL,
            p50_ms DOUBLE NOT NULL, fp32_p50_ms DOUBLE NOT NULL, latency_ratio DOUBLE NOT NULL,
            passes BOOLEAN NOT NULL, chosen BOOLEAN NOT NULL, path VARCHAR NOT NULL, sha256 VARCHAR NOT NULL
        );
        CREATE TABLE repair_order (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, calibrate_method VARCHAR NOT NULL,
            rank INTEGER NOT NULL, node VARCHAR NOT NULL, alone_mean_abs_dq DOUBLE NOT NULL
        );
        CREATE TABLE repair_results (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, output VARCHAR NOT NULL, path VARCHAR NOT NULL,
            sha256 VARCHAR NOT NULL, source_sha256 VARCHAR NOT NULL, calibrate_method VARCHAR NOT NULL,
            step INTEGER NOT NULL, met_target BOOLEAN NOT NULL, target VARCHAR NOT NULL,
            calibration_states INTEGER NOT NULL, calibration_seeds JSON NOT NULL, calibration_sha256 VARCHAR NOT NULL,
            check_states INTEGER NOT NULL, check_states_dropped INTEGER NOT NULL, cpu JSON NOT NULL,
            onnxruntime VARCHAR NOT NULL, wall_s DOUBLE NOT NULL
        );
        """,
    ),
    (
        # FP16 searches: no calibration, so no calibration method, states, seeds or file (NULL); rows
        # stored before are INT8's. repair_steps.nodes_quantized holds the nodes converted: for FP16,
        # those that write float16.
        "0481_repair_precision",
        """
        ALTER TABLE repair_results ADD COLUMN precision VARCHAR DEFAULT 'int8';
        ALTER TABLE repair_results ALTER COLUMN calibrate_method DROP NOT NULL;
        ALTER TABLE repair_results ALTER COLUMN calibration_states DROP NOT NULL;
        ALTER TABLE repair_results ALTER COLUMN calibration_seeds DROP NOT NULL;
        ALTER TABLE repair_results ALTER COLUMN calibration_sha256 DROP NOT NULL;
        ALTER TABLE repair_steps ALTER COLUMN calibrate_method DROP NOT NULL;
        ALTER TABLE repair_order ALTER COLUMN calibrate_method DROP NOT NULL;
        """,
    ),
    (
        # the artifact whose games gave an INT8 search's calibration states (a checkpoint, or the
        # source FP32 file itself) and its sha256; NULL for FP16 and for rows stored before
        "0482_repair_calibration_source",
        """
        ALTER TABLE repair_results ADD COLUMN calibration_source VARCHAR;
        ALTER TABLE repair_results ADD COLUMN calibration_source_sha256 VARCHAR;
        """,
    ),
]

METRIC_NAMES = ("agreement", "max_abs_dq", "latency_p50_ratio", "kept_float", "met_target", "steps")


def execute(m: RepairMeasurement, ctx: RunContext) -> None:
    import time

    import onnxruntime as ort

    from breakout_core.common.hashing import file_sha256
    from breakout_core.conversion.nncf_quantize import require_nncf
    from breakout_core.diagnosis.repair import Fp16Converter, Int8Converter, RepairTarget, choose_step, repair_search
    from breakout_core.evaluation.fixed_states import save_fixed_states
    from runner.kinds.shared.lineage import check_lineage
    from runner.kinds.shared.model_inputs import source_convention
    from runner.kinds.shared.runtime_lifecycle import load_states
    from runner.kinds.shared.state_capture import capture_onnx_states, capture_states

    if ctx.already_stored("repair_results", m.name):
        return
    started = time.perf_counter()
    check_lineage(ctx, [m.source])
    check = load_states(ctx, m.check_states)[0].obs
    folder = ctx.artifacts_dir / m.name
    target = RepairTarget(min_agreement=m.target.min_agreement, max_abs_dq=m.target.max_abs_dq)
    fed = source_convention(ctx, m.source)  # the source's own input: what its converted files take too
    check = fed.convert(check)
    calibration = calibration_path = player = player_sha256 = None
    if m.precision == "int8":
        if NNCF_METHOD in m.calibration.methods:  # before any calibration game is played
            require_nncf(f"measurements[{m.name}].calibration.methods")
        player = m.checkpoint or m.source
        task = ctx.progress.add_task(f"{m.name} · capture {m.calibration.n_states} calibration states from "
                                     f"{player}'s games", total=1, unit="capture")
        what = f"measurement {m.name}'s calibration"
        if m.checkpoint is not None:
            with ctx.files.loaded(m.checkpoint, what) as (checkpoint, player_sha256):
                calibration = capture_states(ctx, checkpoint, m.calibration.n_states, m.calibration.capture)
        else:
            calibration, player_sha256 = capture_onnx_states(ctx, m.source, m.calibration.n_states,
                                                             m.calibration.capture, what)
        calibration_path = save_fixed_states(folder / "calibration_states.npz", calibration)
        ctx.progress.advance(task)
        converters = {method: Int8Converter(fed.convert(calibration.obs), calibrate_method=method,
                                            per_channel=m.per_channel, keep_float=tuple(m.keep_float))
                      for method in m.calibration.methods}
    else:
        converters = {None: Fp16Converter(keep_float=tuple(m.keep_float))}
    results = {}
    with ctx.files.loaded(m.source, f"measurement {m.name}") as (source, source_sha256):
        for method, convert in converters.items():
            task = ctx.progress.add_task(f"{m.name} · {method or m.precision}: rank nodes, then keep the worst in "
                                         "float", total=1, unit="searches")
            results[method] = repair_search(source, check, folder / (method or m.precision), convert=convert,
                                            target=target, latency_runs=m.latency_runs)
            ctx.progress.advance(task)
    method, step, met = choose_step(results)
    output = ctx.files.publish(m.output, step.path, step.sha256).resolve()  # the chosen step's file, in one rename
    base = {"run_id": ctx.run_id, "measurement": m.name}
    ctx.store.append_rows("repair_steps", [
        {**base, "calibrate_method": name, "step": k, "kept_float": json.dumps([*m.keep_float, *s.excluded]),
         "n_kept_float": len(m.keep_float) + len(s.excluded), "nodes_quantized": json.dumps(list(s.nodes_converted)),
         "kept_float_quantized_at_load": json.dumps(list(s.excluded_quantized_at_load)), "agreement": s.agreement,
         "max_abs_dq": s.max_abs_dq, "mean_abs_dq": s.mean_abs_dq, "p50_ms": s.p50_ms, "fp32_p50_ms": s.fp32_p50_ms,
         "latency_ratio": s.latency_ratio, "passes": s.passes, "chosen": s is step, "path": str(s.path.resolve()),
         "sha256": s.sha256}
        for name, result in results.items() for k, s in enumerate(result.steps)])
    ctx.store.append_rows("repair_order", [
        {**base, "calibrate_method": name, "rank": r, "node": node, "alone_mean_abs_dq": score}
        for name, result in results.items() for r, (node, score) in enumerate(result.order)])
    chosen = results[method]
    ctx.store.append_rows("repair_results", [{
        **base, "output": m.output, "path": str(output), "sha256": step.sha256, "precision": m.precision,
        "source_sha256": source_sha256, "calibrate_method": method, "step": chosen.steps.index(step),
        "met_target": met, "target": target.describe(),
        "calibration_states": None if calibration is None else len(calibration),
        "calibration_seeds": None if calibration is None else json.dumps(sorted({int(s)
                                                                                 for s in calibration.episode_seeds})),
        "calibration_sha256": None if calibration_path is None else file_sha256(calibration_path),
        "calibration_source": player, "calibration_source_sha256": player_sha256,
        "check_states": chosen.check_states,
        "check_states_dropped": chosen.check_states_dropped, "cpu": json.dumps(chosen.cpu),
        "onnxruntime": ort.__version__, "wall_s": time.perf_counter() - started}])
    ctx.store.append_rows("artifacts", [{**base, "label": f"{m.output} (onnx, {m.precision})", "path": str(output),
                                         "bytes": step.path.stat().st_size}])


def metrics(con, run_id: str, m: RepairMeasurement, candidate: str, baseline: str | None) -> dict[str, float]:
    row = con.execute(
        "SELECT s.agreement, s.max_abs_dq, s.latency_ratio, s.n_kept_float, r.met_target, "
        "(SELECT count(*) FROM repair_steps a WHERE a.run_id = r.run_id AND a.measurement = r.measurement) "
        "FROM repair_results r JOIN repair_steps s ON s.run_id = r.run_id AND s.measurement = r.measurement "
        "AND s.chosen WHERE r.run_id = ? AND r.measurement = ? AND r.output = ?",
        [run_id, m.name, candidate]).fetchone()
    if row is None:
        return {}
    return dict(zip(METRIC_NAMES, (row[0], row[1], row[2], float(row[3]), float(row[4]), float(row[5]))))


def report(con, run_id: str, m: RepairMeasurement) -> list[Section]:
    from runner.report.html import altair, table_html

    alt = altair()
    result = con.execute(
        "SELECT output, path, precision, calibrate_method, step, met_target, target, calibration_states, "
        "calibration_seeds, check_states, check_states_dropped, cpu, onnxruntime, wall_s, calibration_source, "
        "calibration_source_sha256 FROM repair_results WHERE run_id = ? AND measurement = ?",
        [run_id, m.name]).fetchone()
    if result is None:
        return [Section(f"{m.name}: repair search", html="<p>No result stored.</p>")]
    (output, path, precision, method, step, met, target, n_calib, seeds, n_check, dropped, cpu, ort_version, wall,
     player, player_sha256) = result
    steps = con.execute(
        "SELECT coalesce(calibrate_method, 'none') AS calibrate_method, step, n_kept_float, kept_float, agreement, "
        "max_abs_dq, mean_abs_dq, p50_ms, fp32_p50_ms, latency_ratio, passes, chosen, kept_float_quantized_at_load "
        "FROM repair_steps WHERE run_id = ? AND measurement = ? ORDER BY calibrate_method, step",
        [run_id, m.name]).df()
    chosen = steps[steps["chosen"]].iloc[0]
    isa = json.loads(cpu)
    flags = ", ".join(k for k in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "amx") if isa.get(k)) or "none read"
    verdict = (f"meets the target ({target})" if met else
               f"<b>no step met the target</b> ({target}); the closest step was written")
    if precision == "int8":
        made = f"INT8, {method} calibration"
        left_out = f" ({dropped} equal to a calibration state left out)"
        played_by = f" of <code>{player}</code> (sha256 {player_sha256[:12]})" if player else ""
        how = f"Calibration: {n_calib} states from the games{played_by} on seeds {json.loads(seeds)}."
    else:
        made, left_out = "FP16", ""
        how = ("FP16 by onnxconverter-common, each node kept in float32 reading the FP32 file's own weights "
               "(breakout_core.conversion.fp16); no calibration.")
    summary = (
        f"<p><code>{output}</code> ({path}): {made}, step {step}, keeping "
        f"{chosen['n_kept_float']} node(s) in float ({', '.join(json.loads(chosen['kept_float'])) or 'none'}): "
        f"agreement {chosen['agreement']:.4g}, max |dQ| {chosen['max_abs_dq']:.3g}, batch-1 P50 "
        f"{chosen['latency_ratio']:.3g}x FP32's, on {n_check} check states{left_out}; {verdict}.</p><p>{how} "
        f"CPU {isa.get('cpu')}; INT8 instruction sets: {flags}; onnxruntime {ort_version}; {wall:.0f} s in all. "
        "Agreement and |dQ| on states are a proxy: a games measurement on this file judges whether the scores "
        "hold.</p>")
    sections = [Section(f"{m.name}: the chosen file", html=summary)]
    sections.append(Section(f"{m.name}: every step (k nodes kept in float, worst first; latency timed in turns with "
                            "FP32, batch 1, one thread)", html=table_html(steps, float_format="{:.4g}")))
    chart = alt.Chart(steps).mark_line(point=True).encode(
        x=alt.X("latency_ratio:Q", title="batch-1 P50 / FP32's (interleaved)"),
        y=alt.Y("agreement:Q", title="greedy-action agreement with FP32 (check states)"),
        color=alt.Color("calibrate_method:N", title="calibration"), order="step:Q",
        tooltip=["calibrate_method", "step", "n_kept_float", "kept_float", "agreement", "max_abs_dq",
                 "latency_ratio"])
    labels = chart.mark_text(dy=-10).encode(text="n_kept_float:Q")
    sections.append(Section(f"{m.name}: agreement against latency, one point per step (label: nodes kept in float)",
                            charts=[(chart + labels).properties(width=560, height=320).to_dict()]))
    order = con.execute("SELECT coalesce(calibrate_method, 'none') AS calibrate_method, rank, node, alone_mean_abs_dq "
                        "FROM repair_order WHERE run_id = ? AND measurement = ? ORDER BY calibrate_method, rank",
                        [run_id, m.name]).df()
    sections.append(Section(f"{m.name}: nodes by the mean |dQ| that converting each alone to {precision.upper()} "
                            "causes (the search order)",
                            html=table_html(order, float_format="{:.4g}")))
    return sections


KIND = Kind(
    name="repair",
    model=RepairMeasurement,
    migrations=MIGRATIONS,
    views=[],
    execute=execute,
    participants=RepairMeasurement.outputs,
    metric_names=METRIC_NAMES,
    metrics=metrics,
    report=report,
    needs_baseline=False,
    references=RepairMeasurement.references,
    outputs=RepairMeasurement.outputs,
    metric_problem=RepairMeasurement.metric_problem,
    spec_problems=spec_problems,
    held_out_seeds=lambda m: [] if m.calibration is None else [
        (("calibration", "capture", "episode_seeds"), seed_list(m.calibration.capture.episode_seeds))],
    not_settings=frozenset({"latency_runs"}),
)
