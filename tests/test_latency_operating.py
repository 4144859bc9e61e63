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

import pytest
from latency_recording import compare_marks, read_recording, window_outcomes

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
    """(spec, verdict with its latency interval rules alone, rounds) of every shipped spec whose
    latency measurement times rounds of the recording's length."""
    from runner.kinds.shared.runtime_metrics import latency_interval_needs

    found = []
    for path in sorted((REPO / "specs").glob("[!_]*.yaml")):
        spec = load_spec(path).spec
        by_name = {m.name: m for m in spec.measurements}
        for verdict in spec.verdicts:
            m = by_name[verdict.measurement]
            latency = m if m.kind == "latency" else by_name.get(getattr(m, "latency", None) or "")
            rules = {k: r for k, r in verdict.deployment_worthy_when.items() if latency_interval_needs(k)}
            if rules and latency is not None:
                found.append((path.stem, verdict.model_copy(update={"deployment_worthy_when": rules}), latency))
    return found


SHIPPED = _shipped_latency_rules()


@pytest.mark.parametrize("spec, verdict, latency", SHIPPED, ids=[f"{s}:{v.name}" for s, v, _ in SHIPPED])
def test_every_shipped_latency_rule_on_an_unchanged_model(recording, spec, verdict, latency):
    """A rule that asks for at most a slowdown (a threshold above 1) keeps the unchanged model; one
    that asks for a speed-up (1 or below) does not grant it to the unchanged model."""
    from runner.spec.fields import parse_rule

    if latency.iterations // latency.rounds != recording.calls:
        pytest.skip(f"{spec} times rounds of {latency.iterations // latency.rounds} calls, "
                    f"the recording {recording.calls}")
    outcomes = window_outcomes(recording, verdict, latency.rounds)
    assert len(outcomes) >= 20
    thresholds = [parse_rule(rule)[1] for rule in verdict.deployment_worthy_when.values()]
    if all(t > 1 for t in thresholds):
        assert _share(outcomes, "rejected", "inconclusive") <= FALSE_ALARMS, outcomes
    else:
        assert _share(outcomes, "deployment-worthy") <= FALSE_ALARMS, outcomes


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
