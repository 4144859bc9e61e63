"""Specs that extend specs: how layers merge, where errors point, and what a run stores."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from shipped_specs import shipped_specs
from test_cli_inputs import assert_one_line_usage_error
from test_end_to_end import runner

from runner.spec.document import SpecError, load_spec, settings_as_written
from runner.spec.extends import MAX_EXTENDS_DEPTH
from runner.spec.yaml_source import read_spec_text

REPO = Path(__file__).resolve().parent.parent
BASE = """\
name: base
description: the base's question
contract: {max_episode_frames: 2000}
policies:
  random: {type: random}
  spare: {type: random}
measurements:
  - kind: evaluate
    name: scores
    policies: [random]
    seeds: [4, 5]
    batch_size: 2
  - kind: evaluate
    name: spare_scores
    policies: [spare]
    seeds: [1]
"""


@pytest.fixture
def base(write_spec) -> Path:
    return write_spec(BASE, "base.yaml")


def _problems(path: Path) -> list[str]:
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return info.value.problems


def test_mappings_merge_named_items_merge_and_other_lists_replace(base, write_spec):
    child = write_spec("""\
extends: base.yaml
name: child
contract: {max_episode_frames: 4000}
policies:
  ~spare:
measurements:
  - name: scores
    seeds: [7, 8, 9]
  - ~spare_scores:
  - kind: evaluate
    name: more
    policies: [random]
    seeds: [1]
""", "child.yaml")
    loaded = load_spec(child)
    data = read_spec_text(loaded.text)
    assert data["name"] == "child" and data["description"] == "the base's question"
    assert data["contract"] == {"max_episode_frames": 4000}
    assert list(data["policies"]) == ["random"]
    assert [m["name"] for m in data["measurements"]] == ["scores", "more"]
    assert data["measurements"][0] == {"kind": "evaluate", "name": "scores", "policies": ["random"],
                                       "seeds": [7, 8, 9], "batch_size": 2}
    assert "extends" not in data
    # the stored text is the resolved document: validated, hashed, and read back alone
    assert settings_as_written(loaded.text)["measurements"][0]["seeds"] == [7, 8, 9]
    printed = runner("validate", "--resolved", str(child), cwd=child.parent)
    assert printed.returncode == 0 and printed.stdout == loaded.text
    assert yaml.safe_load(printed.stdout) == data


def test_a_spec_without_extends_keeps_its_own_text(base):
    assert load_spec(base).text == BASE


def test_an_error_names_the_file_and_line_that_hold_the_bad_value(base, write_spec):
    child = write_spec("extends: base.yaml\nname: child\nmeasurements:\n  - name: scores\n    batch_size: 0\n",
                       "child.yaml")
    [problem] = _problems(child)
    assert problem.startswith(f"{child}:5: measurements[0].batch_size:"), problem
    base.write_text(BASE.replace("{type: random}\n  spare", "{type: randomx}\n  spare"))
    child.write_text("extends: base.yaml\nname: child\n")
    problems = _problems(child)
    assert any(p.startswith(f"{base}:5: policies.random:") for p in problems), problems


@pytest.mark.parametrize("text, files, mention", [
    ("extends: nowhere.yaml\nname: c\n", {}, "nowhere.yaml: no such spec file"),
    ("extends: other.yaml\nname: c\n", {"other.yaml": "extends: spec.yaml\nname: o\n"}, "makes a cycle"),
    ("extends: [base.yaml]\nname: c\n", {}, "the base spec's path"),
    ("extends: base.yaml\n", {}, "names itself"),
    ("extends: base.yaml\nname: c\npolicies:\n  ~nothing:\n", {}, "the base has no 'nothing'"),
    ("extends: base.yaml\nname: c\nmeasurements:\n  - ~nothing:\n", {}, "no item of that name"),
    ("extends: base.yaml\nname: c\nmeasurements:\n  - seeds: [1]\n", {}, "each item here names itself"),
    ("name: c\npolicies:\n  ~random:\n", {}, "it needs `extends:`"),
    ("extends: ../base.yaml\nname: c\n", {"../base.yaml": BASE}, "in another folder"),
], ids=["missing", "cycle", "not-a-path", "no-name", "remove-missing-key", "remove-missing-item", "unnamed-item",
        "remove-without-base", "other-folder"])
def test_bad_extends_are_one_line_naming_file_and_line(tmp_path, base, write_spec, text, files, mention):
    for name, content in files.items():
        (tmp_path / name).write_text(content)
    spec = write_spec(text)
    result = runner("validate", str(spec), cwd=tmp_path)
    assert_one_line_usage_error(result, mention)
    assert f"{spec}:" in result.stderr or "other.yaml:" in result.stderr


def test_a_chain_deeper_than_the_limit_is_refused(tmp_path, base):
    previous = "base.yaml"
    for depth in range(MAX_EXTENDS_DEPTH):
        (tmp_path / f"level{depth}.yaml").write_text(f"extends: {previous}\nname: level{depth}\n")
        previous = f"level{depth}.yaml"
    assert "name: level" in load_spec(tmp_path / f"level{MAX_EXTENDS_DEPTH - 2}.yaml").text
    result = runner("validate", str(tmp_path / previous), cwd=tmp_path)
    assert_one_line_usage_error(result, f"more than {MAX_EXTENDS_DEPTH}")


def test_shipped_specs_that_extend_resolve_to_their_own_settings():
    """Every shipped spec with `extends` validates, and its resolved text holds no `extends`."""
    extending = [(p, loaded) for p, loaded in shipped_specs("[!_]*.yaml") if "extends:" in p.read_text()]
    assert extending, "no shipped spec extends another"
    for path, loaded in extending:
        assert "extends" not in read_spec_text(loaded.text), path
        assert read_spec_text(loaded.text)["name"] == path.stem
