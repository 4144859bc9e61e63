"""Models exported as CleanRL and Stable-Baselines3 users export them: the declared input convention
and its adapter, the pre-checks before a check runs, and a check against the user's own FP32 file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from small_check import SMALL_CHECK, set_args
from test_cli_inputs import assert_one_line_usage_error, cli
from user_exports import (
    cleanrl_onnx,
    fp16_io_onnx,
    nhwc_onnx,
    sb3_onnx,
    scaled_outside_onnx,
)

from breakout_core.conversion.input_convention import InputConvention, model_input, write_adapted
from breakout_core.conversion.model_prechecks import precheck
from breakout_core.evaluation.fixed_states import load_fixed_states
from breakout_core.runtimes.onnxruntime_runtime import OnnxRuntimeRuntime
from runner.spec.yaml_source import read_spec_text
from runner.store.database import Store

REPO = Path(__file__).resolve().parents[1]
REFERENCE_ONNX = REPO / "models" / "reference" / "dqn_breakout.onnx"
REFERENCE_V2 = REPO / "models" / "reference_v2" / "dqn_breakout.pt"
STATES = load_fixed_states(REPO / "models" / "reference" / "fixed_states_60.npz").obs
FEW = STATES[::6]  # 10 states: enough to tell an adapter that feeds the wrong thing


@pytest.fixture(scope="module")
def exports(tmp_path_factory) -> dict[str, Path]:
    """Every shape of file, exported once for the module."""
    folder = tmp_path_factory.mktemp("exports")
    files = {
        "cleanrl": cleanrl_onnx(folder / "cleanrl.onnx"),
        "cleanrl_dynamic": cleanrl_onnx(folder / "cleanrl_dynamic.onnx", dynamic_batch=True),
        "sb3": sb3_onnx(folder / "sb3.onnx"),
        "nhwc": nhwc_onnx(folder / "nhwc.onnx"),
        "nhwc_uint8": nhwc_onnx(folder / "nhwc_uint8.onnx", torch.uint8),
        "scaled_outside": scaled_outside_onnx(folder / "scaled_outside.onnx"),
    }
    files["fp16_io"] = fp16_io_onnx(files["cleanrl_dynamic"], folder / "fp16_io.onnx")
    files["fp16_keep_io"] = fp16_io_onnx(files["cleanrl"], folder / "fp16_keep_io.onnx", keep_io_types=True)
    files["uint8_fp16_converted"] = fp16_io_onnx(REFERENCE_ONNX, folder / "uint8_fp16.onnx", keep_io_types=True)
    files["uint8_fp16_out"] = fp16_io_onnx(REFERENCE_ONNX, folder / "uint8_fp16_out.onnx", keep_input_cast=True)
    files["uint8_fp16_out_broken"] = fp16_io_onnx(REFERENCE_ONNX, folder / "uint8_fp16_out_broken.onnx")
    files["full_action_space"] = cleanrl_onnx(folder / "full18.onnx", actions=18)
    return files


def reference_q(states: np.ndarray) -> np.ndarray:
    with OnnxRuntimeRuntime(intra_op_threads=1, node_placement=False) as runtime:
        return runtime.load(REFERENCE_ONNX).infer(states)


@pytest.mark.parametrize("name, declared, adapter, tolerance", [
    ("cleanrl", "float32:0-255:nchw", "Cast uint8->float32", 1e-4),
    ("cleanrl_dynamic", "float32:0-255:nchw", "Cast uint8->float32", 1e-4),
    ("sb3", "float32:0-255:nchw", "Cast uint8->float32", 1e-4),
    ("nhwc", "float32:0-255:nhwc", "Transpose NCHW->NHWC, Cast uint8->float32", 1e-4),
    ("nhwc_uint8", "uint8:0-255:nhwc", "Transpose NCHW->NHWC", 1e-4),
    ("scaled_outside", "float32:0-1:nchw", "Cast uint8->float32, Div 255", 1e-4),
    ("fp16_io", "float16:0-255:nchw", "Cast uint8->float16, output Cast float16->float32", 3e-2),
    ("uint8_fp16_out", "uint8:0-255:nchw", "output Cast float16->float32", 3e-2),
])
def test_the_adapter_feeds_the_declared_convention(tmp_path, exports, name, declared, adapter, tolerance):
    convention = InputConvention.parse(declared)
    adapted = write_adapted(exports[name], convention, tmp_path / "adapted.onnx", FEW)
    assert adapted.adapter == adapter and adapted.states == len(FEW)
    model = onnx.load(adapted.path)
    _, dtype, shape = model_input(model)
    original_batch = model_input(onnx.load(exports[name]))[2][0]
    assert dtype == "uint8" and shape == (original_batch, 4, 84, 84)
    assert model.graph.output[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert model.graph.output[0].name == onnx.load(exports[name]).graph.output[0].name  # `q_values` too
    meta = {p.key: p.value for p in model.metadata_props}
    assert meta["breakout.input_adapter"] == adapter and meta["breakout.input_source"] == declared
    with OnnxRuntimeRuntime(intra_op_threads=1, node_placement=False) as runtime:
        q = runtime.load(adapted.path).infer(FEW)  # a fixed batch of 1 runs in calls of 1
        assert runtime.describe()["actual"]["static_batch"] == (1 if original_batch == 1 else None)
    # the reference's weights in another shape of network: the reference's Q-values
    assert np.max(np.abs(q - reference_q(FEW))) <= tolerance


def test_an_adapter_that_does_not_fit_the_file_is_caught_on_the_states(tmp_path, exports):
    """CleanRL's network divides by 255 itself: declared 0-1, it is fed 1/255 of its input, and the
    adapter check (the file fed what the declaration says) passes while the Q-values are not the
    reference's; the declaration is the user's word, which is why the tool never guesses it."""
    adapted = write_adapted(exports["cleanrl_dynamic"], InputConvention.parse("float32:0-1:nchw"),
                            tmp_path / "wrong.onnx", FEW)
    with OnnxRuntimeRuntime(intra_op_threads=1, node_placement=False) as runtime:
        q = runtime.load(adapted.path).infer(FEW)
    assert np.max(np.abs(q - reference_q(FEW))) > 0.1


def test_a_uint8_channels_last_file_needs_no_declaration(exports):
    from breakout_core.conversion.input_convention import convention_of

    assert str(convention_of(onnx.load(exports["nhwc_uint8"]), None)) == "uint8:0-255:nhwc"
    assert convention_of(onnx.load(REFERENCE_ONNX), None).native


def test_a_fixed_batch_is_fed_in_calls_of_it_and_said(tmp_path, exports):
    adapted = write_adapted(exports["cleanrl"], InputConvention.parse("float32:0-255:nchw"), tmp_path / "a.onnx", FEW)
    found = precheck(adapted.path, [1, 10, 60])
    assert found.static_batch == 1 and "every batch runs as calls of 1" in found.note()
    assert precheck(REFERENCE_ONNX, [1, 60]).note() is None


@pytest.mark.parametrize("name, given, mentions", [
    ("cleanrl", (), ["MODEL cleanrl.onnx: takes float32 (1, 4, 84, 84)", "--input DTYPE:RANGE:LAYOUT",
                     "e.g. --input float32:0-255:nchw"]),
    ("nhwc", (), ["takes float32 ('batch', 84, 84, 4)", "e.g. --input float32:0-255:nhwc"]),
    ("fp16_io", (), ["takes float16", "e.g. --input float16:0-255:nchw"]),
    ("cleanrl", ("--input", "float32:0-1"), ["--input 'float32:0-1' is not DTYPE:RANGE:LAYOUT"]),
    ("cleanrl", ("--input", ""), ["--input '' is not DTYPE:RANGE:LAYOUT"]),
    ("cleanrl", ("--input", "float16:0-255:nchw"), ["takes float32 (1, 4, 84, 84), declared float16:0-255:nchw"]),
    ("nhwc", ("--input", "float32:0-255:nchw"), ["declared NCHW: (B, 4, 84, 84)"]),
    ("full_action_space", ("--input", "float32:0-255:nchw"),
     ["it gives 18 Q-values, ALE's full action space", "contract option full_action_space",
      "runner check full18.onnx --baseline YOUR_18_ACTION_FP32.onnx --set contract.full_action_space=true"]),
    ("uint8_fp16_converted", (), ["ONNX Runtime cannot load it", "onnxconverter-common's FP16 converter",
                                  "node_block_list=["]),
    ("uint8_fp16_out_broken", (), ["onnxconverter-common's FP16 converter", "node_block_list=["]),
], ids=["undeclared-float32", "undeclared-nhwc", "undeclared-float16", "bad-syntax", "empty", "wrong-dtype",
        "wrong-layout", "18-actions", "fp16-converter-bug", "fp16-converter-bug-float16-output"])
def test_a_file_check_cannot_measure_is_one_line_and_nothing_runs(tmp_path, exports, name, given, mentions):
    model = tmp_path / exports[name].name
    shutil.copy(exports[name], model)
    result = cli("check", model.name, *given, "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, *mentions)
    assert not (tmp_path / "r.duckdb").exists() and not (tmp_path / "runs").exists()


def test_an_undeclared_float_baseline_is_told_its_own_option(tmp_path, exports):
    shutil.copy(exports["cleanrl"], tmp_path / "fp32.onnx")
    result = cli("check", str(REFERENCE_ONNX), "--baseline", "fp32.onnx", "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, "--baseline fp32.onnx: takes float32 (1, 4, 84, 84)",
                                "declare it with --baseline-input DTYPE:RANGE:LAYOUT")
    assert not (tmp_path / "r.duckdb").exists()


def test_another_agent_without_a_baseline_is_told_how_to_give_its_own(tmp_path, capsys):
    """The breakout-v2 agent's weights exported as a user would: no metadata, so no contract to
    refuse it by; it decides otherwise than the reference on most fixed states."""
    from runner.cli.check import CHECK_SPEC
    from runner.cli.check_contract import played_contract
    from runner.cli.check_inputs import prepare_models

    contract = played_contract(CHECK_SPEC, ())
    other = cleanrl_onnx(tmp_path / "other_agent.onnx", dynamic_batch=True, checkpoint=REFERENCE_V2)
    sets = prepare_models([("MODEL", other, "candidate", "float32:0-255:nchw")], (), CHECK_SPEC, contract)
    out = capsys.readouterr().out
    assert "it looks like another agent" in out and "--baseline YOUR_FP32.onnx" in out
    assert json.loads(sets[0].split("=", 1)[1])["input"] == "float32:0-255:nchw"
    same = cleanrl_onnx(tmp_path / "same_agent.onnx", dynamic_batch=True)
    prepare_models([("MODEL", same, "candidate", "float32:0-255:nchw")], (), CHECK_SPEC, contract)
    assert "another agent" not in capsys.readouterr().out




@pytest.mark.slow
@pytest.mark.parametrize("candidate, baseline, flags", [
    ("fp16_keep_io", "cleanrl", ("--input", "float32:0-255:nchw")),
    ("cleanrl_dynamic", "cleanrl", ("--input", "float32:0-255:nchw")),
    ("sb3", "sb3", ("--input", "float32:0-255:nchw")),
    ("fp16_io", "nhwc", ("--input", "float16:0-255:nchw", "--baseline-input", "float32:0-255:nhwc")),
], ids=["cleanrl-fp16-vs-fp32", "cleanrl-dynamic-vs-static", "sb3-own", "fp16-io-vs-nhwc"])
def test_a_user_model_against_its_own_fp32_file(tmp_path, exports, candidate, baseline, flags):
    """No .pt and no contract flag: the fixed states come from the baseline's own games, captured
    once and reused; every file is fed through its adapter; no exit 3."""
    from breakout_core.game.contract import contract_by_name
    from runner.cli.check_inputs import baseline_states

    for name in {candidate, baseline}:
        shutil.copy(exports[name], tmp_path / exports[name].name)
    model, base = exports[candidate].name, exports[baseline].name
    result = cli("check", model, "--baseline", base, *flags, *set_args(*SMALL_CHECK),
                 "--db", "r.duckdb", "--reports", "reports", cwd=tmp_path)
    ended = result.exception is None or isinstance(result.exception, SystemExit)  # exit 0 raises nothing
    assert result.exit_code in (0, 1) and ended, (result.output, result.exception)
    assert f"--baseline {base}: capturing 60 fixed states from its own games under breakout-v3" in result.stdout
    assert "verdict same_decisions: deployment-worthy" in result.stdout  # the reference's weights in every file
    assert result.stdout.splitlines()[-1].startswith("check ")
    with Store(tmp_path / "r.duckdb").reader() as con:
        text = con.execute("SELECT spec_text FROM runs").fetchone()[0]
        described = [json.loads(d) for (d,) in con.execute(
            "SELECT runtime_describe FROM runtime_status WHERE runtime = 'candidate' AND available").fetchall()]
        outcomes = dict(con.execute("SELECT verdict, outcome FROM latest_verdicts").fetchall())
    artifacts = read_spec_text(text)["artifacts"]
    assert artifacts["candidate"]["input"] == flags[1] and artifacts["fixed_states"]["path"].endswith(".npz")
    meta = described[0]["actual"]["model_metadata"]
    assert meta["breakout.input_source"] == flags[1] and meta["breakout.input_adapter"].startswith(
        "Transpose" if "nhwc" in flags[1] else "Cast")
    assert "/inputs/candidate.onnx" in described[0]["artifact"]  # adapted under the run's folder
    assert len(outcomes) == 5
    # the baseline's states are reused while the file and the contract are the same
    kept = tmp_path / artifacts["fixed_states"]["path"]
    before = kept.stat().st_mtime_ns
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        again = baseline_states(tmp_path / base, tmp_path / base, None, contract_by_name("breakout-v3"))
    assert (tmp_path / again).resolve() == kept.resolve() and kept.stat().st_mtime_ns == before


USER_SPEC = """\
name: user_float
artifacts:
  model: {{path: {model}{declared}}}
runtimes:
  ort: {{runtime: onnxruntime, provider: cpu, intra_op_threads: 1, artifact: model}}
measurements:
  - kind: closed_loop
    name: loop
    runtimes: [ort]
    seed: 0
    steps: 16
"""


def test_a_spec_declares_an_artifacts_input_and_its_run_adapts_it_under_its_folder(tmp_path, exports, write_spec):
    model = shutil.copy(exports["nhwc"], tmp_path / "nhwc.onnx")
    undeclared = write_spec(USER_SPEC.format(model=model, declared=""))
    result = cli("validate", str(undeclared), cwd=tmp_path)
    assert_one_line_usage_error(result, "artifacts.model.input: nhwc.onnx takes float32 ('batch', 84, 84, 4)",
                                "declare it with input: DTYPE:RANGE:LAYOUT", "e.g. input: float32:0-255:nhwc")
    spec = write_spec(USER_SPEC.format(model=model, declared=", input: float32:0-255:nhwc"))
    done = cli("run", str(spec), "--db", "r.duckdb", "--no-report", cwd=tmp_path)
    assert done.exit_code == 0, (done.output, done.exception)
    run_id = done.stdout.split()[1]
    adapted = tmp_path / "runs" / run_id / "inputs" / "model.onnx"
    meta = {p.key: p.value for p in onnx.load(adapted).metadata_props}
    assert meta["breakout.input_adapter"] == "Transpose NCHW->NHWC, Cast uint8->float32"
    with Store(tmp_path / "r.duckdb").reader() as con:
        shown = con.execute("SELECT input, input_adapter, static_batch FROM runtime_summary").fetchone()
    assert shown == ("float32:0-255:nhwc", "Transpose NCHW->NHWC, Cast uint8->float32", None)  # the report's table


@pytest.mark.slow
def test_a_uint8_file_with_a_float16_output_named_q_values_is_checked(tmp_path, exports):
    """onnxconverter-common's FP16 file of a uint8-input export, its input Cast kept in float32:
    the output keeps its name, q_values, and the check casts it back to float32 behind the graph."""
    shutil.copy(exports["uint8_fp16_out"], tmp_path / "mine.onnx")
    result = cli("check", "mine.onnx", *set_args(*SMALL_CHECK), "--db", "r.duckdb", cwd=tmp_path)
    ended = result.exception is None or isinstance(result.exception, SystemExit)
    assert result.exit_code in (0, 1) and ended, (result.output, result.exception)
    assert "fed through the adapter output Cast float16->float32" in result.stdout
    assert "question: is it as good and not slower?" in result.stdout  # an fp16 file against the fp32 one
