"""Two runs of one spec, measurement by measurement and metric by metric, as asv compare does.

Every value shown for run A and run B is computed from the raw rows, and so is its
significance:
  latency      the samples of each runtime and batch size: a two-sided Mann-Whitney U,
               significant at p < 0.002 (99% median intervals when too few samples)
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
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import duckdb
import numpy as np
import yaml

from breakout_core.messages import first_line
from runner.spec import stored_spec_problem
from runner.store import Store

BETTER = "better"
WORSE = "worse"
NO_CHANGE = "no significant change"
NOT_COMPARABLE = "not comparable"
DIFFERENT_MACHINE = "different machine"
NOT_TESTABLE = "not testable"
DEFAULT_FACTOR = 1.1  # asv compare --factor
MACHINE_FIELDS = ("host", "cpu", "gpu")
# How both runs' settings are read: as each run stored them when it began, or, where either run
# predates that, from both spec texts with this runner's defaults, or as written where this
# runner no longer accepts one of them.
SETTINGS_AS_RUN = "as run"
SETTINGS_FILLED = "spec text with this runner's defaults"
SETTINGS_WRITTEN = "spec text as written, no defaults (this runner rejects one of them)"

# measurement fields that choose what is measured or shown (which runtimes, seeds, batch
# sizes), not what a value means: they may differ between two runs that stay comparable
NOT_SETTINGS: dict[str, set[str]] = {
    "evaluate": {"policies", "seeds", "batch_size", "gif", "bootstrap"},
    "episodes": {"runtimes", "baseline", "seeds", "batch_size", "bootstrap", "parity", "latency"},
    "latency": {"runtimes", "baseline", "batch_sizes", "verdict_batch_size"},
    "parity": {"runtimes", "baseline", "batch_sizes"},
    "closed_loop": {"runtimes", "baseline"},
    "throughput": {"sweep", "grid", "modes", "repeats"},  # grid: the spelling of specs stored before
    "train": {"sweep", "seeds", "score_seeds", "score_batch", "evaluate_checkpoints", "gif", "diagnostics_every",
              "checkpoint_at", "checkpoint_every"},
    "export": set(),
    "training_history": set(),
}


class CompareError(ValueError):
    """A request that cannot be compared as asked (unknown run, runs of two specs, too few runs)."""


@dataclass(frozen=True)
class RunSide:
    run_id: str
    spec_name: str
    status: str
    started_at: Any
    git_commit: str | None
    contract_hash: str | None
    host: str
    cpu: str | None
    gpu: str | None
    packages: dict
    spec: dict  # the spec as the run ran it, or as `settings_read` says
    settings_read: str  # how both runs' settings were read: SETTINGS_AS_RUN, or from their text

    def measurement(self, name: str) -> dict | None:
        return next((m for m in self.spec.get("measurements", []) if m.get("name") == name), None)


@dataclass
class Row:
    """One metric of one subject (a runtime and batch size, a policy, a trial) in both runs."""

    measurement: str
    subject: str
    metric: str
    value_a: float | None
    value_b: float | None
    lower_is_better: bool
    test: str  # how significance was decided, with its figures
    significant: bool | None  # None: the rows cannot show it (one value per run)
    uses_factor: bool = True  # False: a deterministic rule decides (parity), no noise to allow for
    machine_bound: bool = False  # a timing: taken on two machines it says nothing about the code
    problem: str | None = None  # why A and B are not the same question
    note: str = ""
    mark: str = ""

    @property
    def ratio(self) -> float | None:
        if self.value_a is None or self.value_b is None or self.value_a == 0:
            return None
        return self.value_b / self.value_a

    @property
    def worse_by(self) -> float | None:
        """How many times worse B is than A (> 1: worse, < 1: better); None without both values."""
        if self.value_a is None or self.value_b is None:
            return None
        num, den = (self.value_b, self.value_a) if self.lower_is_better else (self.value_a, self.value_b)
        if den == 0:
            return 1.0 if num == 0 else math.inf
        return num / den

    def changed_for_the_worse(self, factor: float) -> bool:
        """Significantly worse, and beyond `factor` where noise is possible."""
        if self.problem or not self.significant or self.worse_by is None:
            return False
        return self.worse_by >= factor if self.uses_factor else self.worse_by > 1

    def changed_for_the_better(self, factor: float) -> bool:
        if self.problem or not self.significant or self.worse_by is None:
            return False
        return self.worse_by <= 1 / factor if self.uses_factor else self.worse_by < 1


@dataclass
class Comparison:
    a: RunSide
    b: RunSide
    factor: float
    environment: list[tuple[str, str, str, bool]]  # (what, in A, in B, flagged)
    rows: list[Row] = field(default_factory=list)

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
    from runner.spec import settings_as_written
    from runner.yaml_source import read_spec_text

    try:
        return settings_as_written(text_a), settings_as_written(text_b), SETTINGS_FILLED
    except Exception:  # noqa: BLE001 - an older spec: its written fields are still comparable
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


def _differences(a: dict | None, b: dict | None, ignore: set[str] = frozenset()) -> list[str]:
    a, b = a or {}, b or {}
    return [f"{k} {a.get(k)!r} → {b.get(k)!r}" for k in sorted((set(a) | set(b)) - ignore) if a.get(k) != b.get(k)]


# -- comparing -------------------------------------------------------------------------------------

def compare_runs(store: Store, run_a: str | None, run_b: str | None, *, spec_name: str | None = None,
                 factor: float = DEFAULT_FACTOR) -> Comparison:
    """Every measurement of the runs' spec, metric by metric; raises CompareError for a wrong request."""
    if factor < 1:
        raise CompareError(f"factor {factor:g} must be >= 1")
    with store.reader() as con:
        id_a, id_b = resolve_runs(con, run_a, run_b, spec_name)
        a, b = _sides(con, id_a, id_b)
        if a.spec_name != b.spec_name:
            raise CompareError(f"runs of different specs: {a.run_id} is {a.spec_name!r}, {b.run_id} is "
                               f"{b.spec_name!r}; compare asks one spec's question twice")
        comparison = Comparison(a, b, factor, _environment(a, b))
        run_problem = None
        if a.contract_hash != b.contract_hash:
            run_problem = f"contract differs: {a.contract_hash} → {b.contract_hash}"
        names = [m["name"] for m in a.spec.get("measurements", [])]
        names += [m["name"] for m in b.spec.get("measurements", []) if m["name"] not in names]
        for name in names:
            comparison.rows += _measurement_rows(con, a, b, name, run_problem)
    for row in comparison.rows:
        row.mark = _mark(row, factor, comparison.same_machine)
    return comparison


def _measurement_rows(con, a: RunSide, b: RunSide, name: str, run_problem: str | None) -> list[Row]:
    m_a, m_b = a.measurement(name), b.measurement(name)
    if m_a is None or m_b is None:
        return [Row(name, "", "measurement", None, None, True, "",
                    None, problem=f"only in run {'A' if m_b is None else 'B'}")]
    kind = m_a.get("kind")
    if kind != m_b.get("kind"):
        return [Row(name, "", "measurement", None, None, True, "", None,
                    problem=f"kind {kind} → {m_b.get('kind')}")]
    rows = COMPARERS.get(kind, lambda *_: [])(con, a, b, m_a, m_b)
    settings = _differences(m_a, m_b, NOT_SETTINGS.get(kind, set()) | {"name"})
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


def _runtime_problem(con, a: RunSide, b: RunSide, measurement: str, runtimes: list[str]) -> str | None:
    """Why a runtime's figures in A and B answer different questions: its settings, its model file,
    or that it could not run in one of them."""
    for runtime in runtimes:
        settings = _differences(a.spec.get("runtimes", {}).get(runtime), b.spec.get("runtimes", {}).get(runtime))
        if settings:
            return f"runtime {runtime} settings differ: {'; '.join(settings)}"
        status = [con.execute("SELECT available, reason, artifact, artifact_sha256 FROM runtime_status "
                              "WHERE run_id = ? AND measurement = ? AND runtime = ? ORDER BY recorded_at DESC LIMIT 1",
                              [side.run_id, measurement, runtime]).fetchone() for side in (a, b)]
        down = [(label, row[1]) for label, row in zip("AB", status) if row is not None and not row[0]]
        if down:
            where = "both runs" if len(down) == 2 else f"run {down[0][0]}"
            return f"runtime {runtime} unavailable in {where}: {down[0][1]}"
        if status[0] and status[1] and status[0][3] != status[1][3]:
            return (f"model file of {runtime} differs: {status[1][2]} sha256 {str(status[0][3])[:12]} → "
                    f"{str(status[1][3])[:12]}")
    return None


def _unavailable_rows(con, a: RunSide, b: RunSide, measurement: str, metric: str, shown: set[str]) -> list[Row]:
    """A row for each runtime that has no figures to compare because it could not run in A or B
    (a CUDA runtime on a CPU machine), so that it is listed with its reason, not left out."""
    names = {r[0] for r in con.execute("SELECT runtime FROM runtime_status WHERE run_id IN (?, ?) AND measurement = ? "
                                       "AND NOT available", [a.run_id, b.run_id, measurement]).fetchall()}
    return [Row(measurement, runtime, metric, None, None, True, "", None,
                problem=_runtime_problem(con, a, b, measurement, [runtime]))
            for runtime in sorted(names - shown)]


def _samples_row(measurement: str, subject: str, metric: str, a: np.ndarray, b: np.ndarray, *,
                 lower_is_better: bool, machine_bound: bool, note: str = "") -> Row:
    """A metric that is the mean of repeated values: Welch's t CI of the difference when both runs
    have two or more, otherwise one value per run cannot show significance."""
    from breakout_core.stats import difference_interval

    value_a = float(np.mean(a)) if len(a) else None
    value_b = float(np.mean(b)) if len(b) else None
    if len(a) >= 2 and len(b) >= 2:
        ci = difference_interval(a, b)
        test = (f"{ci.method} {ci.confidence:.0%} CI of B − A [{ci.low:.4g}, {ci.high:.4g}] "
                f"(n {len(a)}/{len(b)})")
        significant: bool | None = ci.low > 0 or ci.high < 0
    else:
        test, significant = f"{len(a)} vs {len(b)} value(s): one sample per run cannot show significance", None
    problem = None if len(a) and len(b) else f"measured only in run {'A' if len(a) else 'B'}"
    return Row(measurement, subject, metric, value_a, value_b, lower_is_better, test, significant,
               machine_bound=machine_bound, problem=problem, note=note)


def _latency(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    from breakout_core.stats import sample_shift

    name = m_a["name"]
    samples, series = {}, {}
    for label, side in (("A", a), ("B", b)):
        for runtime, batch, ms in con.execute(
                "SELECT runtime, batch_size, list(ms ORDER BY sample) FROM latency_samples WHERE run_id = ? "
                "AND measurement = ? GROUP BY ALL", [side.run_id, name]).fetchall():
            samples[(label, runtime, batch)] = np.asarray(ms, dtype=np.float64)
        cursor = con.execute("SELECT * EXCLUDE (run_id, measurement) FROM latency_series WHERE run_id = ? "
                             "AND measurement = ?", [side.run_id, name])
        columns = [d[0] for d in cursor.description]
        for values in cursor.fetchall():
            settings = dict(zip(columns, values))
            settings["input"] = _by_content(settings["input"])
            series[(label, settings.pop("runtime"), settings.pop("batch_size"))] = settings
    rows = []
    for runtime, batch in sorted({(r, n) for _, r, n in samples}):
        subject = f"{runtime} b={batch}"
        sa, sb = samples.get(("A", runtime, batch)), samples.get(("B", runtime, batch))
        if sa is None or sb is None:
            problem = (_runtime_problem(con, a, b, name, [runtime])
                       or f"measured only in run {'A' if sb is None else 'B'}")
            rows.append(Row(name, subject, "p50_ms", _p(sa, 50), _p(sb, 50), True, "", None, machine_bound=True,
                            problem=problem))
            continue
        shift = sample_shift(sa, sb)
        p95 = f"P95 {_p(sa, 95):.4g} → {_p(sb, 95):.4g} ms"
        row = Row(name, subject, "p50_ms", _p(sa, 50), _p(sb, 50), True, shift.method, shift.significant,
                  machine_bound=True, note=p95)
        settings = _differences(series.get(("A", runtime, batch)), series.get(("B", runtime, batch)),
                                {"timer_resolution_s"})
        row.problem = (f"series settings differ: {'; '.join(settings)}" if settings
                       else _runtime_problem(con, a, b, name, [runtime]))
        rows.append(row)
    return rows + _unavailable_rows(con, a, b, name, "p50_ms", {r for _, r, _ in samples})


def _by_content(input_text: str) -> str:
    """A latency input as recorded ("fixed states PATH (sha256 ...), ...") without its path: the same
    states read from another folder are the same input."""
    return re.sub(r"^fixed states .*? \(sha256", "fixed states (sha256", input_text)


def _p(values: np.ndarray | None, q: float) -> float | None:
    from breakout_core.stats import PERCENTILE_METHOD

    return None if values is None else float(np.percentile(values, q, method=PERCENTILE_METHOD))


def _episode_rows(con, a: RunSide, b: RunSide, m_a: dict, subject_problem: Callable[[str], str | None]) -> list[Row]:
    """Mean score of every policy (or runtime, or checkpoint) that played in both runs."""
    name = m_a["name"]
    played = {label: {p: (np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.float64)) for p, s, v in con.execute(
        "SELECT policy, list(seed ORDER BY seed), list(score ORDER BY seed) FROM episodes WHERE run_id = ? "
        "AND measurement = ? GROUP BY policy", [side.run_id, name]).fetchall()} for label, side in (("A", a), ("B", b))}
    rows = []
    for policy in sorted(set(played["A"]) | set(played["B"])):
        subject = f"policy {policy}"
        if policy not in played["A"] or policy not in played["B"]:
            only = "A" if policy in played["A"] else "B"
            rows.append(Row(name, subject, "mean_score", None, None, False, "", None,
                            problem=f"played only in run {only}"))
            continue
        rows.append(_scores_row(name, subject, "mean_score", played["A"][policy], played["B"][policy],
                                m_a.get("bootstrap") or {}, problem=subject_problem(policy)))
    return rows


def _scores_row(measurement: str, subject: str, metric: str, played_a: tuple[np.ndarray, np.ndarray],
                played_b: tuple[np.ndarray, np.ndarray], boot: dict, *, problem: str | None = None,
                note: str = "") -> Row:
    """Episode scores of one subject in both runs, each as (seeds, scores) in seed order: a paired
    bootstrap CI of the same-seed differences where both played the same seeds, else Welch's t.
    Scores that do not vary (a handful of distinct games replayed) give an interval no width, and
    show no significance."""
    from breakout_core.stats import difference_interval, paired_bootstrap_ci

    confidence, resamples, seed = boot.get("confidence", 0.95), boot.get("resamples", 10_000), boot.get("seed", 0)
    (seeds_a, sa), (seeds_b, sb) = played_a, played_b
    paired = len(seeds_a) == len(seeds_b) and bool((seeds_a == seeds_b).all())
    row = Row(measurement, subject, metric, float(sa.mean()), float(sb.mean()), False, "", None, problem=problem,
              note=note if paired else "; ".join(filter(None, [note, "the runs played other seeds"])))
    if min(len(sa), len(sb)) < 2:
        row.test = "one episode per run cannot show significance"
    elif paired and (shift := _unvarying_shift(sb - sa, "an interval")):
        row.test = shift
    elif paired:
        ci = paired_bootstrap_ci(sb - sa, confidence=confidence, n_resamples=resamples, seed=seed)
        row.test = (f"paired bootstrap {confidence:.0%} CI of the mean same-seed difference B − A "
                    f"[{ci.low:.3g}, {ci.high:.3g}] ({len(sa)} seeds)")
        row.significant = ci.low > 0 or ci.high < 0
    elif flat := _unvarying_values(sa, sb, "scores", f"{len(sa)}/{len(sb)} episodes"):
        row.test = flat
    else:
        ci = difference_interval(sa, sb, confidence=confidence)
        row.test = (f"{ci.method} {confidence:.0%} CI of B − A [{ci.low:.3g}, {ci.high:.3g}] "
                    f"({len(sa)}/{len(sb)} episodes, other seeds)")
        row.significant = ci.low > 0 or ci.high < 0
    return row


def _unvarying_shift(differences: np.ndarray, interval: str) -> str | None:
    """Why same-seed differences show nothing, or None: all equal and not zero, they give
    `interval` no width (a handful of distinct games replayed, say)."""
    if np.ptp(differences) == 0 and differences[0] != 0:
        return (f"every seed moved by {differences[0]:.4g} ({len(differences)} seeds): differences that do not vary "
                f"give {interval} no width")
    return None


def _unvarying_values(a: np.ndarray, b: np.ndarray, what: str, count: str) -> str | None:
    """Why two runs' unpaired values show nothing, or None: neither varies and they differ."""
    if np.ptp(a) == 0 and np.ptp(b) == 0 and a[0] != b[0]:
        return f"neither run's {what} vary: a t interval has no width ({count})"
    return None


def _policy_files(con, run_id: str, measurement: str) -> dict[str, str]:
    """{policy: sha256} of the checkpoint files a run's evaluate measurement played; none where
    the database predates the table (a file this runner may read but not migrate)."""
    try:
        return dict(con.execute("SELECT policy, sha256 FROM policy_files WHERE run_id = ? AND measurement = ?",
                                [run_id, measurement]).fetchall())
    except duckdb.CatalogException:
        return {}


def _evaluate(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    files = [_policy_files(con, side.run_id, m_a["name"]) for side in (a, b)]

    def policy_problem(policy: str) -> str | None:
        settings = _differences(a.spec.get("policies", {}).get(policy), b.spec.get("policies", {}).get(policy))
        if settings:
            return f"policy {policy} differs: {'; '.join(settings)}"
        sha_a, sha_b = (side.get(policy) for side in files)
        if sha_a and sha_b and sha_a != sha_b:
            return f"model file of policy {policy} differs: sha256 {sha_a[:12]}… → {sha_b[:12]}…"
        return None

    rows = _episode_rows(con, a, b, m_a, policy_problem)
    for row in rows:
        policy = row.subject.removeprefix("policy ")
        unrecorded = [label for label, side in zip("AB", files) if policy not in side]
        if (a.spec.get("policies", {}).get(policy) or {}).get("type") == "checkpoint" and unrecorded:
            row.note = "; ".join(filter(None, [row.note, f"its model file's sha256 is not recorded in run "
                                                         f"{' or '.join(unrecorded)}"]))
    return rows


def _episodes(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    rows = _episode_rows(con, a, b, m_a, lambda runtime: _runtime_problem(con, a, b, m_a["name"], [runtime]))
    played = {r.subject.removeprefix("policy ") for r in rows}
    return rows + _unavailable_rows(con, a, b, m_a["name"], "mean_score", played)


def _parity(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
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
        problem = _runtime_problem(con, a, b, name, [candidate, baseline])
        rows.append(Row(name, subject, "action_agreement", va[0], vb[0], False, "any change is a change (no noise)",
                        va[0] != vb[0], uses_factor=False, problem=problem))
        atol, rtol, scale = con.execute(
            "SELECT t.atol, t.rtol, max(greatest(abs(q.q_noop), abs(q.q_fire), abs(q.q_right), abs(q.q_left))) "
            "FROM parity_settings t JOIN parity_q q ON q.run_id = t.run_id AND q.measurement = t.measurement "
            "AND q.runtime = ? AND q.batch_size = ? WHERE t.run_id = ? AND t.measurement = ? AND t.runtime = ? "
            "GROUP BY ALL", [baseline, batch, b.run_id, name, candidate]).fetchone()
        tolerance = atol + rtol * scale
        moved = abs(vb[1] - va[1])
        rows.append(Row(name, subject, "max_abs_dq", va[1], vb[1], True,
                        f"|change| {moved:.3g} against the tolerance {tolerance:.3g} (atol {atol:g} + rtol {rtol:g} "
                        f"× max |Q| {scale:.3g})", moved > tolerance, uses_factor=False, problem=problem))
    return rows


def _by_seed(values: dict[str, float]) -> dict[str, dict[str, float]]:
    """{trial without its seed: {seed: value}} for the trials of a sweep over `seed`."""
    groups: dict[str, dict[str, float]] = {}
    for trial, value in values.items():
        if value is None or not math.isfinite(value):
            continue  # not measured (a NULL rate, a NaN mean): no repeat to judge
        parts = trial.split(",")
        seed = next((p for p in parts if p.startswith("seed=")), None)
        if seed is not None:
            rest = ",".join(p for p in parts if p != seed) or "base"
            groups.setdefault(rest, {})[seed] = value
    return groups


def _over_seeds(measurement: str, metric: str, a: dict[str, float], b: dict[str, float], *, lower_is_better: bool,
                machine_bound: bool, suffix: str = "") -> list[Row]:
    """Where a sweep repeats a setting over seeds, the seeds are the repeats: one row per setting,
    its significance from the seeds' values by a t interval, paired by seed when both runs trained
    the same seeds (a bootstrap over a handful of seeds covers far less than it claims). A paired
    interval needs MIN_SEEDS_FOR_INTERVAL seeds, as a verdict over seeds does, and differences
    that vary: equal ones (whole-number scores can give them) leave a t interval of zero width."""
    from breakout_core.stats import MIN_SEEDS_FOR_INTERVAL, trimmed_mean_interval

    ga, gb = _by_seed(a), _by_seed(b)
    rows = []
    for group in sorted(set(ga) | set(gb)):
        sa, sb = ga.get(group, {}), gb.get(group, {})
        if max(len(sa), len(sb)) < 2:
            continue  # one seed: its trial's own row says all there is
        subject = f"{group} over {max(len(sa), len(sb))} seeds{suffix}"
        if sorted(sa) != sorted(sb) or len(sa) < 2:
            va, vb = np.asarray(list(sa.values())), np.asarray(list(sb.values()))
            row = _samples_row(measurement, subject, metric, va, vb, lower_is_better=lower_is_better,
                               machine_bound=machine_bound, note="seeds differ between the runs")
            if row.significant is not None and min(len(va), len(vb)) < MIN_SEEDS_FOR_INTERVAL:
                row.test, row.significant = (f"{len(va)} vs {len(vb)} seeds: an interval over seeds needs at least "
                                             f"{MIN_SEEDS_FOR_INTERVAL} in each run"), None
            elif row.significant is not None and (flat := _unvarying_values(va, vb, "seeds",
                                                                            f"{len(va)} vs {len(vb)} seeds")):
                row.test, row.significant = flat, None
            rows.append(row)
            continue
        seeds = sorted(sa)
        differences = np.asarray([sb[s] - sa[s] for s in seeds])
        significant: bool | None = None
        if len(seeds) < MIN_SEEDS_FOR_INTERVAL:
            test = f"{len(seeds)} seeds: an interval over seeds needs at least {MIN_SEEDS_FOR_INTERVAL}"
        elif shift := _unvarying_shift(differences, "a t interval"):
            test = shift
        else:
            ci = trimmed_mean_interval(differences)
            test = (f"paired {ci.method} {ci.confidence:.0%} CI of the mean same-seed difference B − A "
                    f"[{ci.low:.4g}, {ci.high:.4g}] ({len(seeds)} seeds)")
            significant = ci.low > 0 or ci.high < 0
        rows.append(Row(measurement, subject, metric, float(np.mean([sa[s] for s in seeds])),
                        float(np.mean([sb[s] for s in seeds])), lower_is_better, test, significant,
                        machine_bound=machine_bound))
    return rows


def _throughput(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    name = m_a["name"]
    values = {label: {(t, mode): np.asarray(v, dtype=np.float64) for t, mode, v in con.execute(
        "SELECT trial, mode, list(transitions_per_s) FROM throughput_trials WHERE run_id = ? AND measurement = ? "
        "GROUP BY ALL", [side.run_id, name]).fetchall()} for label, side in (("A", a), ("B", b))}
    rows = []
    for trial, mode in sorted(set(values["A"]) | set(values["B"])):
        va, vb = values["A"].get((trial, mode), np.empty(0)), values["B"].get((trial, mode), np.empty(0))
        rows.append(_samples_row(name, f"{trial} / {mode}", "transitions_per_s", va, vb, lower_is_better=False,
                                 machine_bound=True))
    for mode in sorted({mode for side in values.values() for _, mode in side}):
        per_trial = [{t: float(v.mean()) for (t, m), v in values[label].items() if m == mode} for label in "AB"]
        rows += _over_seeds(name, "transitions_per_s", *per_trial, lower_is_better=False, machine_bound=True,
                            suffix=f" / {mode}")
    return rows


LAST_EPISODES = 20  # as the train_trial_summary view's last20_mean


def _agent(trial: str, training_seed: int, by_seed: bool) -> str:
    """A trained agent's label. Where either run trained several seeds, the seeds are the repeats,
    and each agent is named as a sweep over seed names it ("base,seed=42", "learning_rate=0.0001,
    seed=42"), whether its seed came from `seeds:` or from the sweep: the same agent pairs across
    both spellings, and two seeds' agents are never pooled. A row without its training seed (one
    stored without an attempt to take it from) keeps the seed its trial's name gives."""
    parts = trial.split(",")
    named = next((part.removeprefix("seed=") for part in parts if part.startswith("seed=")), None)
    seed = training_seed if training_seed is not None else named
    if not by_seed or seed is None:
        return trial
    rest = [part for part in parts if not part.startswith("seed=")]
    return f"{','.join(rest) or 'base'},seed={seed}"


def _train(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    name = m_a["name"]
    by_seed = any(m.get("seeds") is not None or "seed" in (m.get("sweep") or {}) for m in (m_a, m_b))
    rates, returns, scores = {}, {}, {}
    for label, side in (("A", a), ("B", b)):
        args = [side.run_id, name]
        scores[label] = {_agent(t, seed, by_seed): (np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.float64))
                         for t, seed, s, v in con.execute(
            "SELECT trial, training_seed, list(eval_seed ORDER BY eval_seed), list(score ORDER BY eval_seed) "
            "FROM train_scores WHERE run_id = ? AND measurement = ? GROUP BY ALL", args).fetchall()}
        rates[label] = {_agent(t, seed, by_seed): rate for t, seed, rate in con.execute(
            "SELECT trial, training_seed, arg_max(transitions_per_s, attempt) FROM train_results WHERE run_id = ? "
            "AND measurement = ? GROUP BY ALL", args).fetchall()}
        returns[label] = {_agent(t, seed, by_seed): np.asarray(v, dtype=np.float64) for t, seed, v in con.execute(
            "SELECT trial, training_seed, list(episode_return) FROM (SELECT trial, training_seed, episode_return, "
            "row_number() OVER (PARTITION BY trial, training_seed ORDER BY transition DESC, env_index DESC) AS back "
            "FROM train_episodes_valid WHERE run_id = ? AND measurement = ?) WHERE back <= ? GROUP BY ALL",
            [*args, LAST_EPISODES]).fetchall()}
    rows = []
    for trial in sorted({t for found in (rates, returns, scores) for side in found.values() for t in side}):
        rows.append(_samples_row(name, f"trial {trial}", f"last{LAST_EPISODES}_return",
                                 returns["A"].get(trial, np.empty(0)), returns["B"].get(trial, np.empty(0)),
                                 lower_is_better=False, machine_bound=False,
                                 note="consecutive training episodes of one trial, not independent seeds"))
        if trial in scores["A"] and trial in scores["B"]:
            rows.append(_scores_row(name, f"trial {trial}", "final_score", scores["A"][trial], scores["B"][trial], {},
                                    note="the final checkpoint's greedy episodes on the score seeds: one training "
                                         "seed's agent, not the training's spread over seeds"))
        elif trial in scores["A"] or trial in scores["B"]:
            rows.append(Row(name, f"trial {trial}", "final_score", None, None, False, "", None,
                            problem=f"scored only in run {'A' if trial in scores['A'] else 'B'}"))
        rate_a, rate_b = rates["A"].get(trial), rates["B"].get(trial)
        rows.append(_samples_row(name, f"trial {trial}", "transitions_per_s",
                                 np.asarray([] if rate_a is None else [rate_a]),
                                 np.asarray([] if rate_b is None else [rate_b]), lower_is_better=False,
                                 machine_bound=True))
    rows += _over_seeds(name, f"last{LAST_EPISODES}_mean", *[{t: float(v.mean()) for t, v in returns[label].items()}
                                                            for label in "AB"], lower_is_better=False,
                        machine_bound=False)
    rows += _over_seeds(name, "score_mean", *[{t: float(v.mean()) for t, (_, v) in scores[label].items()}
                                              for label in "AB"],
                        lower_is_better=False, machine_bound=False)
    rows += _over_seeds(name, "transitions_per_s", rates["A"], rates["B"], lower_is_better=False, machine_bound=True)
    return rows + _episode_rows(con, a, b, m_a, lambda _checkpoint: None)


def _closed_loop(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    name = m_a["name"]
    scores = {label: dict(con.execute("SELECT runtime, score FROM closed_loop_summary WHERE run_id = ? AND "
                                      "measurement = ?", [side.run_id, name]).fetchall())
              for label, side in (("A", a), ("B", b))}
    rows = []
    for runtime in sorted(set(scores["A"]) | set(scores["B"])):
        va, vb = scores["A"].get(runtime), scores["B"].get(runtime)
        row = _samples_row(name, runtime, "score", np.asarray([] if va is None else [va]),
                           np.asarray([] if vb is None else [vb]), lower_is_better=False, machine_bound=False,
                           note="one game from one seed")
        row.problem = row.problem or _runtime_problem(con, a, b, name, [runtime])
        rows.append(row)
    return rows + _unavailable_rows(con, a, b, name, "score", set(scores["A"]) | set(scores["B"]))


def _export(con, a: RunSide, b: RunSide, m_a: dict, m_b: dict) -> list[Row]:
    name = m_a["name"]
    files = {label: {art: (size, checkpoint) for art, size, checkpoint in con.execute(
        "SELECT artifact, bytes, checkpoint_sha256 FROM export_files WHERE run_id = ? AND measurement = ?",
        [side.run_id, name]).fetchall()} for label, side in (("A", a), ("B", b))}
    rows = []
    for artifact in sorted(set(files["A"]) | set(files["B"])):
        fa, fb = files["A"].get(artifact), files["B"].get(artifact)
        row = _samples_row(name, artifact, "bytes", np.asarray([fa[0]] if fa else []),
                           np.asarray([fb[0]] if fb else []), lower_is_better=True, machine_bound=False)
        if row.problem is None:  # a file's size is exact: any difference is real, no noise to test
            row.test, row.significant = "exact sizes, one file per run", fa[0] != fb[0]
            if fa[1] != fb[1]:
                row.problem = f"exported from another checkpoint: sha256 {str(fa[1])[:12]} → {str(fb[1])[:12]}"
        rows.append(row)
    return rows


COMPARERS: dict[str, Callable[..., list[Row]]] = {
    "latency": _latency, "evaluate": _evaluate, "episodes": _episodes, "parity": _parity, "throughput": _throughput,
    "train": _train, "closed_loop": _closed_loop, "export": _export,
}
