"""`parity` (Days 23, 25, 26): every runtime's Q-values on the same fixed states, at several batch sizes.

`parity_q` keeps every Q-value (one row per runtime, batch size and state) and the greedy
action the runtime takes there. The views compare each runtime with every other on the
same states at the same batch size, in float64, exactly as breakout_core.diagnosis.parity.compare_q
does (Polygraphy's convention, baseline as reference):

    element passes when |candidate - baseline| <= atol + rtol * |baseline|

with the candidate's tolerance from `parity_settings` (the spec's, or by its precision:
FP32 1e-5/1e-5, FP16 1e-3/1e-3, INT8 5e-2/5e-2). A non-finite candidate value counts as
infinitely far and its greedy action as -1. A near tie is a state whose baseline top-2
margin is smaller than that state's max |dQ|: there, a difference can swap the chosen action.

Margins beside agreement: a state is decisive when the baseline's best Q-value leads its
second by more than the spec's `decisive_margin`; agreement on the decisive states is
reported beside plain agreement, and `parity_flips` lists every state whose action changed,
with the baseline's margin and the max |dQ| there. Neither predicts game scores: most of
this agent's states are near-ties, and a small error on many near-equal choices changes how
it plays (see REPORT_CAVEAT), so a converted model's deployment rests on the closed loop and
the games.
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field, model_validator

from runner.compare.rows import Row, RunSide, runtime_problem
from runner.kinds.kind import Kind
from runner.kinds.shared.runtime_lifecycle import greedy, infer_in_batches, load_states, open_runtime
from runner.kinds.shared.runtime_metrics import PARITY_METRIC_NAMES as METRIC_NAMES
from runner.kinds.shared.runtime_metrics import parity_pair_metrics
from runner.kinds.shared.runtime_status import found_unavailable, runtime_sections, with_unavailable
from runner.kinds.shared.verdict_words import parity_words
from runner.report.section import Section
from runner.run.context import RunContext
from runner.spec.fields import Name, StrictModel
from runner.spec.runtimes import RuntimeMeasurement, runtime_precision


class Tolerance(StrictModel):
    atol: float = Field(ge=0.0)
    rtol: float = Field(ge=0.0)


class ParityMeasurement(RuntimeMeasurement):
    kind: Literal["parity"]
    name: Name
    fixed_states: Name = Field(description="artifact: the fixed states every runtime sees")
    batch_sizes: list[int] = Field(default_factory=lambda: [1], min_length=1, description="states fed per call")
    tolerances: dict[Name, Tolerance] = Field(default_factory=dict,
                                              description="runtime -> atol/rtol; default by precision (Polygraphy)")
    decisive_margin: float = Field(default=0.05, gt=0.0,
                                   description="a state is decisive when the baseline's best Q-value leads the "
                                               "second by more than this")

    @model_validator(mode="after")
    def _consistent(self) -> "ParityMeasurement":
        if len(self.runtimes) < 2:
            raise ValueError("parity compares at least 2 runtimes")
        if any(b < 1 or b > 4096 for b in self.batch_sizes) or len(set(self.batch_sizes)) != len(self.batch_sizes):
            raise ValueError("batch_sizes must be distinct, each 1..4096")
        unknown = sorted(set(self.tolerances) - set(self.runtimes))
        if unknown:
            raise ValueError(f"tolerances for runtimes not measured here: {unknown}")
        return self

    def references(self):
        return super().references() + [(("fixed_states",), "artifact:fixed_states", self.fixed_states)]


MIGRATIONS = [
    (
        "0420_parity",
        """
        CREATE TABLE parity_q (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, runtime VARCHAR NOT NULL,
            batch_size INTEGER NOT NULL, state INTEGER NOT NULL,
            q_noop DOUBLE, q_fire DOUBLE, q_right DOUBLE, q_left DOUBLE,
            action INTEGER NOT NULL
        );
        CREATE TABLE parity_settings (
            run_id VARCHAR NOT NULL, measurement VARCHAR NOT NULL, runtime VARCHAR NOT NULL,
            precision VARCHAR NOT NULL, atol DOUBLE NOT NULL, rtol DOUBLE NOT NULL, tolerance_from VARCHAR NOT NULL,
            states_path VARCHAR NOT NULL, states_sha256 VARCHAR NOT NULL, n_states INTEGER NOT NULL
        );
        """,
    ),
    (
        "0421_parity_decisive_margin",
        "ALTER TABLE parity_settings ADD COLUMN decisive_margin DOUBLE",
    ),
    (
        # every Q-value the model gives, in its output order: 18 under full_action_space, where the
        # named columns hold only NOOP, FIRE, RIGHT and LEFT
        "0422_parity_q_values",
        "ALTER TABLE parity_q ADD COLUMN q_values DOUBLE[]",
    ),
]

REPORT_CAVEAT = (
    "Neither plain nor decisive agreement predicts game scores. On the shipped agent, an INT8 file (static "
    "min/max, made with ONNX Runtime's quantizer outside this runner) that chose the FP32 action on 77% of 400 "
    "states the agent visits in its own games, and on every one of the 34 decisive ones, scored a mean of 35.3 "
    "against FP32's 71.1 over 30 games: most states are near-ties, and small errors on many near-equal choices "
    "change how the agent plays. Whether a converted model may be deployed rests on the closed loop and the games "
    "(closed_loop, episodes), not on this table.")

# the Q-values of NOOP, FIRE, RIGHT and LEFT (contract.minimal_outputs), named for the report's chart
_Q = ("q_noop", "q_fire", "q_right", "q_left")


def _all_q(row: str) -> str:
    """Every Q-value of a parity_q row: `q_values`, or the four named ones of rows stored before it."""
    return f"coalesce({row}.q_values, [{', '.join(f'{row}.{q}' for q in _Q)}])"


VIEWS = [
    f"""
    CREATE OR REPLACE VIEW parity_state_pairs AS
    WITH pairs AS (
        SELECT c.run_id, c.measurement, c.runtime AS candidate, b.runtime AS baseline, c.batch_size, c.state,
               list_zip({_all_q("c")}, {_all_q("b")}) AS cb, t.atol, t.rtol, t.decisive_margin,
               c.action AS candidate_action, b.action AS baseline_action,
               list_sort({_all_q("b")}, 'DESC') AS b_sorted
        FROM parity_q c
        JOIN parity_q b ON b.run_id = c.run_id AND b.measurement = c.measurement AND b.batch_size = c.batch_size
             AND b.state = c.state AND b.runtime <> c.runtime
        JOIN parity_settings t ON t.run_id = c.run_id AND t.measurement = c.measurement AND t.runtime = c.runtime
    ), elements AS (
        SELECT *,
               list_transform(cb, lambda p: CASE WHEN isfinite(p[1]) THEN abs(p[1] - p[2]) ELSE 'inf'::DOUBLE END)
                   AS d,
               len(list_filter(cb, lambda p: isfinite(p[1]) AND abs(p[1] - p[2]) <= atol + rtol * abs(p[2])))
                   AS elements_pass
        FROM pairs
    )
    SELECT run_id, measurement, candidate, baseline, batch_size, state,
           list_max(d) AS max_abs_dq, list_avg(d) AS mean_abs_dq,
           elements_pass, len(d) - elements_pass AS elements_fail, atol, rtol,
           candidate_action, baseline_action, candidate_action = baseline_action AS agree,
           b_sorted[1] - b_sorted[2] AS baseline_top2_margin,
           b_sorted[1] - b_sorted[2] < list_max(d) AS near_tie,
           b_sorted[1] - b_sorted[2] > decisive_margin AS decisive, decisive_margin
    FROM elements
    """,
    """
    CREATE OR REPLACE VIEW parity_summary AS
    SELECT run_id, measurement, candidate, baseline, batch_size,
           count(*) AS n_states, max(max_abs_dq) AS max_abs_dq, avg(mean_abs_dq) AS mean_abs_dq,
           sum(elements_pass) AS elements_pass, sum(elements_fail) AS elements_fail,
           count(*) FILTER (WHERE elements_fail = 0) AS states_pass,
           sum(elements_fail) = 0 AS allclose,
           count(*) FILTER (WHERE agree) AS action_agreement,
           avg(agree::INTEGER) AS action_agreement_fraction,
           count(*) FILTER (WHERE near_tie) AS near_ties,
           list(state ORDER BY state) FILTER (WHERE NOT agree) AS disagreeing_states,
           list(state ORDER BY state) FILTER (WHERE near_tie) AS near_tie_states,
           -- none where the rows predate decisive_margin
           CASE WHEN bool_and(decisive_margin IS NOT NULL) THEN count(*) FILTER (WHERE decisive) END AS decisive_states,
           CASE WHEN bool_and(decisive_margin IS NOT NULL) THEN count(*) FILTER (WHERE decisive AND agree) END
               AS decisive_agreement,
           avg(agree::INTEGER) FILTER (WHERE decisive) AS decisive_agreement_fraction,
           any_value(decisive_margin) AS decisive_margin,
           any_value(atol) AS atol, any_value(rtol) AS rtol
    FROM parity_state_pairs
    GROUP BY run_id, measurement, candidate, baseline, batch_size
    """,
    """
    CREATE OR REPLACE VIEW parity_flips AS
    SELECT run_id, measurement, candidate, baseline, batch_size, state, baseline_action, candidate_action,
           baseline_top2_margin, max_abs_dq, decisive, near_tie
    FROM parity_state_pairs
    WHERE NOT agree
    """,
    f"""
    CREATE OR REPLACE VIEW parity_batch_consistency AS
    WITH first AS (SELECT run_id, measurement, runtime, min(batch_size) AS batch_size FROM parity_q
                   GROUP BY run_id, measurement, runtime)
    SELECT c.run_id, c.measurement, c.runtime, f.batch_size AS reference_batch_size, c.batch_size,
           max(list_max(list_transform(list_zip({_all_q("c")}, {_all_q("b")}), lambda p: abs(p[1] - p[2]))))
               AS max_abs_dq,
           count(*) FILTER (WHERE c.action <> b.action) AS action_changes
    FROM parity_q c
    JOIN first f ON f.run_id = c.run_id AND f.measurement = c.measurement AND f.runtime = c.runtime
    JOIN parity_q b ON b.run_id = c.run_id AND b.measurement = c.measurement AND b.runtime = c.runtime
         AND b.batch_size = f.batch_size AND b.state = c.state
    GROUP BY ALL
    """,
]



def tolerance_for(m: ParityMeasurement, spec, runtime: str) -> tuple[float, float, str, str]:
    from breakout_core.diagnosis.parity import default_tolerance

    precision = runtime_precision(spec, runtime)
    if runtime in m.tolerances:
        t = m.tolerances[runtime]
        return t.atol, t.rtol, precision, "spec"
    atol, rtol = default_tolerance(precision)
    return atol, rtol, precision, f"default for {precision} (Polygraphy)"


def execute(m: ParityMeasurement, ctx: RunContext) -> None:
    import pyarrow as pa

    states, states_path, states_sha = load_states(ctx, m.fixed_states)
    obs = states.obs
    n = len(obs)
    task = ctx.progress.add_task(f"{m.name} · {n} states × {len(m.batch_sizes)} batch sizes", total=len(m.runtimes),
                                 unit="runtimes")
    for name in m.ordered_runtimes():
        if ctx.already_stored("parity_settings", m.name, runtime=name) or found_unavailable(ctx, m.name, name):
            ctx.progress.advance(task)
            continue
        with open_runtime(ctx, m.name, name) as runtime:
            if runtime is not None:
                columns: dict[str, list] = {k: [] for k in ("batch_size", "state", *_Q, "q_values", "action")}
                for batch in m.batch_sizes:
                    q = infer_in_batches(runtime, obs, batch).astype(np.float64)
                    columns["batch_size"] += [batch] * n
                    columns["state"] += list(range(n))
                    for j, key in zip(ctx.contract.minimal_outputs(), _Q):
                        columns[key] += q[:, j].tolist()
                    columns["q_values"] += q.tolist()
                    columns["action"] += greedy(q).tolist()
                table = pa.table({"run_id": [ctx.run_id] * len(columns["state"]),
                                  "measurement": [m.name] * len(columns["state"]),
                                  "runtime": [name] * len(columns["state"]), **columns})
                ctx.store.append_arrow("parity_q", table)
                atol, rtol, precision, source = tolerance_for(m, ctx.spec, name)
                ctx.store.append_rows("parity_settings", [{
                    "run_id": ctx.run_id, "measurement": m.name, "runtime": name, "precision": precision,
                    "atol": atol, "rtol": rtol, "tolerance_from": source, "states_path": str(states_path),
                    "states_sha256": states_sha, "n_states": n, "decisive_margin": m.decisive_margin}])
        ctx.progress.advance(task)




def metrics(con, run_id: str, m: ParityMeasurement, candidate: str, baseline: str) -> dict:
    found = with_unavailable(parity_pair_metrics(con, run_id, m.name, candidate, baseline), con, run_id, [m.name],
                             [candidate, baseline])
    return found


def report(con, run_id: str, m: ParityMeasurement) -> list[Section]:
    from runner.report.html import MAX_CHART_POINTS, altair, table_html

    alt = altair()
    base = m.baseline_runtime
    sections = runtime_sections(con, run_id, m.name)
    summary = con.execute(
        "SELECT candidate, batch_size, n_states, action_agreement, action_agreement_fraction, "
        "coalesce(array_to_string(disagreeing_states, ', '), '') AS disagreeing_states, max_abs_dq, mean_abs_dq, "
        "elements_fail, allclose, atol, rtol, near_ties, coalesce(array_to_string(near_tie_states, ', '), '') "
        "AS near_tie_states, decisive_states, decisive_agreement, decisive_agreement_fraction FROM parity_summary "
        "WHERE run_id = ? AND measurement = ? AND baseline = ? ORDER BY candidate, batch_size",
        [run_id, m.name, base]).df()
    if summary.empty:
        sections.append(Section(f"{m.name}: parity against {base}",
                                html="<p>No two runtimes ran here: nothing to compare.</p>"))
        return sections
    sections.append(Section(
        f"{m.name}: action agreement and |dQ| against {base} (same states, same batch size; "
        "element passes when |c − b| ≤ atol + rtol·|b|; decisive: the baseline's best Q leads its second by more "
        f"than {m.decisive_margin:g})", html=f"<p>{REPORT_CAVEAT}</p>" + table_html(summary, float_format="{:.3g}")))
    flips = con.execute(
        "SELECT candidate, batch_size, state, baseline_action, candidate_action, baseline_top2_margin, max_abs_dq, "
        "decisive, near_tie FROM parity_flips WHERE run_id = ? AND measurement = ? AND baseline = ? "
        "ORDER BY candidate, batch_size, baseline_top2_margin DESC", [run_id, m.name, base]).df()
    if not flips.empty:
        sections.append(Section(f"{m.name}: every state whose action changed against {base}, with the baseline's "
                                "top-2 margin and the max |dQ| there (widest margins first)",
                                html=table_html(flips, float_format="{:.3g}")))
    elements = con.execute(
        """SELECT c.runtime AS candidate, c.batch_size, c.state, a.action_name,
               [b.q_noop, b.q_fire, b.q_right, b.q_left][a.i] AS baseline_q,
               [c.q_noop, c.q_fire, c.q_right, c.q_left][a.i] AS candidate_q
        FROM parity_q c JOIN parity_q b ON b.run_id = c.run_id AND b.measurement = c.measurement
             AND b.batch_size = c.batch_size AND b.state = c.state AND b.runtime = ?
        CROSS JOIN (SELECT * FROM (VALUES (1, 'NOOP'), (2, 'FIRE'), (3, 'RIGHT'), (4, 'LEFT')) v(i, action_name)) a
        WHERE c.run_id = ? AND c.measurement = ? AND c.runtime <> ?
        ORDER BY candidate, c.batch_size, c.state, a.i LIMIT ?""",
        [base, run_id, m.name, base, MAX_CHART_POINTS]).df()
    if not elements.empty:
        elements["abs_dq"] = (elements["candidate_q"] - elements["baseline_q"]).abs()
        elements["log10_abs_dq"] = np.log10(elements["abs_dq"].clip(lower=1e-12))  # equal values drawn at -12
        elements["series"] = elements["candidate"] + " b=" + elements["batch_size"].astype(str)
        scatter = alt.Chart(elements).mark_circle(size=25, opacity=0.6).encode(
            x=alt.X("baseline_q:Q", title=f"Q ({base})"), y=alt.Y("candidate_q:Q", title="Q (candidate)"),
            color=alt.Color("series:N", title="candidate, batch"),
            tooltip=["candidate", "batch_size", "state", "action_name", "baseline_q", "candidate_q", "abs_dq"])
        diagonal = alt.Chart(elements).mark_line(color="gray", strokeDash=[4, 4]).encode(x="baseline_q:Q",
                                                                                         y="baseline_q:Q")
        hist = alt.Chart(elements).mark_bar(opacity=0.8).encode(
            x=alt.X("log10_abs_dq:Q", bin=alt.Bin(step=0.25), title=f"log10 |dQ| against {base} (equal: -12)"),
            y=alt.Y("count():Q", title="Q-values"), color=alt.Color("series:N", title="candidate, batch"),
            row=alt.Row("candidate:N", title=None))
        sections.append(Section(f"{m.name}: Q-value parity (every Q of every state) and the |dQ| histogram",
                                charts=[(scatter + diagonal).properties(width=420, height=380).to_dict(),
                                        hist.properties(width=640, height=120).to_dict()]))
    consistency = con.execute(
        "SELECT runtime, reference_batch_size, batch_size, max_abs_dq, action_changes FROM parity_batch_consistency "
        "WHERE run_id = ? AND measurement = ? AND batch_size <> reference_batch_size ORDER BY runtime, batch_size",
        [run_id, m.name]).df()
    if not consistency.empty:
        sections.append(Section(f"{m.name}: each runtime against itself at its smallest batch size",
                                html=table_html(consistency, float_format="{:.3g}")))
    return sections


# -- runner compare ---------------------------------------------------------------------------

def compare_parity(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    name = m_a["name"]
    baseline = m_a.get("baseline") or m_a["runtimes"][0]
    found = {label: {(c, n): (agree, dq) for c, n, agree, dq in con.execute(
        "SELECT candidate, batch_size, action_agreement_fraction, max_abs_dq FROM parity_summary WHERE run_id = ? "
        "AND measurement = ? AND baseline = ?", [side.run_id, name, baseline]).fetchall()}
        for label, side in (("A", a), ("B", b))}
    rows = []
    for candidate, batch in sorted(set(found["A"]) | set(found["B"])):
        subject = f"{candidate} vs {baseline} b={batch}"
        va, vb = found["A"].get((candidate, batch)), found["B"].get((candidate, batch))
        if va is None or vb is None:
            rows.append(Row(name, subject, "action_agreement", None, None, False, "", None,
                            problem=f"compared only in run {'A' if vb is None else 'B'}"))
            continue
        problem = runtime_problem(con, a, b, name, [candidate, baseline])
        rows.append(Row(name, subject, "action_agreement", va[0], vb[0], False, "any change is a change (no noise)",
                        va[0] != vb[0], uses_factor=False, problem=problem))
        atol, rtol, scale = con.execute(
            f"SELECT t.atol, t.rtol, max(list_max(list_transform({_all_q('q')}, lambda v: abs(v)))) "
            "FROM parity_settings t JOIN parity_q q ON q.run_id = t.run_id AND q.measurement = t.measurement "
            "AND q.runtime = ? AND q.batch_size = ? WHERE t.run_id = ? AND t.measurement = ? AND t.runtime = ? "
            "GROUP BY ALL", [baseline, batch, b.run_id, name, candidate]).fetchone()
        tolerance = atol + rtol * scale
        moved = abs(vb[1] - va[1])
        rows.append(Row(name, subject, "max_abs_dq", va[1], vb[1], True,
                        f"|change| {moved:.3g} against the tolerance {tolerance:.3g} (atol {atol:g} + rtol {rtol:g} "
                        f"× max |Q| {scale:.3g})", moved > tolerance, uses_factor=False, problem=problem))
    return rows


KIND = Kind(
    name="parity",
    model=ParityMeasurement,
    migrations=MIGRATIONS,
    views=VIEWS,
    execute=execute,
    participants=lambda m: list(m.runtimes),
    metric_names=METRIC_NAMES,
    metrics=metrics,
    report=report,
    references=ParityMeasurement.references,
    compare=compare_parity,
    not_settings=frozenset({"runtimes", "baseline", "batch_sizes"}),
    in_words=parity_words,
)
