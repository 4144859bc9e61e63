"""`runner convert fp16|int8 MODEL.onnx` on a CleanRL-shaped FP32 file (uint8 input, /255 inside,
dynamic batch, no metadata) and on CleanRL's own export (float32 input in 0-255, batch fixed at 1),
then `runner check` judging what it wrote against that file, with the command convert printed."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import onnx
import pytest
from cleanrl_shaped import export_cleanrl_shaped
from small_check import SMALL_CHECK, set_args
from test_cli_inputs import assert_one_line_usage_error, cli
from user_exports import cleanrl_onnx

from breakout_core.common.hashing import file_sha256
from breakout_core.conversion.export import inspect_onnx
from breakout_core.evaluation.fixed_states import load_fixed_states
from breakout_core.game.contract import CONTRACTS
from runner.spec.yaml_source import read_spec_text
from runner.store.database import Store

MODELS = Path(__file__).resolve().parents[1] / "models" / "reference"
SMALL_CALIBRATION = ("measurements.search.calibration={methods: [minmax], n_states: 16, capture: "
                     "{episode_seeds: {start: 9100, count: 2}, max_steps_per_episode: 200, batch_size: 2}}")


@pytest.mark.parametrize("given, mention", [
    ("missing.onnx", "MODEL missing.onnx: no such file"),
    (str(MODELS / "dqn_breakout_fp16.onnx"), "its weights are fp16; convert takes an FP32 file"),
], ids=["missing", "fp16-source"])
def test_convert_refuses_what_it_cannot_convert_in_one_line_and_stores_nothing(tmp_path, given, mention):
    result = cli("convert", "int8", given, "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, mention)
    assert not (tmp_path / "r.duckdb").exists()


def test_convert_refuses_a_model_without_the_scaling_inside_before_anything_runs(tmp_path):
    model = onnx.load(MODELS / "dqn_breakout.onnx")
    div = next(n for n in model.graph.node if n.op_type == "Div")
    later = [n for n in model.graph.node if div.output[0] in n.input]
    for node in later:  # the network reads the cast pixels, unscaled
        node.input[:] = [div.input[0] if i == div.output[0] else i for i in node.input]
    model.graph.node.remove(div)
    onnx.save_model(model, tmp_path / "unscaled.onnx")
    result = cli("convert", "fp16", "unscaled.onnx", "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, "MODEL unscaled.onnx: the cast input is not scaled by 1/255 inside the graph")
    assert not (tmp_path / "r.duckdb").exists()


def test_convert_refuses_an_unknown_contract_and_stores_nothing(tmp_path):
    result = cli("convert", "int8", str(MODELS / "dqn_breakout.onnx"), "--contract", "pong", "--db", "r.duckdb",
                 cwd=tmp_path)
    assert_one_line_usage_error(result, " convert: Invalid value for '--contract': 'pong' is not one of "
                                "'ale-breakout-v5'")
    assert not (tmp_path / "r.duckdb").exists()


def test_convert_refuses_an_out_that_a_shipped_spec_reads_before_any_game(tmp_path):
    cleanrl_onnx(tmp_path / "cleanrl.onnx", dynamic_batch=True)
    shipped = MODELS / "dqn_breakout_fp16.onnx"
    result = cli("convert", "int8", "cleanrl.onnx", "--input", "float32:0-255:nchw", "--out", str(shipped),
                 "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, f"artifacts.int8.path: {shipped} is read by the shipped spec",
                                "an output may not replace it")
    assert result.stdout == "" and sorted(p.name for p in tmp_path.iterdir()) == ["cleanrl.onnx"]


@pytest.mark.parametrize("given, mention", [
    (["--out", "a.onnx", "--set", "artifacts.int8.path=b.onnx"],
     "--out and --set artifacts.int8.path=b.onnx both say artifacts.int8.path: give one of them"),
    (["--contract", "breakout-v3", "--set", "contract.name=breakout-v2"],
     "--contract and --set contract.name=breakout-v2 both say contract.name: give one of them"),
], ids=["out", "contract"])
def test_convert_refuses_a_value_given_by_an_option_and_a_set_alike(tmp_path, given, mention):
    result = cli("convert", "int8", str(MODELS / "dqn_breakout.onnx"), *given, "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, mention)
    assert result.stdout == "" and list(tmp_path.iterdir()) == []


def test_convert_refuses_to_write_over_the_model_itself(tmp_path):
    model = tmp_path / "m.onnx"
    model.write_bytes((MODELS / "dqn_breakout.onnx").read_bytes())
    result = cli("convert", "fp16", "m.onnx", "--out", "m.onnx", "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, "--out m.onnx: that is MODEL itself")
    assert not (tmp_path / "r.duckdb").exists() and model.read_bytes() == (MODELS / "dqn_breakout.onnx").read_bytes()


def _converted_then_checked(tmp_path: Path, precision: str, *overrides: str, declared: str | None = None
                            ) -> tuple[Path, str]:
    """Convert the CleanRL-shaped file (CleanRL's own float32 export where `declared`), then run the
    check command convert printed, with the tests' reduced counts."""
    if declared:
        cleanrl_onnx(tmp_path / "cleanrl.onnx")
    else:
        export_cleanrl_shaped(tmp_path / "cleanrl.onnx")
    given = ("--input", declared) if declared else ()
    made = cli("convert", precision, "cleanrl.onnx", *given,
               *set_args("measurements.search.latency_runs=64", *overrides),
               "--db", "r.duckdb", "--reports", "reports", cwd=tmp_path)
    assert made.exit_code == 0, (made.output, made.exception)
    out = tmp_path / f"cleanrl_{precision}.onnx"
    lines = made.stdout.splitlines()
    assert lines[0].startswith(f"convert cleanrl.onnx to {precision.upper()}, checked on states under contract "
                               "breakout-v3 (")
    assert "MODEL cleanrl.onnx: capturing 60 fixed states from its own games under breakout-v3" in made.stdout
    assert lines[-2].startswith(f"recommended: cleanrl_{precision}.onnx (")
    flags = f" --input {declared} --baseline-input {declared}" if declared else ""
    assert lines[-1] == f"  judge it in games: runner check cleanrl_{precision}.onnx --baseline cleanrl.onnx{flags}"
    info, source = inspect_onnx(out), inspect_onnx(tmp_path / "cleanrl.onnx")
    assert info.precision == precision
    # the user's input convention kept: the file drops into the code that fed the FP32 one
    assert [(t.name, t.dtype, t.shape) for t in info.inputs] == [(t.name, t.dtype, t.shape) for t in source.inputs]
    assert info.inputs[0].dtype == ("float32" if declared else "uint8")
    onnx.checker.check_model(onnx.load(out), full_check=True)
    with Store(tmp_path / "r.duckdb").reader() as con:
        text = con.execute("SELECT spec_text FROM runs WHERE spec_name = ?", [f"convert_{precision}"]).fetchone()[0]
    states = load_fixed_states(read_spec_text(text)["artifacts"]["fixed_states"]["path"])
    assert states.meta["onnx_sha256"] == file_sha256(tmp_path / "cleanrl.onnx")  # the search's states: MODEL's games
    command = lines[-1].split("runner ", 1)[1].split()
    checked = cli(*command, *set_args(*SMALL_CHECK), "--db", "r.duckdb", "--reports", "reports", "--report",
                  cwd=tmp_path)
    assert checked.exit_code in (0, 1), (checked.output, checked.exception)
    assert checked.stdout.splitlines()[0].startswith(f"check {out.name} under contract breakout-v3 (")
    assert "verdict same_decisions: deployment-worthy" in checked.stdout
    [page] = (tmp_path / "reports").glob("check_onnx-*.html")
    assert CONTRACTS["breakout-v3"].described() in page.read_text(encoding="utf-8")  # the header names the game
    return out, made.stdout


@pytest.mark.slow
def test_convert_names_the_file_a_set_of_the_artifacts_path_made_it_write(tmp_path):
    export_cleanrl_shaped(tmp_path / "cleanrl.onnx")
    (tmp_path / "elsewhere").mkdir()
    written = tmp_path / "elsewhere" / "mine.onnx"
    made = cli("convert", "fp16", "cleanrl.onnx", *set_args("measurements.search.latency_runs=64",
                                                            f"artifacts.fp16.path={written}"),
               "--db", "r.duckdb", "--reports", "reports", cwd=tmp_path)
    assert made.exit_code == 0, (made.output, made.exception)
    lines = made.stdout.splitlines()
    assert lines[-2].startswith(f"recommended: {written} (") and f"runner check {written} --baseline" in lines[-1]
    assert written.is_file() and not (tmp_path / "cleanrl_fp16.onnx").exists()
    assert [p.name for p in written.parent.iterdir()] == ["mine.onnx"], "no lock file is left beside it"


@pytest.mark.slow
def test_convert_fp16_writes_a_file_that_check_judges_against_the_users_fp32_file(tmp_path):
    _, said = _converted_then_checked(tmp_path, "fp16")
    assert "verdict fp16_same_decisions_on_the_fixed_states: deployment-worthy" in said
    with Store(tmp_path / "r.duckdb").reader() as con:
        specs = [r[0] for r in con.execute("SELECT spec_name FROM runs ORDER BY started_at").fetchall()]
    assert specs == ["convert_fp16", "check_onnx"]


@pytest.mark.slow
def test_convert_int8_prints_the_file_it_recommends_and_the_verdicts_that_chose_it(tmp_path):
    _, said = _converted_then_checked(tmp_path, "int8", SMALL_CALIBRATION)
    lines = said.splitlines()
    verdicts = [line for line in lines if line.startswith("  verdict ")]
    assert [v.split(":")[0] for v in verdicts] == ["  verdict int8_same_decisions_on_the_fixed_states",
                                                  "  verdict int8_faster_at_batch_1"]
    assert "minmax calibration" in lines[-2] and "of the fixed states" in lines[-2]
    with Store(tmp_path / "r.duckdb").reader() as con:
        path, met, player, player_sha256, seeds = con.execute(
            "SELECT path, met_target, calibration_source, calibration_source_sha256, calibration_seeds "
            "FROM repair_results").fetchone()
        run_id = con.execute("SELECT run_id FROM runs WHERE spec_name = 'convert_int8'").fetchone()[0]
    assert Path(path) == (tmp_path / "cleanrl_int8.onnx").resolve() and met
    # calibrated on the user's model's own games, not the reference agent's, and the run says which file
    assert player == "onnx_fp32" and player_sha256 == file_sha256(tmp_path / "cleanrl.onnx")
    calibration = load_fixed_states(tmp_path / "runs" / run_id / "search" / "calibration_states.npz")
    assert calibration.checkpoint_sha256 is None and calibration.meta["onnx_sha256"] == player_sha256
    assert sorted(set(calibration.episode_seeds.tolist())) == json.loads(seeds) == [9100, 9101]
    [page] = (tmp_path / "reports").glob("convert_int8-*.html")
    assert f"<code>onnx_fp32</code> (sha256 {player_sha256[:12]})" in page.read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("precision, overrides", [("fp16", ()), ("int8", (SMALL_CALIBRATION,))], ids=["fp16", "int8"])
def test_convert_keeps_cleanrls_float_input_and_prints_the_check_that_declares_it(tmp_path, precision, overrides):
    """CleanRL's own export: float32 input in 0-255, batch fixed at 1. The converted file takes the
    same float32 input (INT8: calibrated on the float states the file takes, in calls of 1)."""
    _, said = _converted_then_checked(tmp_path, precision, *overrides, declared="float32:0-255:nchw")
    assert f"verdict {precision}_same_decisions_on_the_fixed_states: deployment-worthy" in said
    assert "MODEL cleanrl.onnx: its batch dimension is fixed at 1" in said


def test_convert_refuses_an_undeclared_float_model_as_check_does(tmp_path):
    cleanrl_onnx(tmp_path / "cleanrl.onnx")
    result = cli("convert", "int8", "cleanrl.onnx", "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, "MODEL cleanrl.onnx: takes float32 (1, 4, 84, 84)",
                                "declare it with --input DTYPE:RANGE:LAYOUT", "e.g. --input float32:0-255:nchw")
    assert result.stdout == ""  # the conversion is announced once its file passed
    assert not (tmp_path / "r.duckdb").exists() and not (tmp_path / "runs").exists()


def test_the_preprocessing_check_reads_a_scale_that_the_fp16_converter_casts(tmp_path):
    """torch.onnx.export writes the 255 of `x.float() / 255.0` as a Constant node; with the division
    kept in float32 the FP16 converter casts that constant down and up again before the Div."""
    from breakout_core.conversion.fp16 import to_float16
    from breakout_core.conversion.onnx_checks import check_preprocessing

    model = onnx.load(export_cleanrl_shaped(tmp_path / "cleanrl.onnx"))
    kept = [n.name for n in model.graph.node if n.op_type != "Conv"]
    converted, _ = to_float16(model, keep_float=kept)
    div = next(n for n in converted.graph.node if n.op_type == "Div")
    producers = {o: n for n in converted.graph.node for o in n.output}
    assert producers[div.input[1]].op_type == "Cast"  # not the Constant itself
    assert check_preprocessing(converted) == "preprocessing in graph: Cast uint8 -> float32, Div by 255"


def test_a_float_input_in_0_255_is_quantized_as_the_projects_uint8_input_is(tmp_path):
    """CleanRL's float32 input, divided by 255 at once inside the graph: the divided tensor is
    quantized at 1/255, as a uint8 input's is, so every pixel stays exact and the same network gets
    the same INT8 decisions from either export (calibrated, the float file agreed with the uint8
    file's INT8 on 53 of the 60 fixed states, on 256 calibration states from seeds 9100-9101)."""
    import numpy as np
    import onnxruntime as ort

    from breakout_core.conversion.quantize import INPUT_SCALE, fixed_input_scale, quantize_int8, scaled_input_tensor

    source = cleanrl_onnx(tmp_path / "cleanrl.onnx", dynamic_batch=True)
    scaled = scaled_input_tensor(onnx.load(source))
    assert scaled == next(n for n in onnx.load(source).graph.node if n.op_type == "Div").output[0]
    fixed = load_fixed_states(MODELS / "fixed_states_60.npz").obs
    calibration = fixed[::3][:16]
    made = quantize_int8(source, tmp_path / "float_int8.onnx", calibration=calibration.astype(np.float32))
    own = quantize_int8(MODELS / "dqn_breakout.onnx", tmp_path / "own_int8.onnx", calibration=calibration)
    assert fixed_input_scale(onnx.load(made.path), scaled) == pytest.approx(INPUT_SCALE, rel=1e-6)
    assert any("every pixel exact" in check for check in made.checks), made.checks

    def actions(path: Path, obs: np.ndarray) -> np.ndarray:
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        name = session.get_inputs()[0].name
        return np.concatenate([session.run(None, {name: obs[i:i + 1]})[0] for i in range(len(obs))]).argmax(1)

    assert (actions(made.path, fixed.astype(np.float32)) == actions(own.path, fixed)).all()


def test_a_float_input_that_is_not_whole_pixels_keeps_its_calibrated_range(tmp_path):
    """Divided by 255 inside the graph, yet fed values in 0-1: pinning at 1/255 would leave two
    levels, so the calibrated range stands and no check claims exact pixels."""
    import numpy as np

    from breakout_core.conversion.quantize import fixed_input_scale, quantize_int8, scaled_input_tensor

    source = cleanrl_onnx(tmp_path / "cleanrl.onnx", dynamic_batch=True)
    states = (load_fixed_states(MODELS / "fixed_states_60.npz").obs[::3][:16] / 255.0).astype(np.float32)
    made = quantize_int8(source, tmp_path / "int8.onnx", calibration=states)
    scale = fixed_input_scale(onnx.load(made.path), scaled_input_tensor(onnx.load(source)))
    assert scale is not None and scale < 1 / 255 / 100 and not any("every pixel" in c for c in made.checks)


@pytest.mark.skipif(importlib.util.find_spec("nncf") is None, reason="nncf is not installed (pip install -e "
                    "'.[openvino]')")
def test_nncf_takes_a_float_inputs_states_and_pins_its_division_by_255(tmp_path):
    import numpy as np

    from breakout_core.conversion.nncf_quantize import quantize_nncf
    from breakout_core.conversion.quantize import INPUT_SCALE, fixed_input_scale, scaled_input_tensor

    source = cleanrl_onnx(tmp_path / "cleanrl.onnx", dynamic_batch=True)
    states = load_fixed_states(MODELS / "fixed_states_60.npz").obs[::3][:16]
    with pytest.raises(Exception, match="calibration states are uint8; cleanrl.onnx takes float32"):
        quantize_nncf(source, tmp_path / "refused.onnx", calibration=states)
    made = quantize_nncf(source, tmp_path / "int8.onnx", calibration=states.astype(np.float32))
    scale = fixed_input_scale(onnx.load(made.path), scaled_input_tensor(onnx.load(source)))
    assert scale == pytest.approx(INPUT_SCALE, rel=1e-6) and any("every pixel exact" in c for c in made.checks)
