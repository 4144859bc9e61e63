"""An output of a spec is never written over a file it reads, over another of its outputs, or
over a file under models/ that a shipped spec reads: `runner validate` (and so `runner run`)
refuses it in one line at the value or `--set` argument that names the path, exit 2."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from runner.cli.commands import main
from runner.spec.document import SpecError, load_spec

REPO = Path(__file__).parents[1]
INT8_EXPORT = REPO / "specs" / "int8_export.yaml"
MODELS = REPO / "models" / "reference"


def _validate(*args: str) -> list[str]:
    result = CliRunner().invoke(main, ["validate", *args])
    assert result.exit_code == 2, result.output
    return result.stderr.splitlines()


def test_an_output_over_the_file_it_quantizes_is_refused_at_the_set_argument():
    """The INT8 export's output set to its FP32 source would overwrite the source with INT8
    weights and then measure the "FP32" baseline on them."""
    given = "artifacts.onnx_int8_dynamic.path=../models/reference/dqn_breakout.onnx"
    assert _validate(str(INT8_EXPORT), "--set", given) == [
        f"error: {INT8_EXPORT}: --set {given}: artifacts.onnx_int8_dynamic.path: {MODELS / 'dqn_breakout.onnx'} is "
        "also artifacts.onnx_fp32.path, which this spec reads: an output may not overwrite an input"]


def test_two_spellings_of_one_path_are_one_file():
    given = "artifacts.onnx_int8_dynamic.path=../specs/../exports/int8_export/./dqn_breakout_int8_minmax.onnx"
    minmax = REPO / "exports" / "int8_export" / "dqn_breakout_int8_minmax.onnx"
    assert _validate(str(INT8_EXPORT), "--set", given) == [
        f"error: {INT8_EXPORT}: --set {given}: artifacts.onnx_int8_dynamic.path: {minmax} is also the path of "
        "artifacts.onnx_int8_minmax, another output of this spec: one would overwrite the other"]


def _export_spec(name: str, out: Path) -> str:
    """An FP32 and FP16 export of the reference checkpoint, as day22_export's, writing its
    files under `out` (the three outputs are on lines 4, 5 and 6)."""
    return f"""\
name: {name}
artifacts:
  checkpoint: {{path: {MODELS / 'dqn_breakout.pt'}}}
  onnx_fp32: {{path: {out / 'dqn_breakout.onnx'}, made_by: {name}}}
  fixed_states: {{path: {out / 'fixed_states_60.npz'}, made_by: {name}}}
  onnx_fp16: {{path: {out / 'dqn_breakout_fp16.onnx'}, made_by: {name}, precision: fp16}}
measurements:
  - kind: export
    name: export
    checkpoint: checkpoint
    onnx: onnx_fp32
    onnx_fp16: onnx_fp16
    fixed_states: fixed_states
    n_states: 6
    capture:
      episode_seeds: {{start: 0, count: 2}}
"""


def test_an_output_over_a_shipped_model_is_refused_unless_the_spec_makes_it(write_spec, tmp_path):
    mine = write_spec(_export_spec("my_export", tmp_path / "exports"))
    assert load_spec(mine).spec.name == "my_export"  # its own folder: fine
    over = write_spec(_export_spec("my_export", MODELS), "over.yaml")
    with pytest.raises(SpecError) as refused:
        load_spec(over)
    outputs = [(4, "onnx_fp32", "dqn_breakout.onnx"), (5, "fixed_states", "fixed_states_60.npz"),
               (6, "onnx_fp16", "dqn_breakout_fp16.onnx")]
    assert len(refused.value.problems) == len(outputs)
    for problem, (line, name, file) in zip(refused.value.problems, outputs):
        assert re.fullmatch(rf"{re.escape(f'{over}:{line}: artifacts.{name}.path: {MODELS / file}')} is read by the "
                            r"shipped spec \w+ as an input \(and by \d+ more\): an output may not replace it",
                            problem), problem
    # the spec the shipped specs name as the files' maker writes them there
    assert load_spec(REPO / "specs" / "day22_export.yaml").spec.name == "day22_export"


def test_an_output_over_a_checkpoint_a_policy_plays_is_refused(write_spec, tmp_path):
    text = _export_spec("my_export", tmp_path).replace(
        "artifacts:\n", f"policies:\n  agent: {{type: checkpoint, path: {tmp_path / 'agent.pt'}}}\nartifacts:\n")
    text = text.replace(f"{tmp_path / 'dqn_breakout.onnx'}", f"{tmp_path / 'agent.pt'}")
    (tmp_path / "agent.pt").write_bytes((MODELS / "dqn_breakout.pt").read_bytes())
    path = write_spec(text)
    with pytest.raises(SpecError) as refused:
        load_spec(path)
    assert f"artifacts.onnx_fp32.path: {tmp_path / 'agent.pt'} is also policies.agent.path, which this spec " \
           "reads: an output may not overwrite an input" in str(refused.value)


def test_an_output_over_the_checkpoint_a_training_starts_from_is_refused(write_spec, tmp_path):
    start = tmp_path / "start.pt"
    start.write_bytes((MODELS / "dqn_breakout.pt").read_bytes())
    text = _export_spec("my_export", tmp_path).replace(f"{tmp_path / 'dqn_breakout.onnx'}", str(start))
    path = write_spec(text + f"""\
  - kind: train
    name: more
    start_from: {start}
    total_transitions: 1000
""")
    with pytest.raises(SpecError) as refused:
        load_spec(path)
    assert f"{path}:4: artifacts.onnx_fp32.path: {start} is also measurements[1].start_from, which this spec reads: " \
           "an output may not overwrite an input" in refused.value.problems
