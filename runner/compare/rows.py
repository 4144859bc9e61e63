"""The rows `runner compare` shows, and how one metric of two runs is judged from raw values.

Each kind's comparer (its Kind's `compare`) builds its rows with these helpers: repeated
values by Welch's t (latency's per-round statistics by their ratio's interval, a Row's
`ratio_interval`), episode scores by a paired bootstrap where both runs played the same
seeds, values over training seeds by a t interval, and what makes a row not comparable (a
runtime's settings, its model file, a runtime that could not run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

BETTER = "better"
WORSE = "worse"
NO_CHANGE = "no significant change"
NOT_COMPARABLE = "not comparable"
DIFFERENT_MACHINE = "different machine"
NOT_TESTABLE = "not testable"


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
    # metric names judged beyond a kind's own rows: those the spec's verdicts use and those the user named
    asked: frozenset[str] = frozenset()

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
    # the interval of value_b / value_a where one decides (latency over rounds): worse or better
    # beyond a factor only when the whole interval lies beyond it, never on the point estimate
    ratio_interval: tuple[float, float] | None = None

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

    @property
    def worse_by_interval(self) -> tuple[float, float] | None:
        """The interval of worse_by, where the row has one."""
        if self.ratio_interval is None:
            return None
        low, high = self.ratio_interval
        return (low, high) if self.lower_is_better else (1 / high, 1 / low)

    def changed_for_the_worse(self, factor: float) -> bool:
        """Significantly worse, and beyond `factor` where noise is possible (the whole interval
        beyond it, where the row has one)."""
        if self.problem or not self.significant or self.worse_by is None:
            return False
        if self.worse_by_interval is not None:
            return self.worse_by_interval[0] > factor
        return self.worse_by >= factor if self.uses_factor else self.worse_by > 1

    def changed_for_the_better(self, factor: float) -> bool:
        if self.problem or not self.significant or self.worse_by is None:
            return False
        if self.worse_by_interval is not None:
            return self.worse_by_interval[1] < 1 / factor
        return self.worse_by <= 1 / factor if self.uses_factor else self.worse_by < 1

def differences(a: dict | None, b: dict | None, ignore: set[str] = frozenset()) -> list[str]:
    a, b = a or {}, b or {}
    return [f"{k} {a.get(k)!r} → {b.get(k)!r}" for k in sorted((set(a) | set(b)) - ignore) if a.get(k) != b.get(k)]

def runtime_problem(con, a: RunSide, b: RunSide, measurement: str, runtimes: list[str]) -> str | None:
    """Why a runtime's figures in A and B answer different questions: its settings, its model file,
    or that it could not run in one of them."""
    for runtime in runtimes:
        settings = differences(a.spec.get("runtimes", {}).get(runtime), b.spec.get("runtimes", {}).get(runtime))
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

def unavailable_rows(con, a: RunSide, b: RunSide, measurement: str, metric: str, shown: set[str]) -> list[Row]:
    """A row for each runtime that has no figures to compare because it could not run in A or B
    (a CUDA runtime on a CPU machine), so that it is listed with its reason, not left out."""
    names = {r[0] for r in con.execute("SELECT runtime FROM runtime_status WHERE run_id IN (?, ?) AND measurement = ? "
                                       "AND NOT available", [a.run_id, b.run_id, measurement]).fetchall()}
    return [Row(measurement, runtime, metric, None, None, True, "", None,
                problem=runtime_problem(con, a, b, measurement, [runtime]))
            for runtime in sorted(names - shown)]

def samples_row(measurement: str, subject: str, metric: str, a: np.ndarray, b: np.ndarray, *,
                 lower_is_better: bool, machine_bound: bool, note: str = "") -> Row:
    """A metric that is the mean of repeated values: Welch's t CI of the difference when both runs
    have two or more, otherwise one value per run cannot show significance."""
    from breakout_core.statistics.stats import difference_interval

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

def percentile(values: np.ndarray | None, q: float) -> float | None:
    from breakout_core.statistics.stats import PERCENTILE_METHOD

    return None if values is None else float(np.percentile(values, q, method=PERCENTILE_METHOD))

def episode_rows(con, a: RunSide, b: RunSide, m_a: dict, subject_problem: Callable[[str], str | None]) -> list[Row]:
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
        rows.append(scores_row(name, subject, "mean_score", played["A"][policy], played["B"][policy],
                                m_a.get("bootstrap") or {}, problem=subject_problem(policy)))
    return rows

def scores_row(measurement: str, subject: str, metric: str, played_a: tuple[np.ndarray, np.ndarray],
                played_b: tuple[np.ndarray, np.ndarray], boot: dict, *, problem: str | None = None,
                note: str = "") -> Row:
    """Episode scores of one subject in both runs, each as (seeds, scores) in seed order: a paired
    bootstrap CI of the same-seed differences where both played the same seeds, else Welch's t.
    Scores that do not vary (a handful of distinct games replayed) give an interval no width, and
    show no significance."""
    from breakout_core.statistics.stats import difference_interval, paired_bootstrap_ci

    confidence, resamples, seed = boot.get("confidence", 0.95), boot.get("resamples", 10_000), boot.get("seed", 0)
    (seeds_a, sa), (seeds_b, sb) = played_a, played_b
    paired = len(seeds_a) == len(seeds_b) and bool((seeds_a == seeds_b).all())
    row = Row(measurement, subject, metric, float(sa.mean()), float(sb.mean()), False, "", None, problem=problem,
              note=note if paired else "; ".join(filter(None, [note, "the runs played other seeds"])))
    if min(len(sa), len(sb)) < 2:
        row.test = "one episode per run cannot show significance"
    elif paired and (shift := unvarying_shift(sb - sa, "an interval")):
        row.test = shift
    elif paired:
        ci = paired_bootstrap_ci(sb - sa, confidence=confidence, n_resamples=resamples, seed=seed)
        row.test = (f"paired bootstrap {confidence:.0%} CI of the mean same-seed difference B − A "
                    f"[{ci.low:.3g}, {ci.high:.3g}] ({len(sa)} seeds)")
        row.significant = ci.low > 0 or ci.high < 0
    elif flat := unvarying_values(sa, sb, "scores", f"{len(sa)}/{len(sb)} episodes"):
        row.test = flat
    else:
        ci = difference_interval(sa, sb, confidence=confidence)
        row.test = (f"{ci.method} {confidence:.0%} CI of B − A [{ci.low:.3g}, {ci.high:.3g}] "
                    f"({len(sa)}/{len(sb)} episodes, other seeds)")
        row.significant = ci.low > 0 or ci.high < 0
    return row

def unvarying_shift(differences: np.ndarray, interval: str) -> str | None:
    """Why same-seed differences show nothing, or None: all equal and not zero, they give
    `interval` no width (a handful of distinct games replayed, say)."""
    if np.ptp(differences) == 0 and differences[0] != 0:
        return (f"every seed moved by {differences[0]:.4g} ({len(differences)} seeds): differences that do not vary "
                f"give {interval} no width")
    return None

def unvarying_values(a: np.ndarray, b: np.ndarray, what: str, count: str) -> str | None:
    """Why two runs' unpaired values show nothing, or None: neither varies and they differ."""
    if np.ptp(a) == 0 and np.ptp(b) == 0 and a[0] != b[0]:
        return f"neither run's {what} vary: a t interval has no width ({count})"
    return None

def by_seed(values: dict[str, float]) -> dict[str, dict[str, float]]:
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

def over_seeds(measurement: str, metric: str, a: dict[str, float], b: dict[str, float], *, lower_is_better: bool,
                machine_bound: bool, suffix: str = "") -> list[Row]:
    """Where a sweep repeats a setting over seeds, the seeds are the repeats: one row per setting,
    its significance from the seeds' values by a t interval, paired by seed when both runs trained
    the same seeds (a bootstrap over a handful of seeds covers far less than it claims). A paired
    interval needs MIN_SEEDS_FOR_INTERVAL seeds, as a verdict over seeds does, and differences
    that vary: equal ones (whole-number scores can give them) leave a t interval of zero width."""
    from breakout_core.statistics.stats import MIN_SEEDS_FOR_INTERVAL, trimmed_mean_interval

    ga, gb = by_seed(a), by_seed(b)
    rows = []
    for group in sorted(set(ga) | set(gb)):
        sa, sb = ga.get(group, {}), gb.get(group, {})
        if max(len(sa), len(sb)) < 2:
            continue  # one seed: its trial's own row says all there is
        subject = f"{group} over {max(len(sa), len(sb))} seeds{suffix}"
        if sorted(sa) != sorted(sb) or len(sa) < 2:
            va, vb = np.asarray(list(sa.values())), np.asarray(list(sb.values()))
            row = samples_row(measurement, subject, metric, va, vb, lower_is_better=lower_is_better,
                               machine_bound=machine_bound, note="seeds differ between the runs")
            if row.significant is not None and min(len(va), len(vb)) < MIN_SEEDS_FOR_INTERVAL:
                row.test, row.significant = (f"{len(va)} vs {len(vb)} seeds: an interval over seeds needs at least "
                                             f"{MIN_SEEDS_FOR_INTERVAL} in each run"), None
            elif row.significant is not None and (flat := unvarying_values(va, vb, "seeds",
                                                                            f"{len(va)} vs {len(vb)} seeds")):
                row.test, row.significant = flat, None
            rows.append(row)
            continue
        seeds = sorted(sa)
        differences = np.asarray([sb[s] - sa[s] for s in seeds])
        significant: bool | None = None
        if len(seeds) < MIN_SEEDS_FOR_INTERVAL:
            test = f"{len(seeds)} seeds: an interval over seeds needs at least {MIN_SEEDS_FOR_INTERVAL}"
        elif shift := unvarying_shift(differences, "a t interval"):
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
