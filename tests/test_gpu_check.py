"""scripts/gpu_check.sh: --dry-run lists its steps without running them (the README's GPU
install, the `gpu` tests, day23/day25/day26 into one database); on a machine without an NVIDIA
GPU it says so in one line and exits 0."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "gpu_check.sh"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60)


def test_dry_run_lists_the_steps_and_runs_none(tmp_path):
    out = _run("--dry-run", "--db", str(tmp_path / "gpu.duckdb"))
    assert out.returncode == 0, out.stderr
    steps = [line for line in out.stdout.splitlines() if not line.startswith("#")]
    readme = (SCRIPT.parents[1] / "README.md").read_text()
    assert steps[:2] == ["pip install -e '.[gpu,test]'",
                         "pip uninstall -y onnxruntime && pip install 'onnxruntime-gpu>=1.20'"]
    assert all(step in readme for step in steps[:2])  # what the README's GPU paragraph installs
    assert steps[2].startswith("pip install --force-reinstall --no-deps torch==2.13.0 ")
    assert steps[3] == "python -m pytest -q -m gpu"
    assert steps[4:] == [f"runner run specs/{name}.yaml --db {tmp_path / 'gpu.duckdb'} --no-report"
                         for name in ("day23_ort_parity", "day25_fp16", "day26_tensorrt")]
    assert not (tmp_path / "gpu.duckdb").exists()


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi: the script would run")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_0():
    out = _run()
    assert out.returncode == 0 and out.stderr == ""
    assert out.stdout.splitlines() == ["gpu_check: no NVIDIA GPU here (nvidia-smi is missing or lists no GPU); "
                                       "nothing to check"]


def test_an_unknown_argument_is_one_line_and_exit_2():
    out = _run("--bogus")
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == ["scripts/gpu_check.sh: unknown argument '--bogus' "
                                       "(usage: scripts/gpu_check.sh [--dry-run] [--db FILE])"]
