"""A spec's model and data files, looked at when the spec loads: an empty, truncated or
foreign file, or an ONNX model whose external data is missing or outside its folder, is one
line naming it and what is wrong, before anything runs (and before a reader deep in torch,
numpy or onnx fails with its own words)."""

from __future__ import annotations

import zipfile
from pathlib import Path

from breakout_core.common.messages import described

WHAT = {"checkpoint": "a PyTorch checkpoint", "fixed_states": "a fixed-states .npz file", "onnx": "an ONNX model"}


def file_problem(path: Path, kind: str) -> str | None:
    """What is wrong with `path` as a `kind` file (checkpoint, fixed_states, onnx), or None: its
    container, and a checkpoint's content (fixed states are read for their contract anyway)."""
    if kind not in WHAT:
        return None
    size = path.stat().st_size
    if size == 0:
        return f"{path}: the file is empty, not {WHAT[kind]}"
    if kind == "onnx":
        return _onnx_problem(path)
    try:
        with zipfile.ZipFile(path) as archive:
            names = archive.namelist()
            damaged = archive.testzip()
    except (zipfile.BadZipFile, OSError, EOFError):
        return f"{path}: not {WHAT[kind]} (not a zip archive: truncated, or another kind of file)"
    if damaged is not None:
        return f"{path}: not {WHAT[kind]} that can be read (member {damaged} is damaged)"
    if kind == "checkpoint" and not any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        return f"{path}: not {WHAT[kind]} (a zip archive without torch's data.pkl)"
    if kind == "checkpoint":  # what is inside, as every user of the checkpoint will read it
        from breakout_core.learning.qnetwork import load_checkpoint

        try:
            load_checkpoint(path)
        except ValueError as exc:
            return str(exc)
        except Exception as exc:  # a checkpoint of the right format missing its parts
            return f"{path}: not {WHAT[kind]} that can be read ({described(exc)})"
    if kind == "fixed_states" and not all(n.endswith(".npy") for n in names):
        return f"{path}: not {WHAT[kind]} (a zip archive of other files than .npy arrays)"
    return None


def _onnx_problem(path: Path) -> str | None:
    import onnx

    from breakout_core.conversion.onnx_checks import tensor_data_problem

    try:
        model = onnx.load_model(str(path), load_external_data=False)
    except Exception as exc:  # protobuf and onnx raise several types for a foreign file
        return f"{path}: not an ONNX model ({described(exc, 'unparsable')})"
    if not model.graph.node:
        return f"{path}: not an ONNX model (no graph in it)"
    from breakout_core.common.external_data import ExternalDataRefused, data_files

    try:
        data_files(path)
    except ExternalDataRefused as exc:
        return str(exc)
    problem = tensor_data_problem(model)
    return f"{path}: not an ONNX model that can be read ({problem})" if problem else None
