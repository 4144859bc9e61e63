"""`localisation`: where in the network a converted model (FP16, INT8) departs from its FP32 baseline.

Every intermediate float tensor of the baseline and of each candidate is exposed and matched
by name through the Cast and Q/DQ nodes the conversions insert (breakout_core.diagnosis.localise),
both run on ONNX Runtime's CPU provider, one state at a time, over the fixed states. One row
per (candidate, layer): max abs error, relative L2 error, cosine similarity and SQNR in dB,
with its depth (the producing node's index in the baseline graph). Per state whose greedy
action flips (the candidate's differs from the baseline's): the first layer whose error on
that state passes the spec's tolerance.

Only ONNX graphs run by ONNX Runtime on the CPU can expose their tensors here: a torch or
browser runtime is a spec error. TensorRT would need its layers marked as network outputs,
which changes what it fuses (the measured engine would not be the deployed one) and needs a
GPU; a TensorRT runtime is recorded as unavailable with its reason.
"""

from __future__ import annotations

import json
from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from breakout_core.runtimes.actual import ActualRun
from runner.kinds.kind import Kind
from runner.kinds.shared.lineage import check_lineage
from runner.kinds.shared.runtime_lifecycle import greedy, load_states
from runner.kinds.shared.runtime_status import found_unavailable, record, runtime_sections
from runner.report.section import Section
from runner.run.context import RunContext
from runner.spec.fields import Name
from runner.spec.runtimes import RuntimeMeasurement, runtime_precision

EXPOSABLE = "onnxruntime"  # the backend whose graph can expose every tensor here
MARKING_BACKENDS = frozenset({"tensorrt"})  # would mark layers as outputs: unavailable here, with the reason
TENSORRT_REASON = ("layer-wise localisation on TensorRT marks every layer as a network output, which changes what "
                   "TensorRT fuses, so the engine measured is not the one deployed; it is not built here")


class LocalisationMeasurement(RuntimeMeasurement):
    kind: Literal["localisation"]
    name: Name
    fixed_states: Name = Field(description="artifact: the states every model sees")
    metric: Literal["rel_l2", "max_abs"] = Field(default="rel_l2",
                                                 description="the per-state error a layer is judged by")
    tolerance: float = Field(default=0.01, gt=0.0,
                             description="a layer is over the tolerance when its error passes this")

    @model_validator(mode="after")
    def _two(self) -> "LocalisationMeasurement":
        if len(self.runtimes) < 2:
            raise ValueError("localisation compares at least 2 runtimes: a baseline and a candidate")
        return self

    def references(self):
        return super().references() + [(("fixed_states",), "artifact:fixed_states", self.fixed_states)]


def spec_problems(m: LocalisationMeasurement, spec, context: dict) -> list[tuple[tuple, str]]:
    """Runtimes whose intermediate tensors cannot be exposed here; a baseline that does not run FP32."""
    problems = []
    for j, name in enumerate(m.runtimes):
        config = spec.runtimes.get(name)
        if config is None or (config.runtime in MARKING_BACKENDS and name != m.baseline_runtime):
            continue  # an unknown name is the reference checks' to report; a TensorRT candidate is unavailable
        if config.runtime != EXPOSABLE:
            problems.append((("runtimes", j), f"runtime {name!r} ({config.runtime}) cannot expose its intermediate "
                                              "tensors; localisation compares ONNX graphs that onnxruntime runs on "
                                              "the CPU"))
        elif config.provider != "cpu":
            problems.append((("runtimes", j), f"runtime {name!r} runs onnxruntime's {config.provider} provider; "
                                              "localisation exposes tensors on the CPU provider only"))
    if m.baseline_runtime in spec.runtimes and spec.runtimes[m.baseline_runtime].artifact in spec.artifacts:
        precision = runtime_precision(spec, m.baseline_runtime)
        if precision != "fp32":
            problems.append((("baseline",) if m.baseline else ("runtimes", 0),
                             f"the baseline {m.baseline_runtime!r} runs {precision}; localisation measures against "
                             "an FP32 baseline"))
    return problems


MIGRATIONS = [
    (
        "0470_localisation",
        """
        CREATE TABLE localisation_layers (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, candidate VARCHAR NOT NULL,
            layer VARCHAR NOT NULL, depth INTEGER NOT NULL, baseline VARCHAR NOT NULL,
            candidate_tensor VARCHAR NOT NULL, node VARCHAR NOT NULL, op_type VARCHAR NOT NULL,
            max_abs DOUBLE NOT NULL, rel_l2 DOUBLE NOT NULL, cosine DOUBLE NOT NULL, sqnr_db DOUBLE NOT NULL,
            over_tolerance BOOLEAN NOT NULL
        );
        CREATE TABLE localisation_flips (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, candidate VARCHAR NOT NULL, state INTEGER NOT NULL,
            baseline_action INTEGER NOT NULL, candidate_action INTEGER NOT NULL,
            first_layer VARCHAR, first_depth INTEGER, first_error DOUBLE
        );
        CREATE TABLE localisation_candidates (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, candidate VARCHAR NOT NULL,
            baseline VARCHAR NOT NULL, precision VARCHAR NOT NULL, artifact_sha256 VARCHAR NOT NULL,
            metric VARCHAR NOT NULL, tolerance DOUBLE NOT NULL, n_states INTEGER NOT NULL, flips INTEGER NOT NULL,
            first_layer VARCHAR, first_depth INTEGER, unmatched JSON NOT NULL, exposure_max_abs_diff DOUBLE NOT NULL,
            wall_s DOUBLE NOT NULL
        );
        """,
    )
]

METRIC_NAMES = ("flips", "layers_over_tolerance", "first_over_tolerance_depth", "output_rel_l2", "output_sqnr_db",
                "min_sqnr_db")


def execute(m: LocalisationMeasurement, ctx: RunContext) -> None:
    import time

    from breakout_core.diagnosis.localise import LocaliseError, localise
    from breakout_core.diagnosis.repair import q_values

    states, _, _ = load_states(ctx, m.fixed_states)
    obs = states.obs
    baseline = ctx.spec.runtimes[m.baseline_runtime]
    check_lineage(ctx, [r.artifact for r in map(ctx.spec.runtimes.get, m.runtimes)])
    baseline_actions = None
    candidates = [r for r in m.ordered_runtimes() if r != m.baseline_runtime]
    task = ctx.progress.add_task(f"{m.name} · {len(obs)} states", total=len(candidates), unit="candidates")
    for name in candidates:
        done = ctx.already_stored("localisation_candidates", m.name, candidate=name)
        if done or found_unavailable(ctx, m.name, name):
            ctx.progress.advance(task)
            continue
        config = ctx.spec.runtimes[name]
        artifact = ctx.spec.artifacts[config.artifact]
        row = {"run_id": ctx.run_id, "measurement": m.name, "runtime": name, "backend": config.runtime,
               "artifact": artifact.path, "artifact_sha256": None, "precision": runtime_precision(ctx.spec, name),
               "requested": json.dumps(config.options()), "load_s": None}
        if config.runtime in MARKING_BACKENDS:
            runtime = config.make_runtime()
            ok, reason = runtime.available(**runtime.requested)
            record(ctx, row, False, reason if not ok else TENSORRT_REASON)
            ctx.progress.advance(task)
            continue
        started = time.perf_counter()
        # the files read are those the run recorded, each one file throughout (runner.run.artifact_files)
        with ctx.files.loaded(baseline.artifact, f"runtime {m.baseline_runtime}") as (baseline_path, _), \
                ctx.files.loaded(config.artifact, f"runtime {name}") as (candidate_path, sha256):
            if baseline_actions is None:
                baseline_actions = greedy(q_values(baseline_path, obs).astype(np.float64))
            actions = greedy(q_values(candidate_path, obs).astype(np.float64))
            flipped = np.flatnonzero(actions != baseline_actions).tolist()
            try:
                found = localise(baseline_path, candidate_path, obs, flipped=flipped, metric=m.metric,
                                 tolerance=m.tolerance)
            except LocaliseError as exc:  # e.g. a graph whose tensors match none of the baseline's
                found = str(exc)
        if isinstance(found, str):
            record(ctx, row, False, found)
        else:
            _store(ctx, m, name, found, baseline_actions, actions, {**row, "artifact_sha256": sha256},
                   time.perf_counter() - started)
        ctx.progress.advance(task)


def _store(ctx: RunContext, m: LocalisationMeasurement, name: str, found, baseline_actions, actions, row: dict,
           wall: float) -> None:
    base = {"run_id": ctx.run_id, "measurement": m.name, "candidate": name}
    depth = {layer.tensor: layer.depth for layer in found.layers}
    column = {tensor: k for k, tensor in enumerate(layer.tensor for layer in found.layers)}
    layers = [{**base, "layer": layer.tensor, "depth": layer.depth, "baseline": m.baseline_runtime,
               "candidate_tensor": layer.candidate_tensor, "node": layer.node, "op_type": layer.op_type,
               "max_abs": layer.max_abs, "rel_l2": layer.rel_l2, "cosine": layer.cosine, "sqnr_db": layer.sqnr_db,
               "over_tolerance": (layer.rel_l2 if m.metric == "rel_l2" else layer.max_abs) > m.tolerance}
              for layer in found.layers]
    flips = [{**base, "state": i, "baseline_action": int(baseline_actions[i]), "candidate_action": int(actions[i]),
              "first_layer": first, "first_depth": depth.get(first) if first else None,
              "first_error": float(found.state_errors[i, column[first]]) if first else None}
             for i, first in sorted(found.first_divergence.items())]
    first = found.first_layer()
    sha = row["artifact_sha256"]
    ctx.store.append_rows("localisation_layers", layers)
    if flips:
        ctx.store.append_rows("localisation_flips", flips)
    ctx.store.append_rows("localisation_candidates", [{
        **base, "baseline": m.baseline_runtime, "precision": row["precision"], "artifact_sha256": sha,
        "metric": m.metric, "tolerance": m.tolerance, "n_states": int(found.state_errors.shape[0]), "flips": len(flips),
        "first_layer": first.tensor if first else None, "first_depth": first.depth if first else None,
        "unmatched": json.dumps(list(found.unmatched)), "exposure_max_abs_diff": found.exposure_max_abs_diff,
        "wall_s": wall}])
    actual = ActualRun(device="cpu", precision=row["precision"], provider="CPUExecutionProvider",
                       details={"threads": 1, "batch_size": 1, "tensors_exposed": len(layers)})
    record(ctx, row, True, None, {
        "requested": json.loads(row["requested"]), "actual": actual.as_json(),
        "note": "run by breakout_core.diagnosis.localise, every float tensor a graph output"}, actual)


def metrics(con, run_id: str, m: LocalisationMeasurement, candidate: str, baseline: str | None) -> dict[str, float]:
    from runner.kinds.shared.runtime_status import with_unavailable

    row = con.execute(
        "SELECT c.flips, c.first_depth, (SELECT count(*) FILTER (WHERE over_tolerance) FROM localisation_layers l "
        "WHERE l.run_id = c.run_id AND l.measurement = c.measurement AND l.candidate = c.candidate), "
        "(SELECT arg_max(rel_l2, depth) FROM localisation_layers l WHERE l.run_id = c.run_id "
        "AND l.measurement = c.measurement AND l.candidate = c.candidate), "
        "(SELECT arg_max(sqnr_db, depth) FROM localisation_layers l WHERE l.run_id = c.run_id "
        "AND l.measurement = c.measurement AND l.candidate = c.candidate), "
        "(SELECT min(sqnr_db) FROM localisation_layers l WHERE l.run_id = c.run_id "
        "AND l.measurement = c.measurement AND l.candidate = c.candidate) "
        "FROM localisation_candidates c WHERE c.run_id = ? AND c.measurement = ? AND c.candidate = ?",
        [run_id, m.name, candidate]).fetchone()
    found: dict = {}
    if row is not None:
        found = {"flips": float(row[0]), "layers_over_tolerance": float(row[2]), "output_rel_l2": row[3],
                 "output_sqnr_db": row[4], "min_sqnr_db": row[5]}
        if row[1] is not None:
            found["first_over_tolerance_depth"] = float(row[1])
    return with_unavailable(found, con, run_id, [m.name], [candidate])


def report(con, run_id: str, m: LocalisationMeasurement) -> list[Section]:
    from runner.report.html import altair, blank_nulls, table_html

    alt = altair()
    sections = runtime_sections(con, run_id, m.name)
    what = "relative L2 error" if m.metric == "rel_l2" else "max abs error"
    layers = con.execute(
        "SELECT candidate, depth, layer, op_type, candidate_tensor, max_abs, rel_l2, cosine, sqnr_db, over_tolerance "
        "FROM localisation_layers WHERE run_id = ? AND measurement = ? ORDER BY candidate, depth",
        [run_id, m.name]).df()
    summary = con.execute(
        "SELECT candidate, precision, n_states, flips, first_layer, first_depth, unmatched, exposure_max_abs_diff "
        "FROM localisation_candidates WHERE run_id = ? AND measurement = ? ORDER BY candidate", [run_id, m.name]).df()
    if summary.empty:
        sections.append(Section(f"{m.name}: localisation against {m.baseline_runtime}",
                                html="<p>No candidate could be localised here (see the runtimes above).</p>"))
        return sections
    causes = con.execute(
        "SELECT candidate, coalesce(first_layer, '(none)') AS layer, count(*) AS n FROM localisation_flips "
        "WHERE run_id = ? AND measurement = ? GROUP BY ALL ORDER BY candidate, min(first_depth) NULLS LAST",
        [run_id, m.name]).fetchall()
    sections.append(Section(f"{m.name}: first layer over the tolerance ({what} > {m.tolerance:g}) per candidate",
                            html=_first_layers_html(summary, causes, m, what)
                            + table_html(blank_nulls(summary), float_format="{:.3g}")))
    error = "rel_l2" if m.metric == "rel_l2" else "max_abs"
    drawn = layers.assign(error=layers[error].clip(lower=1e-12), sqnr=layers["sqnr_db"].clip(upper=200))
    tooltip = ["candidate", "depth", "layer", "op_type", "max_abs", "rel_l2", "cosine", "sqnr_db"]
    base = alt.Chart(drawn).encode(x=alt.X("depth:Q", title="depth (node index in the baseline graph)",
                                                                 axis=alt.Axis(tickMinStep=1)),
                                   color=alt.Color("candidate:N", title="candidate"), tooltip=tooltip)
    err = base.mark_line(point=True).encode(y=alt.Y(
        "error:Q", scale=alt.Scale(type="log"), title=f"{what} against {m.baseline_runtime} (log; 0 drawn at 1e-12)"))
    rule = alt.Chart({"values": [{"tolerance": m.tolerance}]}).mark_rule(color="gray", strokeDash=[4, 4]).encode(
        y="tolerance:Q")
    sqnr = base.mark_line(point=True).encode(y=alt.Y("sqnr:Q", title="SQNR (dB; exact drawn at 200)"))
    sections.append(Section(f"{m.name}: error against depth, one line per candidate (dashed: the tolerance)",
                            charts=[(err + rule).properties(width=640, height=300).to_dict(),
                                    sqnr.properties(width=640, height=220).to_dict()]))
    sections.append(Section(f"{m.name}: every layer (max abs, relative L2, cosine, SQNR over all "
                            f"{summary['n_states'].max()} states)", html=table_html(layers, float_format="{:.4g}")))
    flips = con.execute(
        "SELECT candidate, state, baseline_action, candidate_action, first_layer, first_depth, first_error "
        "FROM localisation_flips WHERE run_id = ? AND measurement = ? ORDER BY candidate, state", [run_id, m.name]).df()
    if not flips.empty:
        sections.append(Section(f"{m.name}: flipped states (greedy action differs from {m.baseline_runtime}) and the "
                                f"first layer where each state's {what} passes {m.tolerance:g}",
                                html=table_html(blank_nulls(flips), float_format="{:.3g}")))
    sections.append(Section(f"{m.name}: how the tensors were read", html=(
        "<p>Each tensor is made a graph output in a copy of both files and read on ONNX Runtime's CPU provider, one "
        "state at a time. Exposing a tensor can change what ONNX Runtime fuses (a QDQ group whose tensor is an output "
        "runs as DequantizeLinear → float op → QuantizeLinear); <code>exposure_max_abs_diff</code> is how far that "
        "moved each candidate's own output. TensorRT would have to mark its layers as network outputs, which changes "
        "its layer fusion, so an engine localised that way is not the engine deployed.</p>")))
    return sections


def _first_layers_html(summary, causes: list[tuple], m: LocalisationMeasurement, what: str) -> str:
    """Per candidate: the first layer over the tolerance over all states, and where its flipped
    states first pass it (the layer that makes each flip)."""
    import pandas as pd

    items = []
    for row in summary.itertuples():
        first = (f"no layer's {what} over all states passes {m.tolerance:g}" if pd.isna(row.first_layer) else
                 f"first over the tolerance is <code>{row.first_layer}</code> (depth {row.first_depth})")
        flipped = [f"<code>{layer}</code> ({n})" for candidate, layer, n in causes if candidate == row.candidate]
        where = (f"; for each flipped state, the first layer past {m.tolerance:g}: {', '.join(flipped)}" if flipped
                 else "")
        items.append(f"<li><b>{row.candidate}</b> ({row.precision}): {first}; {row.flips} of {row.n_states} states "
                     f"flip{where}.</li>")
    return f"<ul>{''.join(items)}</ul>"


KIND = Kind(
    name="localisation",
    model=LocalisationMeasurement,
    migrations=MIGRATIONS,
    views=[],
    execute=execute,
    participants=lambda m: list(m.runtimes),
    metric_names=METRIC_NAMES,
    metrics=metrics,
    report=report,
    references=LocalisationMeasurement.references,
    spec_problems=spec_problems,
    not_settings=frozenset({"runtimes", "baseline"}),
)
