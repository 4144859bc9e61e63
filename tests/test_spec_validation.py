"""Spec validation: every malformed spec fails before anything runs, with file, line and field."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner
from shipped_specs import but_bf16_refused_here

from breakout_core.game.contract import CONTRACTS
from runner.cli.commands import main
from runner.kinds.shared.training_settings import SWEEPABLE
from runner.spec.document import SpecError, load_spec
from runner.spec.extends import is_base_only
from runner.spec.yaml_source import MAX_ALIASES, SpecSourceError, load_yaml

REPO = Path(__file__).parents[1]

# A valid spec; the malformed ones below are edits of it, so their line numbers refer to
# these lines (a case that inserts lines shifts the ones after it).
GOOD = """\
name: quick
description: a good spec
policies:
  random:
    type: random
  agent:
    type: checkpoint
    path: model.pt
measurements:
  - kind: evaluate
    name: scores
    policies: [random, agent]
    seeds: {start: 0, count: 4}
    batch_size: 4
verdicts:
  - name: better
    measurement: scores
    candidate: agent
    baseline: random
    deployment_worthy_when:
      paired_score_diff_ci_low: ">= 0"
"""
#  1 name            8 path              15 verdicts
#  2 description     9 measurements      16 - name
#  3 policies       10 - kind            17 measurement
#  4 random         11 name              18 candidate
#  5 type           12 policies          19 baseline
#  6 agent          13 seeds             20 deployment_worthy_when
#  7 type           14 batch_size        21 paired_score_diff_ci_low


def edit(old: str, new: str) -> str:
    assert GOOD.count(old) == 1, f"{old!r} must occur exactly once in GOOD"
    return GOOD.replace(old, new)


def bomb(levels: int, fan_out: int) -> str:
    """A 'billion laughs' document: each level aliases the previous one fan_out times."""
    lines = ["name: bomb", "l0: &l0 [" + ", ".join(['"lol"'] * fan_out) + "]"]
    for i in range(1, levels + 1):
        lines.append(f"l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * fan_out) + "]")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Case:
    id: str
    text: str
    message: str  # substring the problem must contain
    line: int  # line the problem must report
    field: str | None  # field path; None for a file-level (YAML) problem


CASES = [
    Case("unknown-top-level-key", GOOD + "extra_key: 1\n", "unknown key", 22, "extra_key"),
    Case("unknown-measurement-key", edit("    batch_size: 4\n", "    batch_size: 4\n    batchsize: 8\n"),
         "unknown key", 15, "measurements[0].batchsize"),
    Case("batch-size-string", edit("batch_size: 4", "batch_size: four"),
         "Input should be a valid integer", 14, "measurements[0].batch_size"),
    Case("batch-size-negative", edit("batch_size: 4", "batch_size: -1"),
         "greater than or equal to 1", 14, "measurements[0].batch_size"),
    Case("seed-negative", edit("seeds: {start: 0, count: 4}", "seeds: [0, -3, 2]"),
         "seeds must be from 0 to", 13, "measurements[0].seeds"),
    Case("seed-list-empty", edit("seeds: {start: 0, count: 4}", "seeds: []"),
         "the seed list is empty", 13, "measurements[0].seeds"),
    Case("seeds-duplicated", edit("seeds: {start: 0, count: 4}", "seeds: [1, 2, 2]"),
         "seeds must be distinct", 13, "measurements[0].seeds"),
    Case("seed-range-count-0",
         edit("    seeds: {start: 0, count: 4}\n", "    seeds:\n      start: 0\n      count: 0\n"),
         "greater than 0", 15, "measurements[0].seeds.count"),
    Case("model-file-missing", edit("path: model.pt", "path: missing.pt"),
         "model file not found", 8, "policies.agent.path"),
    Case("runtime-unknown", edit("    path: model.pt\n", "    path: model.pt\n    runtime: tensorrt\n"),
         "Input should be 'torch'", 9, "policies.agent.runtime"),
    Case("measurement-kind-unknown", edit("kind: evaluate", "kind: evaluat"),
         "'evaluat' found using 'kind' does not match any of the expected tags", 10, "measurements[0]"),
    Case("policy-type-unknown", edit("type: random", "type: greedy"),
         "'greedy' found using 'type' does not match any of the expected tags", 4, "policies.random"),
    Case("measurement-names-undefined-policy", edit("policies: [random, agent]", "policies: [random, agnt]"),
         "unknown policy 'agnt'; defined: agent, random", 12, "measurements[0].policies[1]"),
    Case("verdict-unknown-measurement", edit("measurement: scores", "measurement: score"),
         "unknown measurement 'score'", 17, "verdicts[0].measurement"),
    Case("verdict-unknown-metric", edit("paired_score_diff_ci_low:", "accuracy:"),
         "unknown metric for kind evaluate; known: candidate_mean_score", 21,
         "verdicts[0].deployment_worthy_when.accuracy"),
    Case("verdict-rule-is-code", edit('">= 0"', '"import os"'),
         "rule 'import os' is not '<op> <number>'", 21, "verdicts[0].deployment_worthy_when.paired_score_diff_ci_low"),
    Case("candidate-equals-baseline", edit("baseline: random", "baseline: agent"),
         "candidate and baseline must differ", 16, "verdicts[0]"),
    Case("epsilon-above-1", edit("    path: model.pt\n", "    path: model.pt\n    epsilon: 1.5\n"),
         "less than or equal to 1", 9, "policies.agent.epsilon"),
    Case("contract-unknown",
         edit("description: a good spec\n", "description: a good spec\ncontract:\n  name: pong-v1\n"),
         "unknown contract 'pong-v1'; known: ale-breakout-v5, breakout-v2", 4, "contract.name"),
    Case("sticky-above-the-clearable", edit("description: a good spec\n",
                                            "description: a good spec\ncontract:\n  repeat_action_probability: 0.6\n"),
         "less than or equal to 0.5", 4, "contract.repeat_action_probability"),
    Case("yaml-python-tag",
         edit("description: a good spec", 'description: !!python/object/apply:os.system ["echo hi"]'),
         "YAML tag 'tag:yaml.org,2002:python/object/apply:os.system' is not allowed", 2, None),
    Case("yaml-custom-tag", edit("description: a good spec", "description: !foo bar"),
         "YAML tag '!foo' is not allowed in a spec", 2, "description"),
    # 10 aliases per level: aliases 51-60 are on line 8 (level 6).
    Case("yaml-alias-bomb", bomb(levels=9, fan_out=10), f"more than {MAX_ALIASES} YAML aliases", 8, None),
    Case("yaml-syntax-error", edit("batch_size: 4", "batch_size: 4: 5"),
         "invalid YAML: mapping values are not allowed here", 14, None),
    Case("empty-file", "", "the file is empty", 1, None),
    Case("comments-only", "# nothing here yet\n", "the file is empty", 1, None),
    Case("top-level-list", "- name: quick\n- name: other\n", "a spec is a mapping of keys", 1, None),
    Case("measurements-missing", "name: nothing\n", "required key is missing", 1, "measurements"),
    Case("measurement-seeds-missing", edit("    seeds: {start: 0, count: 4}\n", ""),
         "required key is missing", 10, "measurements[0].seeds"),
    Case("duplicate-key", edit("    batch_size: 4\n", "    batch_size: 4\n    batch_size: 5\n"),
         "key 'batch_size' appears twice in one mapping", 15, "measurements[0].batch_size"),
    Case("document-marker-only", "---\n", "the file is empty", 1, None),
    Case("measurement-kind-missing", edit("  - kind: evaluate\n    name: scores\n", "  - name: scores\n"),
         "required key 'kind' is missing", 10, "measurements[0]"),
    Case("rule-beyond-a-float", edit('">= 0"', '"> 1e400"'), "1e400 is beyond what a float holds", 21,
         "verdicts[0].deployment_worthy_when.paired_score_diff_ci_low"),
]


def _params(location: bool):
    params = []
    for case in CASES:
        params.append(pytest.param(case, id=case.id))
    return params


def _problems(path: Path) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    problems = info.value.problems
    assert problems, "a SpecError must list at least one problem"
    assert str(info.value) == "\n".join(problems)
    return problems


def _fields(path: Path) -> list[str]:
    """The field each problem of the spec at `path` names, in the order they are reported."""
    return [p.split(": ", 2)[1] for p in _problems(path)]


def test_the_table_is_big_enough():
    assert len(CASES) >= 18
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", _params(location=False))
def test_malformed_spec_message(case: Case, checkpoint, write_spec):
    path = write_spec(case.text)
    problems = _problems(path)
    # Every problem is one line '<file>:<line>: ...' (a field path follows for schema problems).
    for problem in problems:
        assert "\n" not in problem
        assert re.match(rf"^{re.escape(str(path))}:\d+: \S.*$", problem), problem
        assert "Traceback" not in problem
    assert any(case.message in p for p in problems), problems


@pytest.mark.parametrize("case", _params(location=True))
def test_malformed_spec_location(case: Case, checkpoint, write_spec):
    path = write_spec(case.text)
    matching = [p for p in _problems(path) if case.message in p]
    assert matching
    prefix = f"{path}:{case.line}: " + (f"{case.field}: " if case.field else "")
    assert any(p.startswith(prefix) for p in matching), (prefix, matching)


def test_every_problem_is_reported_at_once(checkpoint, write_spec):
    path = write_spec(edit("batch_size: 4", "batch_size: -1")
                      .replace("path: model.pt", "path: model.pt\n    epsilon: 2"))
    problems = _problems(path)  # the epsilon line moves batch_size down to line 15
    assert any(p.startswith(f"{path}:15: measurements[0].batch_size: ") for p in problems), problems
    assert any(p.startswith(f"{path}:9: policies.agent.epsilon: ") for p in problems), problems


def test_seed_range_error_has_no_noise_from_the_other_union_branch(checkpoint, write_spec):
    path = write_spec(edit("seeds: {start: 0, count: 4}", "seeds: {start: 0, count: 0}"))
    problems = _problems(path)
    assert problems == [f"{path}:13: measurements[0].seeds.count: Input should be greater than 0"]


def test_python_tag_is_never_executed(tmp_path, checkpoint, write_spec):
    marker = tmp_path / "pwned"
    path = write_spec(edit("description: a good spec",
                           f'description: !!python/object/apply:os.system ["touch {marker}"]'))
    problems = _problems(path)
    assert problems[0].startswith(f"{path}:2: ")
    assert not marker.exists()


def test_alias_chain_under_the_limit_does_not_expand(write_spec):
    # 12 levels of 2 aliases = 24 aliases, within the limit (MAX_ALIASES): the loader reads it, and
    # walks each aliased node once; the document has 14 mappings/sequences.
    path = write_spec(bomb(levels=12, fan_out=2))
    source = load_yaml(path)
    assert len(source.lines) < 200  # one entry per node written in the file, not per expanded path


def test_alias_chain_under_the_limit_is_still_refused_as_a_spec(write_spec):
    path = write_spec(bomb(levels=12, fan_out=2))
    problems = _problems(path)
    assert any(": l1: unknown key" in p for p in problems), problems


def test_good_spec_validates(checkpoint, write_spec):

    loaded = load_spec(write_spec(GOOD))
    spec = loaded.spec
    assert spec.name == "quick"
    assert spec.contract.build().hash == CONTRACTS["breakout-v3"].hash  # the default contract
    assert spec.policies["agent"].path == str(checkpoint)  # resolved relative to the spec file
    assert spec.measurements[0].seeds.values() == [0, 1, 2, 3]
    assert spec.verdicts[0].deployment_worthy_when == {"paired_score_diff_ci_low": ">= 0"}
    assert loaded.text == GOOD and len(loaded.hash) == 16


def test_contract_override_changes_the_hash_and_refuses_a_checkpoint_of_another(checkpoint, write_spec):
    text = edit("description: a good spec\n", "description: a good spec\ncontract:\n  max_episode_frames: 1000\n")
    path = write_spec(text)
    with pytest.raises(SpecError) as refused:
        load_spec(path)
    assert refused.value.problems == [
        f"{path}:10: policies.agent.path: {checkpoint} was made under contract breakout-v3 "
        f"({CONTRACTS['breakout-v3'].hash}), "
        f"this spec plays breakout-v3 ({CONTRACTS['breakout-v3'].replace(max_episode_frames=1000).hash}); "
        "set contract.other_contracts: deliberate if that is the question"]
    deliberate = write_spec(text.replace("  max_episode_frames: 1000\n",
                                         "  max_episode_frames: 1000\n  other_contracts: deliberate\n"))
    contract = load_spec(deliberate).spec.contract.build()
    assert contract.max_episode_frames == 1000
    assert contract.hash != CONTRACTS["breakout-v3"].hash  # other_contracts is not part of the game


def _shipped(name: str) -> str:
    """A shipped spec's resolved text (its extends merged in), its model paths made absolute."""
    return load_spec(REPO / "specs" / f"{name}.yaml").text.replace("../models/", f"{REPO}/models/")


def test_onnx_files_of_another_contract_are_refused_too(write_spec):
    """An ONNX file records the contract its weights were trained under: a spec that plays
    one under another contract says so, as for a checkpoint."""
    day24 = _shipped("day24_ort_latency")
    assert load_spec(write_spec(day24)).spec.contract.name == "breakout-v3"  # the shipped files' own contract
    under_v2 = write_spec(day24.replace("contract: {name: breakout-v3}", "contract: {name: breakout-v2}"))
    with pytest.raises(SpecError) as refused:
        load_spec(under_v2)
    v3 = CONTRACTS["breakout-v3"].hash
    fields = [p.split(": ", 2)[1] for p in refused.value.problems]
    # the fixed states too, as a contract's own states (refused even where a mismatch is deliberate)
    assert fields == ["artifacts.checkpoint.path", "artifacts.onnx_fp32.path", "artifacts.fixed_states.path"]
    assert f"dqn_breakout.onnx was made under contract {v3}, this spec plays breakout-v2" in refused.value.problems[1]


def test_a_checkpoint_without_its_contract_hash_is_one_line(tmp_path, write_spec):
    import torch

    payload = torch.load(REPO / "models" / "reference" / "dqn_breakout.pt", weights_only=True)
    del payload["contract_hash"]
    torch.save(payload, tmp_path / "nohash.pt")
    path = write_spec(edit("description: a good spec\n", "description: a good spec\n").replace("model.pt", "nohash.pt"))
    with pytest.raises(SpecError) as refused:
        load_spec(path)
    assert any("nohash.pt: a checkpoint without its contract hash" in p for p in refused.value.problems)


def test_fixed_states_of_another_contract_are_refused_even_when_deliberate(write_spec):
    """States are the game itself: a spec reads only states captured under its own contract."""
    day23 = _shipped("day23_ort_parity")
    assert load_spec(write_spec(day23)).spec.contract.name == "breakout-v3"
    v2 = write_spec(day23.replace("name: breakout-v3", "name: breakout-v2"))
    with pytest.raises(SpecError) as refused:
        load_spec(v2)
    assert [p for p in refused.value.problems if "fixed_states_60.npz was made under contract" in p
            and "re-capture them under this contract (`runner run` spec day22_export)" in p]


def test_cli_validate_bad_spec(checkpoint, write_spec):
    bad = write_spec(edit("batch_size: 4", "batch_size: -1"), name="bad.yaml")
    result = CliRunner().invoke(main, ["validate", str(bad)])
    assert result.exit_code == 2
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert lines and all(line.startswith("error: ") for line in lines), lines
    assert f"error: {bad}:14: measurements[0].batch_size: Input should be greater than or equal to 1" in lines


def test_cli_validate_good_and_bad_together(checkpoint, write_spec):
    good = write_spec(GOOD, name="good.yaml")
    bad = write_spec("", name="empty.yaml")
    result = CliRunner().invoke(main, ["validate", str(good), str(bad)])
    assert result.exit_code == 2
    assert f"ok: {good}" in result.stdout
    assert result.stderr.splitlines() == [f"error: {bad}:1: the file is empty"]


def test_cli_validate_missing_file(tmp_path):
    result = CliRunner().invoke(main, ["validate", str(tmp_path / "nope.yaml")])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert result.stderr.startswith("error: ") and "no such file" in result.stderr


def test_cli_validate_good_spec(checkpoint, write_spec):
    good = write_spec(GOOD)
    result = CliRunner().invoke(main, ["validate", str(good)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"ok: {good}"
    assert result.stderr == ""


def test_cli_schema():
    result = CliRunner().invoke(main, ["schema"])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.stdout)
    assert "measurements" in schema["properties"]
    assert "measurements" in schema["else"]["required"] and schema["properties"]["extends"]["type"] == "string"


def _repository_outputs(specs: list[Path]) -> dict[str, str]:
    """{resolved path: spec name} of every file a spec in specs/ writes (made_by: itself)."""
    from runner.spec.extends import resolve_extends

    produced = {}
    for path in specs:
        data = resolve_extends(load_yaml(path)).data
        for artifact in (data.get("artifacts") or {}).values():
            if artifact.get("made_by") == data["name"]:
                produced[str((path.parent / artifact["path"]).resolve())] = data["name"]
    return produced


WAITING = re.compile(r".*: file not found: (?P<path>.+); it is made by spec '(?P<maker>\w+)' \((?P<producer>.+)\): "
                     r"run `runner run (?P=producer)` first")


def test_repository_specs_validate():
    """Every spec in specs/ validates. On a fresh checkout a spec may read a file that another
    spec in specs/ writes and has not written yet: that is reported, naming the spec to run
    first. And on a CPU that would emulate bf16, the bf16 study is refused as such."""
    specs = [path for path in sorted((REPO / "specs").glob("*.yaml")) if not is_base_only(path)]
    if not specs:
        pytest.skip("no specs/*.yaml in the repository yet")
    produced = _repository_outputs(specs)
    problems = []
    for path in specs:
        try:
            load_spec(path)
        except SpecError as exc:
            problems += exc.problems
    waiting = [(line, WAITING.fullmatch(line)) for line in but_bf16_refused_here(problems)]
    assert [line for line, found in waiting if not found] == []
    for line, found in waiting:
        assert produced.get(str(Path(found["path"]).resolve())) == found["maker"], line
        assert Path(found["producer"]).resolve() == REPO / "specs" / f"{found['maker']}.yaml", line


def test_a_file_another_spec_makes_says_run_it_first(write_spec, tmp_path):
    """The one problem a fresh checkout may show, in the words test_repository_specs_validate reads."""
    write_spec("name: maker\n", name="maker.yaml")
    consumer = write_spec(f"""\
name: consumer
contract: {{name: breakout-v3, other_contracts: deliberate}}
artifacts:
  onnx: {{path: out/model.onnx, made_by: maker}}
  states: {{path: {REPO / "models" / "reference" / "fixed_states_60.npz"}}}
  fp32: {{path: {REPO / "models" / "reference" / "dqn_breakout.onnx"}}}
runtimes:
  ort: {{runtime: onnxruntime, intra_op_threads: 1, artifact: onnx}}
  ort_fp32: {{runtime: onnxruntime, intra_op_threads: 1, artifact: fp32}}
measurements:
  - {{kind: parity, name: p, fixed_states: states, runtimes: [ort_fp32, ort]}}
""", name="consumer.yaml")
    result = CliRunner().invoke(main, ["validate", str(consumer)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    (line,) = lines
    found = WAITING.fullmatch(line)
    assert found and found["maker"] == "maker" and Path(found["producer"]) == tmp_path / "maker.yaml", line
    assert line.startswith(f"error: {consumer}:4: artifacts.onnx.path: ")


TRAIN_SWEEP = """\
name: two_rates
measurements:
  - kind: train
    name: lr
    total_transitions: 1000
    sweep: {learning_rate: [0.0001, 0.0002]}
verdicts:
  - name: faster
    measurement: lr
    candidate: learning_rate=0.0002
    deployment_worthy_when:
      transitions_per_s_speedup_ci_low: ">= 1.2"
"""


def test_a_comparison_metric_needs_a_baseline(write_spec):
    """A train or export verdict may judge one participant alone (a health check, a file's own
    check), but not with a metric that compares it with another: that verdict could only ever
    read unavailable."""
    path = write_spec(TRAIN_SWEEP)
    assert _problems(path) == [f"{path}:12: verdicts[0].deployment_worthy_when.transitions_per_s_speedup_ci_low: "
                               "transitions_per_s_speedup_ci_low compares the candidate with a baseline; this verdict "
                               "names none"]
    fixed = write_spec(TRAIN_SWEEP.replace("    deployment_worthy_when:", "    baseline: learning_rate=0.0001\n"
                                                                        "    deployment_worthy_when:"))
    assert load_spec(fixed).spec.verdicts[0].baseline == "learning_rate=0.0001"
    export = _shipped("day22_export")
    no_baseline = write_spec(export.replace("  baseline: onnx_fp32\n", ""))
    line = next(n for n, text in enumerate(no_baseline.read_text().splitlines(), 1) if "size_ratio" in text)
    assert [p for p in _problems(no_baseline) if "size_ratio" in p] == [
        f"{no_baseline}:{line}: verdicts[1].deployment_worthy_when.size_ratio: "
        "size_ratio compares the candidate with a baseline; this verdict names none"]


THROUGHPUT_BOUND = """\
name: bound
measurements:
  - kind: throughput
    name: tp
    total_transitions: 2000
    modes: [full]
    repeats: 3
verdicts:
  - name: near_bound
    measurement: tp
    candidate: base
    deployment_worthy_when:
      full_over_learner_bound_ci_low: ">= 0.9"
"""


def test_a_throughput_verdict_names_what_it_needs(write_spec):
    """A ratio to the learner bound needs the learner timed beside the full loop; a speed-up
    needs a baseline point. Both are refused before anything runs."""
    path = write_spec(THROUGHPUT_BOUND)
    assert _problems(path) == [f"{path}:13: verdicts[0].deployment_worthy_when.full_over_learner_bound_ci_low: "
                               "full_over_learner_bound_ci_low needs mode learner in this measurement's modes"]
    assert load_spec(write_spec(THROUGHPUT_BOUND.replace("[full]", "[full, learner]"))).spec.verdicts
    speedup = write_spec(THROUGHPUT_BOUND.replace("[full]", "[full, learner]").replace(
        "full_over_learner_bound_ci_low", "full_speedup_ci_low"))
    assert _problems(speedup) == [f"{speedup}:13: verdicts[0].deployment_worthy_when.full_speedup_ci_low: "
                                  "full_speedup_ci_low compares the candidate with a baseline; this verdict names none"]


def test_a_training_starting_from_a_checkpoint_of_another_contract_is_refused(checkpoint, write_spec):
    """`start_from` is a file the spec reads: checked like a checkpoint policy, by type and contract."""
    path = write_spec(TRAIN_SWEEP.replace("    total_transitions: 1000\n", "    total_transitions: 1000\n"
                                          f"    start_from: {checkpoint}\n"
                                          ).replace("name: two_rates\n",
                                                    "name: two_rates\ncontract: {name: breakout-v2}\n"))
    assert [p for p in _problems(path) if "start_from" in p] == [
        f"{path}:7: measurements[0].start_from: {checkpoint} was made under contract breakout-v3 "
        f"({CONTRACTS['breakout-v3'].hash}), this spec plays breakout-v2 ({CONTRACTS['breakout-v2'].hash}); "
        "set contract.other_contracts: deliberate if that is the question"]
    missing = write_spec(TRAIN_SWEEP.replace("    total_transitions: 1000\n",
                                             "    total_transitions: 1000\n    start_from: nowhere.pt\n"))
    assert any("start_from: no checkpoint file" in p and "nowhere.pt" in p for p in _problems(missing))


PROCESS_WIDE = """\
name: malloc
measurements:
  - kind: throughput
    name: tp
    total_transitions: 2000
    modes: [learner]
  - kind: train
    name: tr
    total_transitions: 1000
    keep_freed_memory: false
"""


def test_a_process_wide_setting_takes_one_value_per_run(write_spec):
    """keep_freed_memory lasts for the process once a training applies it, and a run is one
    process: a spec that would train with both values is refused before anything runs, where
    it would otherwise fail between two trainings."""
    one_value = "the setting lasts for the whole process once a training applies it, so a run takes one value"
    mixed = write_spec(PROCESS_WIDE)
    assert _problems(mixed) == [f"{mixed}:10: measurements[1].keep_freed_memory: keep_freed_memory is false here but "
                                f"true in measurement 'tp': {one_value}: run one spec per value and compare the runs"]
    for name, sweep in (("tp", "[true, false]"), ("tr", "[false, true]")):
        swept = write_spec(PROCESS_WIDE.replace("    keep_freed_memory: false\n", "").replace(
            f"    name: {name}\n", f"    name: {name}\n    sweep: {{keep_freed_memory: {sweep}}}\n"))
        assert [p for p in _problems(swept) if f"sweep 'keep_freed_memory': {one_value}" in p], name
    agreeing = PROCESS_WIDE.replace("    modes: [learner]\n", "    modes: [learner]\n    keep_freed_memory: false\n")
    assert load_spec(write_spec(agreeing)).spec.measurements[0].keep_freed_memory is False


AGREEING = PROCESS_WIDE.replace("    keep_freed_memory: false\n", "")  # a throughput (line 3) and a train (line 7)


def test_a_bad_value_in_a_sweep_names_its_field_and_value(write_spec):
    """A swept value is checked as its trial's setting; the error says which field and value,
    or which trial where the trial's settings disagree with each other."""
    base = AGREEING
    cases = {  # the sweep is on line 5, in the throughput measurement
        "    sweep: {channels_last: [true, maybe]}\n": "measurements[0].sweep.channels_last[1]: sweep 'channels_last' "
                                                        "value \"maybe\": Input should be a valid boolean",
        "    sweep: {batch_size: [32, -1]}\n": "measurements[0].sweep.batch_size[1]: sweep 'batch_size' value -1: "
                                              "Input should be greater than or equal to 1",
        "    sweep: {total_transitions: [2000, 500]}\n": "measurements[0].sweep.total_transitions[1]: "
                                                         "warmup_transitions 1000 must be below total_transitions 500 "
                                                         "(sweep 'total_transitions' value 500)",
        "    sweep: {epsilon_start: [null]}\n": "measurements[0].sweep.epsilon_start[0]: sweep 'epsilon_start' "
                                                "value null: Input should be a valid number",
        "    sweep: {learning_rate: [0.0001, 1.0e-4]}\n": "measurements[0].sweep.learning_rate[1]: sweep "
                                                          "'learning_rate' lists 0.0001 more than once: each value "
                                                          "is one trial",
        "    sweep: {gamma: [0.9999991, 0.9999992]}\n": "measurements[0].sweep.gamma[1]: sweep 'gamma' values "
                                                        "0.9999991 and 0.9999992 share one trial name, "
                                                        "gamma=0.999999 (a float is named to 6 significant digits): "
                                                        "each value is one trial",
    }
    for sweep, message in cases.items():
        path = write_spec(base.replace("    name: tp\n", "    name: tp\n" + sweep))
        assert _problems(path) == [f"{path}:5: {message}"], sweep
    # one value per line: the error names the value's own line
    listed = write_spec(base.replace("    name: tp\n", "    name: tp\n    sweep:\n      batch_size:\n"
                                                          "        - 32\n        - -1\n"))
    assert _problems(listed) == [f"{listed}:8: measurements[0].sweep.batch_size[1]: sweep 'batch_size' value -1: "
                                 "Input should be greater than or equal to 1"]
    crossing = write_spec(base.replace("    name: tr\n", "    name: tr\n    checkpoint_at: [900]\n"
                                                          "    sweep: {total_transitions: [1000, 800]}\n"))
    assert _problems(crossing) == [f"{crossing}:10: measurements[1].sweep.total_transitions[1]: sweep "
                                   "'total_transitions' value 800: checkpoint_at [900] beyond total_transitions 800"]


def test_an_evaluate_gif_error_names_the_gif_line(checkpoint, write_spec):
    """gif.policy and gif.seed are checked against the measurement, and the error names the
    line of the value at fault (16 and 17), not the measurement's."""
    for policy, seed, problem in (
            ("nobody", 1,
             "16: measurements[0].gif.policy: gif.policy 'nobody' is not one of this measurement's policies"),
            ("agent", 99, "17: measurements[0].gif.seed: gif.seed 99 is not one of this measurement's seeds")):
        path = write_spec(edit("    batch_size: 4\n", f"    batch_size: 4\n    gif:\n      policy: {policy}\n"
                                                      f"      seed: {seed}\n"))
        assert _problems(path) == [f"{path}:{problem}"]
    both = write_spec(edit("    batch_size: 4\n",
                           "    batch_size: 4\n    gif:\n      policy: nobody\n      seed: 99\n"))
    assert _fields(both) == ["measurements[0].gif.policy", "measurements[0].gif.seed"]


@pytest.mark.parametrize("text, problem", [
    ("name: s\npolicies:\n  random: {type: random}\n  no: {type: random}\n",
     "4: policies.no: key no reads as a boolean in YAML, not a name: quote it ('no')"),
    ("name: s\non: 1\n", "2: on: key on reads as a boolean in YAML, not a name: quote it ('on')"),
    ("name: s\npolicies:\n  123: {type: random}\n", "3: policies.123: key 123 reads as a number in YAML"),
    ("name: s\npolicies:\n  010: {type: random}\n", "3: policies.010: key 010 reads as a number in YAML, not a "
                                                      "name: quote it ('010')"),
    ("name: s\ndescription: 2024-01-01\n", "2: description: 2024-01-01 reads as a date in YAML: quote it"),
    ("name: s\nmeasurements:\n  - seeds: [1, 010]\n",
     "3: measurements[0].seeds[1]: 010 is read as 8 by YAML 1.1's rules alone: write 8, or quote it"),
    ("name: s\nx: 1_000\n", "2: x: 1_000 is read as 1000"),
    ("name: s\nx: 1:30\n", "2: x: 1:30 is read as 90"),
], ids=["no", "on", "number-key", "octal-key", "date", "octal", "underscore", "sexagesimal"])
def test_a_plain_value_that_does_not_read_as_it_looks_is_named(write_spec, text, problem):
    """YAML 1.1 reads `no:` as false, 2024-01-01 as a date and 010 as 8: the error names the
    line and the value, and says to quote it or write what it means; quoted, it is text."""
    path = write_spec(text)
    with pytest.raises(SpecSourceError) as info:
        load_yaml(path)
    assert str(info.value).startswith(f"{path}:{problem}")
    value = text.splitlines()[-1].split(": ")[-1].strip("[]{}").split(", ")[-1]
    key = text.splitlines()[-1].strip(" -").split(":")[0]
    quoted = text.replace(f"{key}:", f"'{key}':") if "key" in problem else text.replace(value, f"'{value}'")
    assert load_yaml(write_spec(quoted)).data is not None


def test_every_bad_value_of_a_sweep_is_named_at_once(write_spec):
    """A sweep with several bad values names each, on its own line, and each once: a value
    shared by several trials is one problem, not one per trial."""
    many = write_spec(AGREEING.replace("    name: tp\n", "    name: tp\n    sweep:\n      batch_size: [-1, 32, -2]\n"
                                                       "      gamma: [0.9, 7]\n      seed: [1, 2]\n"))
    assert _problems(many) == [  # in the file's order
        f"{many}:6: measurements[0].sweep.batch_size[0]: sweep 'batch_size' value -1: "
        "Input should be greater than or equal to 1",
        f"{many}:6: measurements[0].sweep.batch_size[2]: sweep 'batch_size' value -2: "
        "Input should be greater than or equal to 1",
        f"{many}:7: measurements[0].sweep.gamma[1]: sweep 'gamma' value 7: Input should be less than or equal to 1"]
    listed = write_spec(AGREEING.replace("    name: tp\n", "    name: tp\n    sweep:\n      nope: [1]\n"
                                                         "      seed: [3, 3]\n      keep_freed_memory: [true]\n"))
    assert [p.split(": ", 2)[1:] for p in _problems(listed)] == [
        ["measurements[0].sweep.nope", "sweep key 'nope' is not a training field; fields: " + ", ".join(SWEEPABLE)],
        ["measurements[0].sweep.seed[1]", "sweep 'seed' lists 3 more than once: each value is one trial"],
        ["measurements[0].sweep.keep_freed_memory", "sweep 'keep_freed_memory': the setting lasts for the whole "
         "process once a training applies it, so a run takes one value: run one spec per value and compare the runs"]]
    # every kind of problem in one pass: a key that is no field, a bad value, a trial too short
    mixed = write_spec(AGREEING.replace("    name: tp\n", "    name: tp\n    sweep:\n      nope: [1]\n"
                                                        "      batch_size: [0, 32]\n"
                                                        "      total_transitions: [500, 2000]\n"))
    assert _fields(mixed) == [
        "measurements[0].sweep.nope", "measurements[0].sweep.batch_size[0]",
        "measurements[0].sweep.total_transitions[0]"]
    # a trial error that one swept value alone explains is placed at that value, though the
    # message is about another field; one that no single value causes names its trials, once
    alone = write_spec(AGREEING.replace("    name: tr\n", "    name: tr\n    checkpoint_at: [900]\n"
                                        "    sweep: {total_transitions: [800, 1000], gamma: [0.9, 0.95, 0.99]}\n"))
    assert _problems(alone) == [f"{alone}:10: measurements[1].sweep.total_transitions[0]: sweep 'total_transitions' "
                                "value 800: checkpoint_at [900] beyond total_transitions 800"]
    # a field of one value, or a value whose trials fail for their own reasons elsewhere, is no cause
    single = write_spec(AGREEING.replace("    name: tr\n", "    name: tr\n    sweep:\n      learning_rate: [0.0001]\n"
                                         "      checkpoint_at: [[3000], [100, 3000]]\n"))
    assert _fields(single) == ["measurements[1].sweep"]
    tangled = write_spec(AGREEING.replace("    name: tr\n", "    name: tr\n    checkpoint_at: [900]\n    sweep:\n"
                                          "      total_transitions: [800]\n      learning_rate: [0.0001, -2]\n"))
    assert _fields(tangled) == ["measurements[1].sweep",
                                                                 "measurements[1].sweep.learning_rate[1]"]
    crossed = write_spec(AGREEING.replace("    name: tr\n", "    name: tr\n    sweep:\n"
                                          "      checkpoint_at: [[900], [100]]"
                                          "\n      total_transitions: [800, 1000]\n      gamma: [0.9, 0.95]\n"))
    assert _problems(crossed) == [f"{crossed}:9: measurements[1].sweep: sweep trial 'checkpoint_at=[900],"
                                  "total_transitions=800,gamma=0.9' and 1 more: checkpoint_at [900] beyond "
                                  "total_transitions 800"]
    not_a_length = write_spec(AGREEING.replace("    name: tp\n",
                                               "    name: tp\n    sweep: {total_transitions: [0, 2000]}\n"))
    assert [p.split(": ", 2)[2] for p in _problems(not_a_length)] == ["sweep 'total_transitions' value 0: Input should "
                                                                      "be greater than 0"]  # said once, not twice
    hidden = write_spec(AGREEING.replace("    name: tp\n", "    name: tp\n    sweep:\n      total_transitions: [500]\n"
                                                         "      learning_rate: [0]\n"))
    assert _fields(hidden) == ["measurements[0].sweep.total_transitions[0]",
                                                                "measurements[0].sweep.learning_rate[0]"]
    short = write_spec(AGREEING.replace("    name: tp\n",
                                        "    name: tp\n    sweep: {total_transitions: [500, 900, 2000]}\n"))
    assert _problems(short) == [
        f"{short}:5: measurements[0].sweep.total_transitions[{i}]: warmup_transitions 1000 must be below "
        f"total_transitions {total} (sweep 'total_transitions' value {total})" for i, total in ((0, 500), (1, 900))]


def test_a_late_gif_hides_no_other_problem_of_its_trials(write_spec):
    """Trials whose GIF checkpoint lies beyond their length are still checked for everything else,
    without the GIF's checkpoint, which gif.at's own error covers; an empty sweep list does not
    stop gif.at being checked; seeds listed twice over are placed at the sweep."""
    gif = AGREEING.replace("    total_transitions: 1000\n",
                           "    total_transitions: 1000\n    gif: {seed: 1, at: [900]}\n")
    both = write_spec(gif.replace("    gif:",
                                  "    sweep: {total_transitions: [500, 800], learning_rate: [0]}\n    gif:"))
    assert [p.split(": ", 2)[1:] for p in _problems(both)] == [
        ["measurements[1].sweep.learning_rate[0]", "sweep 'learning_rate' value 0: Input should be greater than 0"],
        ["measurements[1].gif.at[0]",
         "gif.at [900] beyond total_transitions 500 (sweep 'total_transitions' value 500)"],
        ["measurements[1].gif.at[0]",
         "gif.at [900] beyond total_transitions 800 (sweep 'total_transitions' value 800)"]]
    empty = write_spec(gif.replace("    gif:", "    sweep: {total_transitions: [500, 2000], batch_size: []}\n    gif:"))
    assert _fields(empty) == ["measurements[1].sweep.batch_size",
                                                               "measurements[1].gif.at[0]"]
    past = write_spec(AGREEING.replace("    name: tr\n", "    name: tr\n    seed: 4294967295\n    seeds: 3\n"
                                       "    sweep: {learning_rate: [-1]}\n"))
    assert _fields(past) == ["measurements[1].seeds",
                                                              "measurements[1].sweep.learning_rate[0]"]
    seeds = write_spec(AGREEING.replace("    name: tr\n",
                                        "    name: tr\n    seeds: 2\n    sweep: {seed: [1, 2], bogus: [1]}\n"))
    assert _fields(seeds) == ["measurements[1].sweep.bogus", "measurements[1].sweep.seed"]


def test_gif_checkpoints_are_checked_as_gif_at_and_kept_in_every_trial(write_spec):
    """A GIF needs its checkpoint: gif.at is checked against each trial's length under its own
    name, and a sweep over checkpoint_at adds to the GIF's checkpoints rather than dropping them."""
    gif = AGREEING.replace("    total_transitions: 1000\n",
                           "    total_transitions: 1000\n    gif: {seed: 1, at: [900]}\n")
    short = write_spec(gif.replace("    gif:", "    sweep: {total_transitions: [1000, 800]}\n    gif:"))
    assert _problems(short) == [f"{short}:11: measurements[1].gif.at[0]: gif.at [900] beyond total_transitions 800 "
                                "(sweep 'total_transitions' value 800)"]
    bad_total = write_spec(gif.replace("    gif:", "    sweep: {total_transitions: [1000, -1]}\n    gif:"))
    assert _problems(bad_total) == [f"{bad_total}:10: measurements[1].sweep.total_transitions[1]: sweep "
                                    "'total_transitions' value -1: Input should be greater than 0"]
    negative = write_spec(gif.replace("at: [900]", "at: [0]"))
    assert _problems(negative) == [f"{negative}:10: measurements[1].gif.at[0]: Input should be greater than 0"]
    swept = load_spec(write_spec(gif.replace("    gif:", "    sweep: {checkpoint_at: [[100], [200]]}\n    gif:")))
    train = swept.spec.measurements[1]
    assert [train.training_config(training).checkpoint_at for training in train.trainings()] == [(100, 900), (200, 900)]


def test_a_sweep_over_seed_trains_each_trial_with_its_own_seed(write_spec):
    """Without `seeds:`, a sweep over seed is what gives a trial its training seed: each training
    trains, and is stored, under the seed its trial lists (not the base seed)."""
    loaded = load_spec(write_spec(AGREEING.replace("    name: tr\n", "    name: tr\n    sweep: {seed: [1, 2]}\n")))
    train = loaded.spec.measurements[1]
    assert [(training.label, training.training_seed, train.training_config(training).seed)
            for training in train.trainings()] == [("seed=1", 1, 1), ("seed=2", 2, 2)]
