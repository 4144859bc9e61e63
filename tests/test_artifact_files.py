"""Files written whole, published under a lock, and checked at every load.

A failed write or check leaves the old file and no temporary file; a reader beside the
project's own quantizer rewriting one path never loads a partial file; a second run that
wants a path another run writes is refused in one line naming that run, and the first stores
only rows about the file it wrote; a file put at an input's path after a run started is
refused at load with both hashes, before any row about it is stored."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import onnx
import onnxruntime as ort
import pytest
from rich.console import Console
from rich.progress import Progress
from tiny_onnx import no_float_ops_model, tiny_model, tiny_weights

from breakout_core.common.files import FileReplaced, same_file, write_whole, written_whole
from breakout_core.common.hashing import file_sha256
from breakout_core.conversion.quantize import QuantizeError, quantize_int8
from runner.kinds.shared.runtime_status import runtime_sections
from runner.run.artifact_files import RunFiles
from runner.run.context import RunContext
from runner.run.errors import ArtifactBusy, ArtifactChanged
from runner.run.output_locks import lock_file
from runner.spec.document import load_spec
from runner.store.database import Store

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models" / "reference"
TESTS = Path(__file__).resolve().parent


def _leftovers(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.name.endswith(".tmp")]


def test_a_failed_write_leaves_the_old_file_and_no_temporary_file(tmp_path):
    target = write_whole(tmp_path / "model.onnx", b"old bytes")
    with pytest.raises(ValueError, match="the check failed"), written_whole(target) as partial:
        partial.write_bytes(b"new bytes, half checked")
        raise ValueError("the check failed")
    assert target.read_bytes() == b"old bytes" and _leftovers(tmp_path) == []


def test_a_failed_quantization_leaves_the_old_int8_file_as_it_was(tmp_path):
    """The quantizer used to write the target itself and remove it when a check failed."""
    target = tmp_path / "int8.onnx"
    first = quantize_int8(tiny_model(tmp_path / "fp32.onnx"), target, method="dynamic")
    with pytest.raises(QuantizeError, match="no float op"):
        quantize_int8(no_float_ops_model(tmp_path / "nothing.onnx"), target, method="dynamic")
    assert file_sha256(target) == first.sha256 and _leftovers(tmp_path) == []


WRITER = """
import sys
from pathlib import Path
from breakout_core.conversion.quantize import quantize_int8
source, target, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
for i in range(n):
    made = quantize_int8(source, target, method="dynamic", per_channel=bool(i % 2))
    print(made.sha256, flush=True)
"""


def test_a_reader_beside_the_quantizer_rewriting_a_path_never_loads_a_partial_file(tmp_path):
    source = tiny_model(tmp_path / "fp32.onnx", tiny_weights(3))
    target = tmp_path / "out" / "int8.onnx"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(source), str(target), "6"], cwd=REPO,
                              stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    loads, failures, seen = 0, [], set()
    while writer.poll() is None:
        if not target.exists():
            time.sleep(0.005)
            continue
        try:
            data = target.read_bytes()
            ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        except Exception as exc:  # noqa: BLE001 -- any failure to load is what this test looks for
            failures.append(f"{len(data)} bytes: {' '.join(str(exc).split())[:120]}")
            continue
        loads += 1
        seen.add(hashlib.sha256(data).hexdigest())
    written = set(writer.stdout.read().split())
    assert writer.returncode == 0
    assert loads > 0 and failures == [], failures[:3]
    assert seen <= written, "a reader loaded a file no write made"
    assert len(written) == 2 and _leftovers(tmp_path) == []


SPEC = """\
name: shared_path
contract: {{name: breakout-v3}}
artifacts:
  fixed_states: {{path: {states}}}
  onnx_fp32: {{path: {fp32}}}
  int8: {{path: out/int8.onnx, made_by: shared_path, precision: int8}}
runtimes:
  ort_fp32: {{runtime: onnxruntime, intra_op_threads: 1, artifact: onnx_fp32}}
  ort_int8: {{runtime: onnxruntime, intra_op_threads: 1, artifact: int8}}
measurements:
  - kind: export
    name: files
    checkpoint: checkpoint
    int8:
      - {{onnx: int8, source: onnx_fp32, method: dynamic, per_channel: {per_channel}}}
  - kind: parity
    name: parity
    fixed_states: fixed_states
    runtimes: [ort_fp32, ort_int8]
    batch_sizes: [1]
"""


def _spec(folder: Path, name: str, per_channel: bool = True) -> Path:
    fp32 = folder / "dqn_breakout.onnx"
    if not fp32.exists():
        shutil.copyfile(MODELS / "dqn_breakout.onnx", fp32)
        shutil.copyfile(MODELS / "fixed_states_60.npz", folder / "fixed_states.npz")
    text = SPEC.format(states=folder / "fixed_states.npz", fp32=fp32, per_channel=str(per_channel).lower())
    text = text.replace("artifacts:\n", f"artifacts:\n  checkpoint: {{path: {MODELS / 'dqn_breakout.pt'}}}\n")
    path = folder / name
    path.write_text(text)
    return path


def _runner(*args: str, cwd: Path, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "runner", *args], cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kwargs)


def _query(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_a_lock_on_an_output_path_refuses_a_second_holder_by_name_until_it_is_released(tmp_path):
    loaded = load_spec(_spec(tmp_path, "a.yaml"))
    spec, store = loaded.spec, Store(tmp_path / "r.duckdb")
    first = RunFiles("run-a", spec, store, tmp_path / "runs" / "run-a", ["int8"], loaded.folders)
    second = RunFiles("run-b", spec, store, tmp_path / "runs" / "run-b", ["int8"], loaded.folders)
    with first.locked():
        with pytest.raises(ArtifactBusy) as refused, second.locked():
            pass
        assert str(refused.value) == (f"artifacts.int8: {tmp_path / 'out' / 'int8.onnx'} is being written by run "
                                      f"run-a (pid {os.getpid()} on {socket.gethostname()}); wait for it to end, or "
                                      "give this artifact another path")
    with second.locked():  # released when the first run ended
        assert json.loads(lock_file(tmp_path.resolve() / "out" / "int8.onnx").read_text())["run_id"] == "run-b"
    assert not lock_file(tmp_path.resolve() / "out" / "int8.onnx").exists(), "a released lock leaves no file"
    assert list((tmp_path / "out").iterdir()) == [], "nothing is written beside the output"


@pytest.mark.slow
def test_a_second_run_on_a_path_another_run_writes_is_refused_in_one_line(tmp_path):
    first = _runner("run", str(_spec(tmp_path, "a.yaml")), "--db", "a.duckdb", "--no-report", "--json",
                    cwd=tmp_path)
    lock = lock_file(tmp_path.resolve() / "out" / "int8.onnx")
    deadline = time.monotonic() + 120
    while not (lock.exists() and lock.read_text()) and first.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    holder = json.loads(lock.read_text())["run_id"]
    os.kill(first.pid, signal.SIGSTOP)  # the first run holds the path while the second starts
    try:
        second = _runner("run", str(_spec(tmp_path, "b.yaml", per_channel=False)), "--db", "b.duckdb",
                         "--no-report", cwd=tmp_path)
        out, err = second.communicate(timeout=120)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    assert second.returncode == 3, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert f"out/int8.onnx is being written by run {holder}" in err and err.startswith("error: artifacts.int8:")
    b_db = tmp_path / "b.duckdb"
    assert not b_db.exists() or _query(b_db, "SELECT count(*) FROM runs") == [(0,)], "the refused run stored nothing"

    out, err = first.communicate(timeout=300)
    assert first.returncode == 0, err[-2000:]
    document = json.loads(out)
    written = _query(tmp_path / "a.duckdb", "SELECT sha256 FROM export_files WHERE artifact = 'int8'")[0][0]
    assert file_sha256(tmp_path / "out" / "int8.onnx") == written
    ran = {r["runtime"]: r["artifact_sha256"] for r in document["runtimes"]}
    assert ran == {"ort_fp32": file_sha256(tmp_path / "dqn_breakout.onnx"), "ort_int8": written}
    stored = _query(tmp_path / "a.duckdb", "SELECT runtime, artifact_sha256 FROM runtime_status")
    assert dict(stored) == ran
    own = tmp_path / "runs" / document["run_id"] / "outputs" / "int8" / "int8.onnx"
    assert file_sha256(own) == written, "the run keeps its own copy of what it published"


def _context(tmp_path: Path, spec_path: Path, run_id: str) -> tuple[RunContext, RunFiles]:
    loaded = load_spec(spec_path)
    spec, store = loaded.spec, Store(tmp_path / "r.duckdb")
    store.begin_run({"run_id": run_id, "spec_name": spec.name, "spec_hash": "h", "spec_text": "t", "host": "h"})
    files = RunFiles(run_id, spec, store, tmp_path / "runs" / run_id, [n for n in ("int8",) if n in spec.artifacts],
                     loaded.folders)
    ctx = RunContext(run_id=run_id, spec=spec, contract=spec.contract.build(), store=store,
                     reports_dir=tmp_path / "reports", progress=Progress(console=Console(quiet=True)),
                     artifacts_dir=tmp_path / "runs" / run_id, files=files)
    return ctx, files


def test_an_input_replaced_after_the_run_started_is_refused_at_load_with_both_hashes(tmp_path):
    from runner.kinds.registry import KINDS

    ctx, files = _context(tmp_path, _spec(tmp_path, "a.yaml"), "r1")
    fp32 = tmp_path / "dqn_breakout.onnx"
    files.record_inputs(resume=False)
    recorded = file_sha256(fp32)
    model = onnx.load(fp32)
    model.doc_string = "another file at the same path"
    write_whole(fp32, model.SerializeToString())
    parity = next(m for m in ctx.spec.measurements if m.kind == "parity")
    with pytest.raises(ArtifactChanged) as refused:
        KINDS["parity"].execute(parity, ctx)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"artifacts.onnx_fp32 ({fp32}): runtime ort_fp32 loaded")
    assert f"sha256 {file_sha256(fp32)[:12]}" in message and f"recorded at its start sha256 {recorded[:12]}" in message
    assert _query(tmp_path / "r.duckdb", "SELECT count(*) FROM runtime_status") == [(0,)]
    assert _query(tmp_path / "r.duckdb", "SELECT count(*) FROM parity_q") == [(0,)]


def test_an_output_replaced_after_the_run_published_it_is_refused_at_load(tmp_path):
    from runner.kinds.registry import KINDS

    ctx, files = _context(tmp_path, _spec(tmp_path, "a.yaml"), "r1")
    files.record_inputs(resume=False)
    with files.locked():
        written = quantize_int8(tmp_path / "dqn_breakout.onnx", files.output_path("int8"), method="dynamic")
        files.publish("int8", written.path, written.sha256)
        other = quantize_int8(tmp_path / "dqn_breakout.onnx", tmp_path / "other.onnx", method="dynamic",
                              per_channel=False)  # what another writer, outside any run, put there
        shutil.copyfile(other.path, tmp_path / "out" / "int8.onnx")
        parity = next(m for m in ctx.spec.measurements if m.kind == "parity")
        with pytest.raises(ArtifactChanged, match=f"loaded sha256 {other.sha256[:12]}, but this run wrote sha256 "
                                                  f"{written.sha256[:12]}"):
            KINDS["parity"].execute(parity, ctx)
    stored = _query(tmp_path / "r.duckdb", "SELECT runtime, artifact_sha256 FROM runtime_status")
    assert stored == [("ort_fp32", file_sha256(tmp_path / "dqn_breakout.onnx"))]
    with ctx.store.reader() as con:  # the report's runtime table shows the sha256 each runtime ran
        (section,) = runtime_sections(con, "r1", "parity")
    assert stored[0][1][:12] in section.html and "artifact_sha256" in section.html


def test_a_checkpoint_policy_replaced_after_the_run_started_is_refused_before_it_plays(tmp_path):
    from runner.kinds.registry import KINDS

    checkpoint = tmp_path / "agent.pt"
    shutil.copyfile(MODELS / "dqn_breakout.pt", checkpoint)
    spec_path = tmp_path / "evaluate.yaml"
    spec_path.write_text(f"name: evaluate_agent\ncontract: {{name: breakout-v3}}\n"
                         f"policies:\n  agent: {{type: checkpoint, path: {checkpoint}}}\n"
                         "measurements:\n  - {kind: evaluate, name: games, policies: [agent], seeds: [5], "
                         "batch_size: 1}\n")
    ctx, files = _context(tmp_path, spec_path, "r1")
    files.record_inputs(resume=False)
    recorded = file_sha256(checkpoint)
    write_whole(checkpoint, checkpoint.read_bytes() + b"another file")
    with pytest.raises(ArtifactChanged, match=rf"^policies\.agent \({checkpoint}\): measurement games loaded sha256 "
                                              rf"{file_sha256(checkpoint)[:12]}, but this run recorded at its start "
                                              rf"sha256 {recorded[:12]}"):
        KINDS["evaluate"].execute(ctx.spec.measurements[0], ctx)
    assert _query(tmp_path / "r.duckdb", "SELECT count(*) FROM episodes") == [(0,)]


def test_a_resumed_run_holds_its_inputs_to_the_hashes_its_first_start_recorded(tmp_path):
    ctx, files = _context(tmp_path, _spec(tmp_path, "a.yaml"), "r1")
    files.record_inputs(resume=False)
    states = tmp_path / "fixed_states.npz"
    recorded = file_sha256(states)
    write_whole(states, states.read_bytes() + b"\0")  # changed between the interruption and the resume
    resumed = RunFiles("r1", ctx.spec, ctx.store, tmp_path / "runs" / "r1", ["int8"], files.folders)
    resumed.record_inputs(resume=True)
    assert resumed.expected["fixed_states"] == recorded
    with pytest.raises(ArtifactChanged, match=f"recorded at its start sha256 {recorded[:12]}"), \
            resumed.loaded("fixed_states", "the fixed states"):
        pass


def test_a_file_replaced_while_it_is_read_is_not_taken_for_the_one_hashed(tmp_path):
    path = write_whole(tmp_path / "model.onnx", b"first")
    with pytest.raises(FileReplaced, match="replaced by another file while it was read"), same_file(path):
        file_sha256(path)
        write_whole(path, b"second")
