"""ONNX models whose weights are external data (torch.onnx.export's default: `M.onnx` and
`M.onnx.data`), confined to their own folder: a location that is absolute, leads out of the
folder, resolves outside it through a symlink, is missing or declares bytes its file lacks is
one line and exit 2 from `check`, `check --json`, `convert` and `run`, before anything is stored."""

from __future__ import annotations

import json
import os
from pathlib import Path

import onnx
import pytest
from test_cli_inputs import assert_one_line_usage_error
from test_end_to_end import cli

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
    onnx.save_model(graph, model)
    if variant == "missing":
        (model.parent / "m.onnx.data").unlink()
    return model, entries["location"].value


VARIANTS = {"absolute": "is an absolute path", "parent": "leads out of the model's folder",
            "symlink": "resolves to /etc/passwd, outside the model's folder", "missing": "is missing",
            "too_long": "declares bytes 0 to 2147483648, but the file holds"}


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
                                "resolves to /etc/passwd, outside the model's folder")
    assert not (tmp_path / "r.duckdb").exists()
