"""A run writes no file through a link planted in its way, and publishes into no folder but the
one its output's path resolved to when the spec was checked.

The attacks, end to end through `runner run` on a cheap spec (one dynamic INT8 export): a link,
a FIFO or a dangling link where an output's lock file was once kept (beside the output) or
where it is kept now (the runner's lock folder), a link at the output itself, and the output's
folder swapped for a link to another folder while the run works. Each leaves every file
outside the run's outputs byte-identical; where the run cannot go on it is refused in one line."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from breakout_core.common.files import FolderMoved, publish
from runner.run.artifact_files import RunFiles
from runner.run.errors import ArtifactBusy
from runner.run.output_locks import LOCK_DIR_ENV, lock_file
from runner.spec.document import load_spec
from runner.store.database import Store

REPO = Path(__file__).resolve().parents[1]
MODELS = REPO / "models" / "reference"
SPEC = """\
name: attack
contract: {{name: breakout-v3}}
artifacts:
  checkpoint: {{path: {checkpoint}}}
  onnx_fp32: {{path: fp32.onnx}}
  int8: {{path: out/dyn.onnx, made_by: attack, precision: int8}}
measurements:
  - kind: export
    name: files
    checkpoint: checkpoint
    int8:
      - {{onnx: int8, source: onnx_fp32, method: dynamic}}
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch) -> Path:
    """A spec folder with the spec, its FP32 source and a victim: a 6.7 MB ONNX file a link may point at."""
    site = tmp_path / "site"
    (site / "out").mkdir(parents=True)
    (site / "spec.yaml").write_text(SPEC.format(checkpoint=MODELS / "dqn_breakout.pt"))
    for name in ("fp32.onnx", "victim.onnx"):
        shutil.copyfile(MODELS / "dqn_breakout.onnx", site / name)
    (site / "shipped").mkdir()
    (site / "shipped" / "dyn.onnx").write_bytes(b"a shipped model, not this run's to replace")
    monkeypatch.setenv(LOCK_DIR_ENV, str(tmp_path / "locks"))
    return site


def _snapshot(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    """Every entry under `folder` but `skip`: a file's sha256, a link's target, a FIFO as such."""
    found = {}
    for path in sorted(folder.rglob("*")):
        name = str(path.relative_to(folder))
        if name.startswith(skip) or path.is_dir() and not path.is_symlink():
            continue
        if path.is_symlink():
            found[name] = f"link to {os.readlink(path)}"
        elif path.is_fifo():
            found[name] = "fifo"
        else:
            found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


OUTPUTS = ("site/out/dyn.onnx", "site/runs", "site/r.duckdb")  # what the run itself writes, under tmp_path


def _run(site: Path, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-m", "runner", "run", "spec.yaml", "--db", "r.duckdb", "--no-report",
                             "--runs-dir", "runs"], cwd=site, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, **kwargs)


def _finished(site: Path) -> tuple[int, str]:
    done = _run(site)
    _, err = done.communicate(timeout=300)
    return done.returncode, err


def _one_line_refusal(code: int, err: str, told: str) -> None:
    """Exit 3 and one line of error, `told` in it, after whatever the run's log said."""
    assert code == 3, err[-2000:]
    errors = [line for line in err.splitlines() if "error" in line.lower()]
    assert "Traceback" not in err and len(errors) == 1 and err.endswith(errors[0] + "\n"), err[-2000:]
    assert errors[0].startswith("error: ") and told in errors[0], errors[0]


def _plant(kind: str, at: Path, target: Path) -> None:
    at.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if kind == "fifo":
        os.mkfifo(at)
    elif kind == "hard link":
        os.link(target, at)
    else:
        at.symlink_to(target)


# -- fast: the lock and the publish themselves -----------------------------------------------------
@pytest.mark.parametrize("kind", ["link", "dangling", "fifo", "hard link"])
def test_a_link_or_fifo_planted_at_a_lock_file_is_refused_in_one_line_and_followed_never(site, kind):
    loaded = load_spec(site / "spec.yaml")
    output = site.resolve() / "out" / "dyn.onnx"
    lock = lock_file(output)
    _plant(kind, lock, site / ("made.onnx" if kind == "dangling" else "victim.onnx"))
    before = _snapshot(site.parent)
    files = RunFiles("r1", loaded.spec, Store(site / "r.duckdb"), site / "runs" / "r1", ["int8"], loaded.folders)
    with pytest.raises(ArtifactBusy) as refused, files.locked():
        pass
    told = str(refused.value)
    assert "\n" not in told and told.startswith(f"artifacts.int8: cannot lock {site / 'out' / 'dyn.onnx'} for "
                                                f"writing ({lock}: ")
    assert told.endswith({"fifo": "not a plain file)", "hard link": "a hard link to another file)"}.get(
        kind, "a symbolic link, not a lock file)"))
    assert _snapshot(site.parent) == before, "nothing outside the run's outputs changed"
    assert not (site / "made.onnx").exists(), "a dangling link's target is never made"


def test_a_lock_folder_another_user_could_write_is_refused(site, tmp_path):
    loaded = load_spec(site / "spec.yaml")
    (tmp_path / "locks").mkdir(mode=0o777)
    (tmp_path / "locks").chmod(0o777)
    files = RunFiles("r1", loaded.spec, Store(site / "r.duckdb"), site / "runs" / "r1", ["int8"], loaded.folders)
    with pytest.raises(ArtifactBusy, match=f"lock folder {tmp_path / 'locks'} is not a folder of this user's that "
                                           f"only it can write; set {LOCK_DIR_ENV} to another folder"), files.locked():
        pass


def test_an_output_folder_that_cannot_be_made_refuses_the_run_before_it_works(site):
    (site / "out").rmdir()
    (site / "out").write_text("a plain file where the output's folder goes\n")
    loaded = load_spec(site / "spec.yaml")
    files = RunFiles("r1", loaded.spec, Store(site / "r.duckdb"), site / "runs" / "r1", ["int8"], loaded.folders)
    with pytest.raises(ArtifactBusy, match=rf"^artifacts\.int8: cannot write {site / 'out' / 'dyn.onnx'} \(its folder "
                                           rf"{site.resolve() / 'out'}: File exists\)$"), files.locked():
        pass


def test_a_folder_swapped_for_a_link_after_it_was_checked_has_nothing_published_through_it(site):
    checked = (site / "out").resolve()
    written = site / "written.onnx"
    written.write_bytes(b"this run's file")
    (site / "out").rmdir()
    (site / "out").symlink_to(site / "shipped")
    before = _snapshot(site)
    with pytest.raises(FolderMoved) as refused:
        publish(written, site / "out" / "dyn.onnx", checked)
    assert str(refused.value) == (f"{site / 'out'}: now resolves to {(site / 'shipped').resolve()}, not {checked} "
                                  "as when the output's path was checked (swapped for a link?); nothing is "
                                  "published there")
    assert _snapshot(site) == before and sorted(p.name for p in (site / "shipped").iterdir()) == ["dyn.onnx"]


def test_a_link_at_the_output_itself_is_replaced_not_written_through(site):
    (site / "out" / "dyn.onnx").symlink_to(site / "victim.onnx")
    written = site / "written.onnx"
    written.write_bytes(b"this run's file")
    before = _snapshot(site, skip=("out/dyn.onnx",))
    published = publish(written, site / "out" / "dyn.onnx", (site / "out").resolve())
    assert not published.is_symlink() and published.read_bytes() == b"this run's file"
    assert _snapshot(site, skip=("out/dyn.onnx",)) == before


# -- slow: the attacks, end to end through `runner run` ----------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("kind", ["link", "dangling", "fifo"])
def test_what_is_planted_where_lock_files_were_once_kept_is_left_alone_by_a_run(site, kind):
    """`out/.dyn.onnx.lock -> ../victim.onnx` once turned the victim into 64 bytes of JSON."""
    _plant(kind, site / "out" / ".dyn.onnx.lock", Path("../victim.onnx" if kind == "link" else "../made.onnx"))
    before = _snapshot(site.parent, skip=OUTPUTS)
    code, err = _finished(site)
    assert code == 0, err[-2000:]
    assert _snapshot(site.parent, skip=OUTPUTS) == before, "nothing outside the run's outputs changed"
    assert not (site / "made.onnx").exists()
    assert sorted(p.name for p in (site / "out").iterdir()) == [".dyn.onnx.lock", "dyn.onnx"], \
        "no lock file is left beside the output"
    assert os.listdir(site.parent / "locks") == [], "the run's own lock file is gone once it ended"


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["link", "dangling", "fifo"])
def test_what_is_planted_at_the_lock_file_refuses_the_run_in_one_line(site, kind):
    lock = lock_file(site.resolve() / "out" / "dyn.onnx")
    _plant(kind, lock, site / ("victim.onnx" if kind == "link" else "made.onnx"))
    before = _snapshot(site.parent, skip=OUTPUTS)
    code, err = _finished(site)
    _one_line_refusal(code, err, f"error: artifacts.int8: cannot lock out/dyn.onnx for writing ({lock}: ")
    assert _snapshot(site.parent, skip=OUTPUTS) == before
    assert not (site / "made.onnx").exists() and not (site / "out" / "dyn.onnx").exists()


@pytest.mark.slow
def test_a_link_at_the_output_is_replaced_by_the_run_not_written_through(site):
    (site / "out" / "dyn.onnx").symlink_to("../victim.onnx")
    before = _snapshot(site.parent, skip=OUTPUTS)
    code, err = _finished(site)
    assert code == 0, err[-2000:]
    assert _snapshot(site.parent, skip=OUTPUTS) == before
    assert not (site / "out" / "dyn.onnx").is_symlink()


@pytest.mark.slow
def test_an_output_folder_swapped_for_a_link_while_the_run_works_fails_it_and_publishes_nothing(site):
    """The folder checked at load was once swapped for a link, and the INT8 file was published
    through it over a shipped model: run `done`, exit 0."""
    before = _snapshot(site.parent, skip=OUTPUTS)
    lock = lock_file(site.resolve() / "out" / "dyn.onnx")
    run = _run(site)
    deadline = time.monotonic() + 120
    while not (lock.exists() and lock.read_text()) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(run.pid, signal.SIGSTOP)  # checked and locked; the export has not published yet
    try:
        (site / "out").rename(site / "out.moved")
        (site / "out").symlink_to("shipped")
    finally:
        os.kill(run.pid, signal.SIGCONT)
    _, err = run.communicate(timeout=300)
    _one_line_refusal(run.returncode, err, "error: run failed: FolderMoved: out: now resolves to "
                                           f"{(site / 'shipped').resolve()}, not {site.resolve() / 'out'} ")
    assert _snapshot(site.parent, skip=OUTPUTS) == {**before, "site/out": "link to shipped"}
    assert list((site / "out.moved").iterdir()) == []
    assert sorted(p.name for p in (site / "shipped").iterdir()) == ["dyn.onnx"], "no temporary file is left there"


def test_a_link_planted_at_the_database_lock_file_makes_nothing_where_it_points(tmp_path):
    (tmp_path / "r.duckdb.lock").symlink_to(tmp_path / "made.txt")
    store = Store(tmp_path / "r.duckdb")
    with store.writer() as con:
        con.execute("SELECT 1").fetchall()
    assert not (tmp_path / "made.txt").exists() and (tmp_path / "r.duckdb.lock").is_symlink()
