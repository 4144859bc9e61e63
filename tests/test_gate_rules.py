"""What the shipped deployment specs' verdicts may judge: a figure that swings with the machine's
load or ignores the staged games' looks is refused when the spec loads, in one line naming the
spec, the `--set` that made the rule and what to judge instead, exit 2, nothing run. Each case
puts a former or tempting rule back into a shipped spec through `runner validate --set`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from runner.cli.commands import main

REPO = Path(__file__).resolve().parents[1]
SPECS = REPO / "specs"

REFUSED = [
    # the repair search's own latency ratio: one series of calls a step, no rounds
    ("convert_int8", "verdicts.int8_same_decisions_on_the_fixed_states.deployment_worthy_when="
     "{agreement: '>= 1.0', latency_p50_ratio: '< 1.0'}", "latency_p50_ratio_ci_high, its interval over rounds"),
    ("int8_repair", "verdicts.repaired_int8_same_decisions_on_the_fixed_states.deployment_worthy_when="
     "{latency_p50_ratio: '<= 0.6'}", "repair search's point estimate"),
    # in-game calls: the runtimes played one after the other, and a runtime's own time is its moment's load
    ("day28_webgpu_vs_wasm", "verdicts.page_should_use_webgpu.deployment_worthy_when={game_call_p95_ratio: '< 1.0'}",
     "judge latency_p95_ratio_ci_high"),
    ("day28_webgpu_vs_wasm", "verdicts.browser_wasm_plays_in_the_page.deployment_worthy_when="
     "{candidate_game_call_p95_ms: '< 16.7'}", "candidate_game_call_p95_ms is shown, never a rule"),
    ("day28_wasm_games", "verdicts.browser_wasm_plays_in_the_page.deployment_worthy_when="
     "{candidate_game_call_p95_ms_ci_high: '< 16.7'}", "a runtime's own time carries the machine's load"),
    # a latency measurement's own milliseconds, interval or not
    ("check_onnx", "verdicts.not_slower_at_batch_1.deployment_worthy_when={latency_p95_ms: '< 16.7'}",
     "latency_p95_ms is shown, never a rule"),
    ("check_onnx", "verdicts.not_slower_at_batch_1.deployment_worthy_when={latency_p95_ms_ci_high: '< 16.7'}",
     "judge a ratio to a runtime timed in the same rounds"),
    # a 30-game bootstrap interval beside games in stages
    ("day26_tensorrt", "verdicts.trt_fp32_deployment.deployment_worthy_when={paired_score_diff_ci_low: '>= -1.0'}",
     "knows nothing of the looks"),
    ("day27_browser_wasm", "verdicts.browser_wasm_keeps_the_scores.deployment_worthy_when="
     "{paired_score_diff_ci_low: '>= -1.0'}", "knows nothing of the looks"),
]


@pytest.mark.parametrize("spec, setting, message", REFUSED, ids=[f"{s}:{m[:30]}" for s, _, m in REFUSED])
def test_a_rule_a_gate_cannot_trust_is_refused_when_the_spec_loads(spec, setting, message):
    result = CliRunner().invoke(main, ["validate", str(SPECS / f"{spec}.yaml"), "--set", setting])
    lines = result.stderr.splitlines()
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"error: {SPECS / spec}.yaml: --set ") and message in lines[0], lines[0]


@pytest.mark.parametrize("spec", ["day26_tensorrt", "day27_browser_wasm", "day28_webgpu_vs_wasm", "day28_wasm_games",
                                  "check_onnx", "int8_cpu"])
def test_every_deployment_spec_judges_its_games_in_stages_with_drawn_seeds_and_stalls(spec):
    """Each games measurement a deployment verdict reads plays drawn seeds in stages of 50 at a
    margin of 10% of the baseline's mean, and each candidate judged on its scores is judged on
    its stalls too, against the same baseline, by the one rule at the tolerance."""
    from runner.spec.document import load_spec

    loaded = load_spec(SPECS / f"{spec}.yaml").spec
    games = {m.name: m for m in loaded.measurements if m.kind == "episodes"}
    scored, stalled = set(), set()
    for verdict in loaded.verdicts:
        if verdict.measurement not in games:
            continue
        rules = verdict.deployment_worthy_when
        assert not any(k.startswith("paired_score_diff") for k in rules), verdict.name
        if "diff_plus_margin_ci_low" in rules:
            scored.add((verdict.measurement, verdict.candidate, verdict.baseline))
        if "stall_excess_ci_high" in rules:
            stalled.add((verdict.measurement, verdict.candidate, verdict.baseline))
        assert "stall_excess_ci_low" not in rules, f"{verdict.name}: stalls are one hypothesis, at the tolerance"
    assert scored and scored <= stalled, scored - stalled
    for name, _, baseline in scored:
        m = games[name]
        assert m.baseline_runtime == baseline and m.seeds.drawn == 400, name
        assert (m.stages.games, m.stages.fraction) == (50, 0.1), name


def test_a_set_that_changes_the_gates_rules_or_evidence_is_named_as_a_modified_gate():
    """`runner check` says "modified gate" for each --set but those naming the files, their
    runtimes and the game (its line, its last line and --json's `modified_gate`)."""
    from small_check import SMALL_CHECK

    from runner.spec.overrides import gate_changes

    neutral = ('artifacts.candidate={"path": "mine.onnx", "precision": "fp32"}', "contract.name=breakout-v2",
               "contract.full_action_space=true", "runtimes.candidate.runtime=openvino")
    changing = (*SMALL_CHECK, "measurements.games.stages.margin_fraction=0.5",
                'verdicts.keeps_the_score.deployment_worthy_when={diff_plus_margin_ci_low: "> -100"}')
    assert gate_changes(neutral) == []
    assert gate_changes((*neutral, *changing)) == list(changing)


def test_the_question_follows_the_file():
    """A file in its baseline's precision on its runtime is asked whether it is identical (every
    verdict gates); a converted file, or another runtime, whether it is as good (the decisions and
    the 256 steps are shown, not gating); --question overrides and says what the files would ask."""
    from runner.spec.document import load_spec
    from runner.spec.questions import question_for

    fp32 = json.dumps({"path": str(REPO / "models" / "reference" / "dqn_breakout.onnx"), "precision": "fp32"})
    shipped = load_spec(SPECS / "check_onnx.yaml", check_files=False).spec  # its own candidate: the FP16 file
    re_export = load_spec(SPECS / "check_onnx.yaml", overrides=(f"artifacts.candidate={fp32}",),
                          check_files=False).spec
    threads = load_spec(SPECS / "check_onnx.yaml", overrides=(f"artifacts.candidate={fp32}",
                                                              "runtimes.candidate.intra_op_threads=2"),
                        check_files=False).spec
    fp16 = question_for(shipped)
    assert (fp16.question, fp16.why) == ("as-good", "the file computes in fp16, its baseline in fp32")
    assert question_for(re_export).question == "identical"
    assert question_for(threads).question == "as-good" and "intra_op_threads" in question_for(threads).why
    forced = question_for(shipped, asked="identical")
    assert forced.question == "identical" and forced.why.startswith("--question identical (the files alone would "
                                                                     "ask as-good")
    assert fp16.gating(shipped) == ["not_slower_at_batch_1", "keeps_the_score", "no_more_stalls"]
    assert forced.gating(shipped) == [v.name for v in shipped.verdicts]
