"""Hostile or unusual ONNX files handed to `runner check`, `runner check --json` and `runner convert`:
each is one `error:` line naming the file and what is wrong, exit 2, nothing on stdout, nothing
stored, within seconds. The matrix runs each command as a process of its own (a traceback would
show there), so it is marked slow; the direct tests beside it are not."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from hostile_onnx import (
    declared_2gib_onnx,
    empty_onnx,
    fixed_batch_onnx,
    nan_onnx,
    no_outputs_onnx,
    sequence_input_onnx,
    text_onnx,
    truncated_onnx,
)
from test_cli_inputs import assert_one_line_usage_error, cli

from breakout_core.conversion.export import inspect_onnx
from breakout_core.conversion.onnx_checks import ModelCheckError
from runner.cli.check_inputs import onnx_file_problem

HOSTILE = {  # what each file is, and what its one line must say
    "empty": (empty_onnx, "the file is empty, not an ONNX model"),
    "text": (text_onnx, "not an ONNX model"),
    "truncated": (truncated_onnx, "not an ONNX model"),
    "no-outputs": (no_outputs_onnx, "1 input(s) and 0 output(s) in all"),
    "sequence-input": (sequence_input_onnx, "obs: not a tensor"),
    "declared-2gib": (declared_2gib_onnx, "declares the shape (171520, 3136) (2 GiB) but holds 6.12 MiB"),
    "batch-2^40": (lambda path: fixed_batch_onnx(path, 2**40), "its batch dimension is fixed at 1099511627776"),
    "nan": (nan_onnx, "the model gives NaN Q-values (nan, nan, nan, nan) on fixed state 0 of 60"),
}
COMMANDS = {"check": ("check",), "check-json": ("check", "--json"), "convert": ("convert", "int8")}


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_file_is_one_line_and_exit_2_from_every_command(tmp_path, name, command):
    make, mention = HOSTILE[name]
    model = make(tmp_path / f"{name}.onnx")
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "runner", *COMMANDS[command], model.name, "--db", "r.duckdb"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert time.monotonic() - started < 60
    assert done.stdout == "" and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert_one_line_usage_error(done, f"MODEL {model.name}: ", mention)
    assert not (tmp_path / "r.duckdb").exists()


def test_a_tensor_declaring_more_than_it_holds_is_refused_before_it_is_read(tmp_path):
    model = declared_2gib_onnx(tmp_path / "big.onnx")
    assert HOSTILE["declared-2gib"][1] in onnx_file_problem(model)
    result = cli("convert", "int8", model.name, "--db", "r.duckdb", cwd=tmp_path)  # it read the tensor: a traceback
    assert_one_line_usage_error(result, "MODEL big.onnx: not an ONNX model that can be read (tensor 'head.0.weight'")
    assert not (tmp_path / "r.duckdb").exists()


def test_inspecting_a_file_that_is_not_a_model_says_so_in_one_line(tmp_path):
    with pytest.raises(ModelCheckError, match=r"text\.onnx: not a readable ONNX model \(") as raised:
        inspect_onnx(text_onnx(tmp_path / "text.onnx"))
    assert "\n" not in str(raised.value)
    assert "obs: not a tensor" in onnx_file_problem(sequence_input_onnx(tmp_path / "sequence.onnx"))
