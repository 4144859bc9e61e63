"""Two runs of one spec, measurement by measurement and metric by metric, as asv compare does.

Every value shown for run A and run B is computed from the raw rows, and so is its
significance:
  latency      the rounds of each runtime and batch size, never its calls (which the
               load correlates): each round's P50 and P95 (P99 and the mean where a
               verdict or --metric names them), wall time and thread CPU time, B/A by
               Welch's t 95% CI on their logarithms; worse or better beyond `factor`
               only when the whole interval is
  scores       the episodes of each policy or runtime: a paired bootstrap CI of the mean
               same-seed difference when both runs played the same seeds, otherwise
               Welch's t CI of the difference of the mean scores
  parity       deterministic: any change in action agreement, or a change of max |dQ|
               beyond the candidate's tolerance, is a change
  throughput,  a sweep's seeds are the repeats of a setting (a paired t CI of the mean
  training     same-seed difference, from 3 seeds on, when both runs trained the same seeds,
               else Welch's t CI of the difference of the means: a bootstrap over a few
               repeats is far too narrow); one value per run, or too few seeds, cannot show
               significance and is marked so
Each verdict is shown as both runs decided it; one that went from deployment-worthy to
rejected is a regression as a worse row is. One that went to inconclusive is shown as flipped
and is no regression: the second run's data could not decide, which an unchanged pair's runs
do often (a latency interval that straddles its threshold), and is no evidence of worse.
A significant change is marked better or worse only when it is also beyond `factor`
(asv's default 1.1); parity, which has no noise, is judged by its tolerance alone.

Two values are not comparable when the question changed: another contract, another
model file (artifact sha256), other measurement or runtime settings. Settings are those each
run stored as it began (runs.spec_settings, every default filled in by the runner that ran
it); where either run predates them, both are read from their spec text with this runner's
defaults, with a caution when the commits differ. Host, CPU, GPU and package versions are
shown and flagged; a timing taken on another machine is marked "different machine", never
better or worse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace

import yaml

from breakout_core.common.messages import first_line
from runner.compare.rows import (
    BETTER,
    DIFFERENT_MACHINE,
    NO_CHANGE,
    NOT_COMPARABLE,
    NOT_TESTABLE,
    WORSE,
    Row,
    RunSide,
    differences,
)
from runner.kinds.kind import nothing_to_compare
from runner.kinds.registry import KINDS
from runner.spec.stored import stored_spec_problem
from runner.store.database import Store

DEFAULT_FACTOR = 1.1  # asv compare --factor
MACHINE_FIELDS = ("host", "cpu", "gpu")
# How both runs' settings are read: as each run stored them when it began, or, where either run
# predates that, from both spec texts with this runner's defaults, or as written where this
# runner no longer accepts one of them.
SETTINGS_AS_RUN = "as run"
SETTINGS_FILLED = "spec text with this runner's defaults"
SETTINGS_WRITTEN = "spec text as written, no defaults (this runner rejects one of them)"


class CompareError(ValueError):
    """A request that cannot be compared as asked (unknown run, runs of two specs, too few runs)."""


WORTHY = "deployment-worthy"
FLIPPED_WORSE = ("rejected",)  # a worthy verdict that became one of these is a regression


@dataclass(frozen=True)
class VerdictPair:
    """One verdict of the spec as each run decided it (None: not decided in that run)."""

    verdict: str
    measurement: str
    candidate: str
    baseline: str
    outcome_a: str | None
    outcome_b: str | None

    @property
    def flipped(self) -> bool:
        return self.outcome_a != self.outcome_b

    @property
    def regressed(self) -> bool:
        return self.outcome_a == WORTHY and self.outcome_b in FLIPPED_WORSE


@dataclass
class Comparison:
    a: RunSide
    b: RunSide
    factor: float
    environment: list[tuple[str, str, str, bool]]  # (what, in A, in B, flagged)
    rows: list[Row] = field(default_factory=list)
    verdicts: list[VerdictPair] = field(default_factory=list)

    @property
    def caution(self) -> str | None:
        """What the rows may not show, or None: settings that read the same but may not have been
        (runs of two commits whose settings were not both stored as they ran), and a run that did
        not finish, whose rows may stop short."""
        a, b = self.a, self.b
        cautions = [f"run {label} is {side.status}: its rows may stop short of the spec"
                    for label, side in (("A", a), ("B", b)) if side.status != "done"]
        if a.settings_read != SETTINGS_AS_RUN and a.git_commit != b.git_commit:
            cautions.insert(0, f"settings are read from both runs' {a.settings_read}: a default that changed between "
                               f"commits {a.git_commit} and {b.git_commit} does not show")
        return "; ".join(cautions) or None

    @property
    def same_machine(self) -> bool:
        return all(getattr(self.a, f) == getattr(self.b, f) for f in MACHINE_FIELDS)

    def judged(self) -> list[Row]:
        """Rows whose mark says what the data showed: better, worse or no significant change."""
        return [r for r in self.rows if r.mark in (BETTER, WORSE, NO_CHANGE)]

    def regressions(self, factor: float) -> list[Row]:
        """Rows that got significantly worse beyond `factor` (timings only on the same machine)."""
        return [r for r in self.rows if r.changed_for_the_worse(factor)
                and not (r.machine_bound and not self.same_machine)]

    def gate_failures(self, factor: float) -> list[str]:
        """Why `--fail-on-regression FACTOR` fails, one line each: a row worse beyond `factor`, or a
        verdict that was deployment-worthy in A and is rejected in B."""
        rows = [f"regression: {r.measurement} {r.subject} {r.metric}: {r.value_a:.4g} → {r.value_b:.4g} ({r.test})"
                for r in self.regressions(factor)]
        return rows + [f"verdict flipped: {v.verdict} ({v.candidate} vs {v.baseline}): {v.outcome_a} → {v.outcome_b}"
                       for v in self.verdicts if v.regressed]

    def totals(self) -> dict[str, int]:
        """Rows by what their mark says, as asv compare sums them up."""
        counts = {"worse": 0, "better": 0, "unchanged": 0, "not comparable": 0}
        for row in self.rows:
            key = {WORSE: "worse", BETTER: "better", NO_CHANGE: "unchanged"}.get(row.mark, "not comparable")
            counts[key] += 1
        return counts

    def summary_line(self) -> str:
        """One line: "n worse, n better, n unchanged, n not comparable; verdicts: n flipped"."""
        rows = ", ".join(f"{n} {what}" for what, n in self.totals().items())
        flipped = sum(v.flipped for v in self.verdicts)
        regressed = sum(v.regressed for v in self.verdicts)
        return (f"{rows}; verdicts: {flipped} of {len(self.verdicts)} flipped"
                + (f" ({regressed} from {WORTHY} to rejected)" if regressed else ""))


# -- choosing the runs ---------------------------------------------------------------------------

def resolve_runs(con, run_a: str | None, run_b: str | None, spec_name: str | None) -> tuple[str, str]:
    """(A, B): the two runs named, or the last two finished runs of `spec_name` (older first)."""
    if spec_name is not None:
        if run_a or run_b:
            raise CompareError("give either RUN_A RUN_B or --spec NAME, not both")
        ids = [r[0] for r in con.execute("SELECT run_id FROM runs WHERE spec_name = ? AND status = 'done' "
                                         "ORDER BY started_at DESC LIMIT 2", [spec_name]).fetchall()]
        if len(ids) < 2:
            raise CompareError(f"spec {spec_name!r} has {len(ids)} finished run(s) in this database; "
                               "compare needs two")
        return ids[1], ids[0]
    if not run_a or not run_b:
        raise CompareError("name two runs (RUN_A RUN_B) or a spec (--spec NAME)")
    if run_a == run_b:
        raise CompareError(f"run {run_a} compared with itself")
    return run_a, run_b


def _sides(con, id_a: str, id_b: str) -> tuple[RunSide, RunSide]:
    rows, texts, stored = [], [], []
    for run_id in (id_a, id_b):
        row = con.execute("SELECT run_id, spec_name, status, started_at, git_commit, contract_hash, host, cpu, gpu, "
                          "packages, spec_text, spec_settings FROM runs WHERE run_id = ?", [run_id]).fetchone()
        if row is None:
            raise CompareError(f"no run {run_id!r} in this database")
        *head, packages, text, settings = row
        rows.append((head, json.loads(packages or "{}")))
        texts.append(text)
        stored.append(json.loads(settings) if settings else None)
    *trees, read = (*stored, SETTINGS_AS_RUN) if all(stored) else _spec_trees(*texts)
    for run_id, tree in zip((id_a, id_b), trees):
        if problem := stored_spec_problem(tree):
            raise CompareError(f"run {run_id}: its stored spec cannot be compared ({problem})")
    return tuple(RunSide(*head, packages=packages, spec=tree, settings_read=read)
                 for (head, packages), tree in zip(rows, trees))


def _spec_trees(text_a: str, text_b: str) -> tuple[dict, dict, str]:
    """Both stored specs with this runner's defaults filled in (so an omitted default equals a
    written one), or both as written when the current code no longer accepts one of them; and
    which of the two."""
    from runner.spec.document import settings_as_written
    from runner.spec.yaml_source import read_spec_text

    try:
        return settings_as_written(text_a), settings_as_written(text_b), SETTINGS_FILLED
    except Exception:  # an older spec: its written fields are still comparable
        pass
    try:
        return read_spec_text(text_a) or {}, read_spec_text(text_b) or {}, SETTINGS_WRITTEN
    except (yaml.YAMLError, ValueError, RecursionError) as exc:
        raise CompareError(f"a stored spec text does not read as YAML ({first_line(exc)})") from None


def _environment(a: RunSide, b: RunSide) -> list[tuple[str, str, str, bool]]:
    rows = [(f, str(getattr(a, f)), str(getattr(b, f)), getattr(a, f) != getattr(b, f)) for f in MACHINE_FIELDS]
    for name in sorted(set(a.packages) | set(b.packages)):
        va, vb = a.packages.get(name), b.packages.get(name)
        rows.append((name, str(va), str(vb), va != vb))
    rows.append(("commit", str(a.git_commit), str(b.git_commit), False))  # what a comparison usually asks about
    rows.append(("settings", a.settings_read, b.settings_read, False))  # one reading for both: see `caution`
    return rows


# -- comparing -------------------------------------------------------------------------------------

def compare_runs(store: Store, run_a: str | None, run_b: str | None, *, spec_name: str | None = None,
                 factor: float = DEFAULT_FACTOR, metrics: tuple[str, ...] = ()) -> Comparison:
    """Every measurement of the runs' spec, metric by metric, and every verdict as each run
    decided it; `metrics` names metrics to judge beyond each kind's own rows (the statistics the
    spec's verdicts use are judged without being named). Raises CompareError for a wrong request."""
    if factor < 1:
        raise CompareError(f"factor {factor:g} must be >= 1")
    with store.reader() as con:
        id_a, id_b = resolve_runs(con, run_a, run_b, spec_name)
        a, b = _sides(con, id_a, id_b)
        if a.spec_name != b.spec_name:
            raise CompareError(f"runs of different specs: {a.run_id} is {a.spec_name!r}, {b.run_id} is "
                               f"{b.spec_name!r}; compare asks one spec's question twice")
        asked = _verdict_metrics(a.spec) | _verdict_metrics(b.spec) | set(metrics)
        a, b = replace(a, asked=frozenset(asked)), replace(b, asked=frozenset(asked))
        comparison = Comparison(a, b, factor, _environment(a, b))
        run_problem = None
        if a.contract_hash != b.contract_hash:
            run_problem = f"contract differs: {a.contract_hash} → {b.contract_hash}"
        names = [m["name"] for m in a.spec.get("measurements", [])]
        names += [m["name"] for m in b.spec.get("measurements", []) if m["name"] not in names]
        for name in names:
            comparison.rows += _measurement_rows(con, a, b, name, run_problem)
        comparison.verdicts = _verdict_pairs(con, a.run_id, b.run_id)
    shown = {r.metric for r in comparison.rows}
    if unknown := [m for m in metrics if m not in shown]:
        raise CompareError(f"--metric {unknown[0]}: not a metric of {a.spec_name}'s runs; they have "
                           f"{', '.join(sorted(shown))}")
    for row in comparison.rows:
        row.mark = _mark(row, factor, comparison.same_machine)
    return comparison


def _verdict_metrics(spec: dict) -> set[str]:
    """The metric names a spec's verdicts judge by."""
    return {metric for verdict in spec.get("verdicts") or [] for metric in verdict.get("deployment_worthy_when") or {}}


def _verdict_pairs(con, id_a: str, id_b: str) -> list[VerdictPair]:
    """Each verdict decided in either run, A's outcome beside B's, in the order of its name."""
    decided: dict[str, dict] = {}
    for label, run_id in (("a", id_a), ("b", id_b)):
        for verdict, measurement, candidate, baseline, outcome in con.execute(
                "SELECT verdict, measurement, candidate, baseline, outcome FROM verdicts WHERE run_id = ? "
                "ORDER BY decided_at", [run_id]).fetchall():
            entry = decided.setdefault(verdict, {"measurement": measurement, "candidate": candidate,
                                                 "baseline": baseline, "a": None, "b": None})
            entry[label] = outcome
    return [VerdictPair(name, e["measurement"], e["candidate"], e["baseline"], e["a"], e["b"])
            for name, e in sorted(decided.items())]


def _measurement_rows(con, a: RunSide, b: RunSide, name: str, run_problem: str | None) -> list[Row]:
    m_a, m_b = a.measurement(name), b.measurement(name)
    if m_a is None or m_b is None:
        return [Row(name, "", "measurement", None, None, True, "",
                    None, problem=f"only in run {'A' if m_b is None else 'B'}")]
    kind = m_a.get("kind")
    if kind != m_b.get("kind"):
        return [Row(name, "", "measurement", None, None, True, "", None,
                    problem=f"kind {kind} → {m_b.get('kind')}")]
    if kind not in KINDS:
        return [Row(name, "", "measurement", None, None, True, "", None,
                    problem=f"kind {kind!r} is not one this runner knows")]
    if KINDS[kind].compare is nothing_to_compare:
        return [Row(name, "", "measurement", None, None, True, "", None,
                    problem=f"runner compare does not judge {kind} measurements: their rows are in each run's "
                            "report and in `runner sql`")]
    rows = KINDS[kind].compare(con, a, b, m_a, m_b)
    settings = differences(m_a, m_b, KINDS[kind].not_settings | {"name"})
    problem = run_problem or (f"settings differ: {'; '.join(settings)}" if settings else None)
    for row in rows:
        row.problem = problem or row.problem
    return rows


def _mark(row: Row, factor: float, same_machine: bool) -> str:
    if row.problem:
        return NOT_COMPARABLE
    if row.machine_bound and not same_machine:
        return DIFFERENT_MACHINE
    if row.significant is None:
        return NOT_TESTABLE
    if row.changed_for_the_worse(factor):
        return WORSE
    if row.changed_for_the_better(factor):
        return BETTER
    if row.significant and row.uses_factor:
        row.note = "; ".join(filter(None, [row.note, f"significant, but within the factor {factor:g}"]))
    return NO_CHANGE
