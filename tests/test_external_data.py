"""ONNX models whose weights are external data (torch.onnx.export's default: `M.onnx` and
`M.onnx.data`): hashed with their data files, held to that hash at every load, confined to their
own folder, and checked and converted like any other model.

A data file rewritten after the run recorded it is refused at load with both hashes, and no row
about it is stored; drawn seeds and baseline games are keyed by the data too; a location that is
absolute, leads out of the folder, resolves outside it through a symlink, is missing or declares
bytes its file lacks is one line and exit 2 from `check`, `check --json`, `convert` and `run`,
before anything is stored."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from small_check import SMALL_CHECK, set_args
from test_artifact_files import _context, _query
from test_cli_inputs import assert_one_line_usage_error
from test_end_to_end import cli
from user_exports import CleanRLQNetwork

from breakout_core.common.external_data import data_files
from breakout_core.common.files import FileReplaced, same_file, write_whole
from breakout_core.common.hashing import file_sha256, model_sha256
from runner.run.errors import ArtifactChanged

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models" / "reference"
SMALL_CALIBRATION = ("measurements.search.calibration={methods: [minmax], n_states: 16, capture: "
                     "{episode_seeds: {start: 9100, count: 2}, max_steps_per_episode: 200, batch_size: 2}}")


def external(path: Path, source: Path = MODELS / "dqn_breakout.onnx") -> Path:
    """`source` saved at `path` with its weights in `path.data` beside it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(onnx.load(source), path, save_as_external_data=True, all_tensors_to_one_file=True,
                    location=f"{path.name}.data", size_threshold=1024)
    return path


def rewritten_weight(model: Path) -> Path:
    """The data file of `model` written again with its first weight changed: same size, other bytes."""
    [data] = data_files(model)
    raw = bytearray(data.read_bytes())
    raw[:4] = np.float32(0.5).tobytes()
    return write_whole(data, bytes(raw))


def hostile(folder: Path, variant: str) -> tuple[Path, str]:
    """(a model whose first external tensor's entry is made `variant`, the location it names)."""
    model = external(folder / variant / "m.onnx")
    graph = onnx.load(model, load_external_data=False)
    entries = {e.key: e for e in graph.graph.initializer[0].external_data}
    if variant == "absolute":
        entries["location"].value = "/etc/passwd"
    elif variant == "parent":
        entries["location"].value = "../../../../etc/passwd"
    elif variant == "symlink":
        entries["location"].value = "link.data"
        os.symlink("/etc/passwd", model.parent / "link.data")
    elif variant == "too_long":
        entries["length"].value = str(2 << 30)
    elif variant == "not_a_count":
        entries["offset"].value = "-1"
    onnx.save_model(graph, model)
    if variant == "missing":
        (model.parent / "m.onnx.data").unlink()
    return model, entries["location"].value


def test_the_content_hash_covers_the_data_files_and_is_the_file_hash_without_them(tmp_path):
    inline = MODELS / "dqn_breakout.onnx"
    assert model_sha256(inline) == file_sha256(inline) and data_files(inline) == ()
    assert model_sha256(MODELS / "dqn_breakout.pt") == file_sha256(MODELS / "dqn_breakout.pt")
    model = external(tmp_path / "a" / "m.onnx")
    assert data_files(model) == (tmp_path / "a" / "m.onnx.data",)
    first = model_sha256(model)
    assert first != file_sha256(model)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert model_sha256(tmp_path / "b" / "m.onnx") == first  # the same bytes elsewhere: the same model
    onnx_bytes = model.read_bytes()
    rewritten_weight(model)
    assert model.read_bytes() == onnx_bytes and model_sha256(model) != first


def test_a_data_file_replaced_while_the_model_is_read_is_told(tmp_path):
    model = external(tmp_path / "m.onnx")
    with pytest.raises(FileReplaced, match="m.onnx.data: replaced by another file while it was read"), \
            same_file(model):
        model_sha256(model)
        rewritten_weight(model)


SPEC = """\
name: external_weights
contract: {{name: breakout-v3}}
artifacts:
  fixed_states: {{path: {states}}}
  reference: {{path: {reference}}}
  onnx_fp32: {{path: {fp32}}}
runtimes:
  ort_fp32: {{runtime: onnxruntime, intra_op_threads: 1, artifact: onnx_fp32}}
  ort_reference: {{runtime: onnxruntime, intra_op_threads: 1, artifact: reference}}
measurements:
  - {{kind: parity, name: before, fixed_states: fixed_states, runtimes: [ort_fp32, ort_reference], batch_sizes: [1]}}
  - {{kind: parity, name: after, fixed_states: fixed_states, runtimes: [ort_fp32, ort_reference], batch_sizes: [1]}}
"""


def _spec(folder: Path) -> Path:
    spec = folder / "spec.yaml"
    spec.write_text(SPEC.format(states=MODELS / "fixed_states_60.npz", reference=MODELS / "dqn_breakout.onnx",
                                fp32=external(folder / "model" / "m.onnx")))
    return spec


def test_a_data_file_rewritten_mid_run_is_refused_at_load_with_both_hashes_and_no_row_about_it(tmp_path):
    from runner.kinds.registry import KINDS

    ctx, files = _context(tmp_path, _spec(tmp_path), "r1")
    model = tmp_path / "model" / "m.onnx"
    files.record_inputs(resume=False)
    recorded = model_sha256(model)
    size = model.stat().st_size + (tmp_path / "model" / "m.onnx.data").stat().st_size
    assert _query(tmp_path / "r.duckdb", "SELECT sha256, bytes FROM run_files WHERE artifact = 'onnx_fp32'") == [
        (recorded, size)]  # one row: the model with its data
    before, after = ctx.spec.measurements
    KINDS["parity"].execute(before, ctx)
    rewritten_weight(model)  # the weights swapped after parity ran the true ones
    with pytest.raises(ArtifactChanged) as refused:
        KINDS["parity"].execute(after, ctx)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"artifacts.onnx_fp32 ({model}): runtime ort_fp32 loaded")
    assert f"sha256 {model_sha256(model)[:12]}, but this run recorded at its start sha256 {recorded[:12]}" in message
    assert message.endswith("another file was put at that path, or other external data beside it; no row about it "
                            "is stored")
    stored = _query(tmp_path / "r.duckdb", "SELECT measurement, artifact_sha256 FROM runtime_status "
                                           "WHERE runtime = 'ort_fp32'")
    assert stored == [("before", recorded)]
    assert _query(tmp_path / "r.duckdb", "SELECT DISTINCT measurement FROM parity_q") == [("before",)]


def test_drawn_seeds_and_baseline_games_differ_when_only_the_data_file_differs(tmp_path):
    from runner.kinds.shared.baseline_games import game_key
    from runner.kinds.shared.drawn_seeds import played_seeds, seed_identity
    from runner.spec.fields import DrawnSeeds

    ctx, _ = _context(tmp_path, _spec(tmp_path), "r1")
    model = tmp_path / "model" / "m.onnx"
    drawn = played_seeds(ctx, "games", DrawnSeeds(drawn=5), {"candidate": model})
    key = game_key(ctx, "ort_fp32", 1)[0]
    assert played_seeds(ctx, "games", DrawnSeeds(drawn=5), {"candidate": model}) == drawn
    rewritten_weight(model)
    assert played_seeds(ctx, "games", DrawnSeeds(drawn=5), {"candidate": model}) != drawn
    assert game_key(ctx, "ort_fp32", 1)[0] != key
    stored = [json.loads(row[0]) for row in _query(tmp_path / "r.duckdb", "SELECT files FROM drawn_seeds")]
    assert stored[-1] == {"candidate": seed_identity(model)}  # its content: graph and every weight, wherever stored


VARIANTS = {"absolute": "is an absolute path", "parent": "leads out of the model's folder",
            "symlink": "resolves to '/etc/passwd', outside the model's folder", "missing": "is missing",
            "too_long": "declares bytes 0 to 2147483648, but the file holds",
            "not_a_count": "has an offset or length that is not a byte count"}


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("command", [("check",), ("check", "--json"), ("convert", "fp16")], ids=" ".join)
def test_external_data_outside_the_models_folder_is_one_line_and_exit_2(tmp_path, variant, command):
    model, location = hostile(tmp_path, variant)
    result = cli(*command, str(model), "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, f"MODEL {model}: external data {location!r} of tensor ", VARIANTS[variant])
    assert result.stdout == "" and not (tmp_path / "r.duckdb").exists()


def test_a_spec_artifact_with_external_data_outside_its_folder_is_refused_before_anything_runs(tmp_path):
    model, _ = hostile(tmp_path, "symlink")
    given = f"artifacts.candidate={json.dumps({'path': str(model)})}"
    result = cli("run", str(REPO / "specs" / "check_onnx.yaml"), "--set", given, "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, f"artifacts.candidate.path: {model}: external data 'link.data' of tensor",
                                "resolves to '/etc/passwd', outside the model's folder")
    assert not (tmp_path / "r.duckdb").exists()


@pytest.fixture(scope="module")
def torch_default(tmp_path_factory) -> Path:
    """CleanRL's network exported as torch.onnx.export writes it by default: M.onnx and M.onnx.data."""
    import torch

    path = tmp_path_factory.mktemp("torch") / "M.onnx"
    torch.onnx.export(CleanRLQNetwork().eval(), (torch.zeros(1, 4, 84, 84),), str(path))
    assert [p.name for p in data_files(path)] == ["M.onnx.data"]
    return path


@pytest.mark.slow
def test_torch_default_export_is_checked_and_converted_to_files_with_their_weights_inside(tmp_path, torch_default):
    shutil.copytree(torch_default.parent, tmp_path / "model")
    declared = ("--input", "float32:0-255:nchw")
    checked = cli("check", "model/M.onnx", *declared, *set_args(*SMALL_CHECK), "--db", "r.duckdb", cwd=tmp_path)
    assert checked.exit_code in (0, 1), (checked.output, checked.exception)
    assert "verdict same_decisions: deployment-worthy" in checked.stdout
    for precision, overrides in [("fp16", ()), ("int8", (SMALL_CALIBRATION,))]:
        made = cli("convert", precision, "model/M.onnx", *declared,
                   *set_args("measurements.search.latency_runs=64", *overrides), "--db", "r.duckdb", cwd=tmp_path)
        assert made.exit_code in (0, 1), (made.output, made.exception)
        out = tmp_path / "model" / f"M_{precision}.onnx"
        assert f"judge it in games: runner check model/M_{precision}.onnx --baseline model/M.onnx" in made.stdout
        assert data_files(out) == ()  # a converted file holds its weights: nothing to keep beside it
    files = _query(tmp_path / "r.duckdb", "SELECT DISTINCT sha256 FROM run_files WHERE path LIKE '%/M.onnx'")
    assert files == [(model_sha256(tmp_path / "model" / "M.onnx"),)]
