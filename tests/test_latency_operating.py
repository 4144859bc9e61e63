"""Operating characteristics of the latency rules, on real rounds: the shipped A/A recording
(tests/data/latency_aa_rounds.csv: models/reference/dqn_breakout.onnx timed against itself as two
ONNX Runtime CPU runtimes, 1260 interleaved rounds of 100 batch-1 calls, both loaded anew every
60 rounds as each run loads its own, on a machine that other jobs loaded) cut into consecutive
windows of each spec's rounds and judged as `runner run` and `runner compare` judge them. A
slowdown is injected by timing the candidate's calls longer.

Each bound here is one a loosened rule breaks: the point estimate in place of the interval passes
a candidate that is slower by the margin itself in about half the windows, and check_onnx's
former rule (point estimates of P50 and wall-time P95 over 5 rounds) rejected the unchanged file
in 42% of them (test_a_loosened_rule_breaks_the_bounds)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from latency_recording import compare_marks, read_recording, window_outcomes
from shipped_specs import shipped_specs

from runner.spec.document import load_spec
from runner.spec.fields import VerdictSpec

REPO = Path(__file__).resolve().parents[1]
CHECK_ONNX = REPO / "specs" / "check_onnx.yaml"
MARGIN = 1.1  # check_onnx's: at most 10% slower
FALSE_ALARMS = 0.05  # at most this share of unchanged windows flagged
AT_THE_MARGIN = 0.10  # at most this share of windows slower by the margin itself passed (each rule's nominal: 2.5%)


@pytest.fixture(scope="module")
def recording():
    return read_recording()


@pytest.fixture(scope="module")
def check_onnx():
    spec = load_spec(CHECK_ONNX).spec
    verdict = next(v for v in spec.verdicts if v.measurement == "latency")
    measurement = next(m for m in spec.measurements if m.name == "latency")
    return verdict, measurement


def _share(outcomes: list[str], *wanted: str) -> float:
    return sum(o in wanted for o in outcomes) / len(outcomes)


def test_the_recording_is_cut_as_check_onnx_measures(recording, check_onnx):
    _, measurement = check_onnx
    assert measurement.iterations // measurement.rounds == recording.calls
    assert recording.n_rounds // measurement.rounds >= 20


def test_an_unchanged_model_keeps_check_onnx_latency_verdict(recording, check_onnx):
    verdict, measurement = check_onnx
    outcomes = window_outcomes(recording, verdict, measurement.rounds)
    assert len(outcomes) >= 20
    assert _share(outcomes, "rejected", "inconclusive", "unavailable") <= FALSE_ALARMS, outcomes


def test_a_model_slower_by_the_margin_rarely_passes(recording, check_onnx):
    verdict, measurement = check_onnx
    outcomes = window_outcomes(recording, verdict, measurement.rounds, slowdown=MARGIN)
    assert _share(outcomes, "deployment-worthy") <= AT_THE_MARGIN, outcomes


def test_a_quarter_slower_is_caught(recording, check_onnx):
    verdict, measurement = check_onnx
    outcomes = window_outcomes(recording, verdict, measurement.rounds, slowdown=1.25)
    assert _share(outcomes, "rejected") >= 0.9, outcomes


def _shipped_latency_rules():
    """(spec, verdict with its latency interval rules alone, latency measurement) of every shipped spec."""
    from runner.kinds.shared.runtime_metrics import latency_interval_needs

    found = []
    for path, loaded in shipped_specs("[!_]*.yaml"):
        spec = loaded.spec
        by_name = {m.name: m for m in spec.measurements}
        for verdict in spec.verdicts:
            m = by_name[verdict.measurement]
            latency = m if m.kind == "latency" else by_name.get(getattr(m, "latency", None) or "")
            rules = {k: r for k, r in verdict.deployment_worthy_when.items() if latency_interval_needs(k)}
            if rules and latency is not None:
                found.append((path.stem, verdict.model_copy(update={"deployment_worthy_when": rules}), latency))
    return found


SHIPPED = _shipped_latency_rules()


def test_every_shipped_latency_rule_times_the_recordings_rounds(recording):
    """No shipped rule goes unmeasured: each latency measurement a rule judges times rounds of the
    recording's length, and enough of them for 20 windows."""
    for spec, verdict, latency in SHIPPED:
        assert latency.iterations // latency.rounds == recording.calls, (spec, verdict.name)
        assert recording.n_rounds // latency.rounds >= 20, (spec, verdict.name)


def _threshold(verdict) -> float:
    from runner.spec.fields import parse_rule

    thresholds = {parse_rule(rule)[1] for rule in verdict.deployment_worthy_when.values()}
    assert len(thresholds) == 1, verdict  # one margin a verdict, as every shipped one has
    return thresholds.pop()


@pytest.mark.parametrize("spec, verdict, latency", SHIPPED, ids=[f"{s}:{v.name}" for s, v, _ in SHIPPED])
def test_every_shipped_latency_rule_on_an_unchanged_model(recording, spec, verdict, latency):
    """A rule that asks for at most a slowdown (a threshold above 1) keeps the unchanged model; one
    that asks for a speed-up (1 or below) does not grant it to the unchanged model."""
    from runner.spec.fields import parse_rule

    outcomes = window_outcomes(recording, verdict, latency.rounds)
    assert len(outcomes) >= 20
    thresholds = [parse_rule(rule)[1] for rule in verdict.deployment_worthy_when.values()]
    if all(t > 1 for t in thresholds):
        assert _share(outcomes, "rejected", "inconclusive") <= FALSE_ALARMS, outcomes
    else:
        assert _share(outcomes, "deployment-worthy") <= FALSE_ALARMS, outcomes


@pytest.mark.parametrize("spec, verdict, latency", SHIPPED, ids=[f"{s}:{v.name}" for s, v, _ in SHIPPED])
def test_every_shipped_latency_rule_at_its_threshold(recording, spec, verdict, latency):
    """A candidate exactly at a rule's threshold (each call scaled by it: 0.6 times the baseline's
    for int8_cpu's `< 0.6`, 1.1 times for check_onnx's `<= 1.1`) is rarely passed."""
    outcomes = window_outcomes(recording, verdict, latency.rounds, slowdown=_threshold(verdict))
    assert len(outcomes) >= 20
    assert _share(outcomes, "deployment-worthy") <= AT_THE_MARGIN, outcomes


def test_a_runtimes_own_tail_cannot_gate(recording):
    """Why a rule on a runtime's own time is refused when the spec loads (runtime_metrics.OWN_TIME_REASON):
    the upper end of its P95's interval over 10 rounds, against a budget at which its P95 over the
    whole recording stands, passes far more than a rule at its margin may, and one at half the
    budget fails in most windows: the rounds of a run measure the load of its moment."""
    budget = 16.7
    verdict = VerdictSpec(name="frame", measurement="latency", candidate="b", baseline="a",
                          deployment_worthy_when={"latency_p95_ms_ci_high": f"< {budget}"})
    typical = float(np.exp(np.log(recording.rounds["b"][("wall", "p95")]).mean()))
    at_budget = window_outcomes(recording, verdict, 10, slowdown=budget / typical)
    assert _share(at_budget, "deployment-worthy") > 2 * AT_THE_MARGIN, at_budget
    within = window_outcomes(recording, verdict, 10, slowdown=budget / typical / 2)
    assert _share(within, "rejected", "inconclusive") > 0.5, within


def test_a_loosened_rule_breaks_the_bounds(recording, check_onnx):
    """The bounds above are ones a loosened rule fails: each interval replaced by its point
    estimate, and the former rule over 5 rounds."""
    verdict, measurement = check_onnx
    points = VerdictSpec(name="points", measurement="latency", candidate="candidate", baseline="baseline",
                         deployment_worthy_when={k.removesuffix("_ci_high"): r
                                                 for k, r in verdict.deployment_worthy_when.items()})
    at_margin = window_outcomes(recording, points, measurement.rounds, slowdown=MARGIN)
    assert _share(at_margin, "deployment-worthy") > AT_THE_MARGIN
    former = VerdictSpec(name="former", measurement="latency", candidate="candidate", baseline="baseline",
                         deployment_worthy_when={"latency_p50_ratio": "<= 1.1", "latency_p95_ratio": "<= 1.1"})
    unchanged = window_outcomes(recording, former, 5)
    assert _share(unchanged, "rejected", "inconclusive") > FALSE_ALARMS


def test_compare_of_two_unchanged_runs_flags_none_beyond_the_factor(recording, check_onnx):
    """`runner compare --fail-on-regression 1.1` of consecutive windows: no row worse or better
    beyond the factor in more than 5% of the pairs. (Its 95% intervals leave out 1 more often than
    5%, 0-15% of pairs per row here: two loads of one file differ by a few percent, which the
    rounds of one run cannot show; docs/statistics.md.)"""
    _, measurement = check_onnx
    pairs = compare_marks(recording, measurement.rounds, MARGIN)
    assert len(pairs) >= 20
    for metric in ("p50_ratio", "p95_ratio", "cpu_p50_ratio", "cpu_p95_ratio"):
        marks = [pair[metric] for pair in pairs]
        assert sum(mark != "" for _, mark in marks) / len(marks) <= FALSE_ALARMS, (metric, marks)
        assert all(significant is not None for significant, _ in marks)


def test_compare_catches_a_quarter_slower_run(recording, check_onnx):
    _, measurement = check_onnx
    pairs = compare_marks(recording, measurement.rounds, MARGIN, slowdown=1.25)
    for metric in ("p50_ratio", "cpu_p95_ratio"):
        assert sum(pair[metric][1] == "worse" for pair in pairs) / len(pairs) >= 0.9, metric
