"""The external data files of an ONNX model (torch.onnx.export's default writes `M.onnx` and its
weights in `M.onnx.data`): read from the model's entries, not from onnx's loader, and confined
to the model's own folder. A location that is absolute, leads out of the folder (`..`, or a
symlink that resolves outside it), names no regular file, or declares bytes the file does not
have is refused in one line naming the model, the location and the tensor, before any reader
(onnx, ONNX Runtime) follows it."""

from __future__ import annotations

import os
import warnings
import zipfile
from pathlib import Path


class ExternalDataRefused(ValueError):
    """An ONNX model whose external data is not a file of its own folder that holds what it declares."""


def data_files(path: str | Path) -> tuple[Path, ...]:
    """The files holding `path`'s external data, each once, in the order of their locations; ()
    for a model with all its weights inside, and for a file that is not an ONNX model (a zip
    archive: a checkpoint, fixed states). ExternalDataRefused for a location outside the folder."""
    import onnx
    from onnx.external_data_helper import _get_all_tensors, uses_external_data

    path = Path(path)
    if zipfile.is_zipfile(path):
        return ()
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception:  # noqa: BLE001 -- not an ONNX model: it has no external data; its reader says what it is
        return ()
    folder = path.parent
    found: dict[str, Path] = {}
    for tensor in _get_all_tensors(model):
        if uses_external_data(tensor):
            location = _checked(path, tensor)
            found.setdefault(location, folder / location)
    return tuple(found[location] for location in sorted(found))


def _checked(model: Path, tensor) -> str:
    """The location of `tensor`'s data, normalised, once it is checked to lie in `model`'s folder
    and to hold the bytes it declares."""
    from onnx.external_data_helper import ExternalDataInfo

    def refused(location: str, problem: str, fix: str = "; keep the model's data files beside it, in its folder"
                ) -> ExternalDataRefused:
        return ExternalDataRefused(f"{model}: external data {location!r} of tensor {tensor.name!r} {problem}{fix}")

    given = next((entry.value for entry in tensor.external_data if entry.key == "location"), "")
    try:
        with warnings.catch_warnings():  # a key onnx does not know: onnx's loader ignores it too
            warnings.simplefilter("ignore")
            info = ExternalDataInfo(tensor)
    except ValueError as exc:
        raise refused(given, f"has an offset or length that is not a byte count ({exc})", "") from None
    if not info.location:
        raise refused(given, "names no file")
    if os.path.isabs(info.location):
        raise refused(info.location, "is an absolute path")
    location = os.path.normpath(info.location)
    if location == os.pardir or location.startswith(os.pardir + os.sep):
        raise refused(info.location, "leads out of the model's folder")
    folder = model.parent
    file = folder / location
    if not os.path.lexists(file):
        raise refused(info.location, "is missing: no such file beside the model")
    real = Path(os.path.realpath(file))
    if not real.is_relative_to(os.path.realpath(folder)):
        raise refused(info.location, f"resolves to {str(real)!r}, outside the model's folder")
    if not real.is_file():
        raise refused(info.location, "is not a regular file")
    size, offset = real.stat().st_size, info.offset or 0
    end = offset + (info.length if info.length is not None else 0)
    if offset > size or end > size:
        declared = f"bytes {offset} to {end}" if info.length is not None else f"an offset of {offset}"
        raise refused(info.location, f"declares {declared}, but the file holds {size} bytes", "")
    return Path(location).as_posix()
