"""A run's artifact files: which bytes it read and wrote, and no other run's bytes in its rows.

- Outputs: before a run stores anything it locks every path its measurements write (an OS
  lock in the runner's own lock folder, naming the run: runner.run.output_locks), and holds
  the locks until it ends; a second run that wants one of those paths is refused in one line
  naming the run that holds it. A kind writes each file under the run's own folder
  (`runs/<run_id>/outputs/<artifact>/`) and publishes it to the spec's path in one rename
  (breakout_core.common.files.publish), into the folder that path resolved to when the spec
  was checked: a folder swapped for a link since fails the run, nothing published.
- Inputs: as the run starts, the sha256 of every artifact it reads and does not write, and
  of every checkpoint policy's file (as `policies.NAME`), is recorded (the store's
  `run_files`; a resumed run goes on with the hashes its first start recorded).
- An ONNX model with external data is one row: its content hash over the model file and every
  data file beside it (breakout_core.common.hashing.model_sha256), its bytes theirs together;
  a data file rewritten is that artifact's hash changed.
- Loads: every load of an artifact is checked against the hash this run recorded for it
  (an output's when it was published, an input's at the start); another file is refused
  before any row about it is stored, and the run fails with one line naming both hashes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from breakout_core.common.files import NoSpaceLeft, is_no_space, publish, same_file
from breakout_core.common.hashing import model_sha256
from runner.run.errors import ArtifactBusy, ArtifactChanged
from runner.run.output_locks import HeldLock, hold


class RunFiles:
    """The artifact files of one run: the locks on its outputs, the hashes it holds them to.
    `folders`: each artifact's folder as it resolved when the spec was checked (LoadedSpec.folders)."""

    def __init__(self, run_id: str, spec, store, folder: Path, outputs: list[str], folders: dict[str, Path]):
        self.run_id, self.spec, self.store, self.folder = run_id, spec, store, Path(folder)
        self.outputs = list(dict.fromkeys(outputs))
        self.folders = dict(folders)
        self.expected: dict[str, str] = {}  # artifact name -> the sha256 this run holds it to
        self._locks: list[HeldLock] = []

    # -- outputs ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self) -> Iterator["RunFiles"]:
        """Hold the lock of every output path until the block ends (refused: ArtifactBusy)."""
        try:
            for name in self.outputs:
                path = Path(self.spec.artifacts[name].path)
                self._made_folder(name, path)
                self._locks.append(hold(name, path, self.folders[name] / path.name, self.run_id))
            yield self
        finally:
            for lock in self._locks:
                lock.release()
            self._locks.clear()

    def _made_folder(self, name: str, path: Path) -> None:
        """Make the folder output `path` is published to (as it resolved when the spec was
        checked): one that cannot be made or written refuses the run before it stores anything."""
        folder = self.folders[name]
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            if is_no_space(exc):
                raise NoSpaceLeft(folder) from None
            raise ArtifactBusy(f"artifacts.{name}: cannot write {path} (its folder {folder}: "
                               f"{exc.strerror or exc})") from None
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ArtifactBusy(f"artifacts.{name}: cannot write {path} (its folder {folder}: not writable)")

    def output_path(self, name: str) -> Path:
        """Where this run writes artifact `name` before publishing it: under its own folder."""
        return self.folder / "outputs" / name / Path(self.spec.artifacts[name].path).name

    def readable_path(self, name: str) -> Path:
        """The file to read for artifact `name`: this run's own copy where it wrote one."""
        own = self.output_path(name)
        return own if name in self.outputs and own.is_file() else Path(self.spec.artifacts[name].path)

    def publish(self, name: str, written: Path, sha256: str) -> Path:
        """Put this run's file for `name` at the spec's path in one rename; `sha256` (of the
        bytes written) is what every later load of it is held to."""
        if name not in self.outputs:
            raise ValueError(f"artifacts.{name} is not an output of this spec: it is not written")
        if (now := model_sha256(written)) != sha256:
            raise ArtifactChanged(f"artifacts.{name}: {written} has sha256 {now[:12]}, not the {sha256[:12]} this "
                                  "run wrote; nothing is published")
        target = publish(written, self.spec.artifacts[name].path, self.folders[name])
        self._record(name, "output", target, sha256, _bytes(written))
        return target

    # -- inputs and loads ---------------------------------------------------------------------
    def record_inputs(self, resume: bool) -> None:
        """Hash every artifact this run reads and does not write, as it starts (a resumed run
        takes back the hashes it recorded before, inputs and published outputs alike)."""
        if resume:
            with self.store.reader() as con:
                self.expected.update(con.execute("SELECT artifact, sha256 FROM run_files WHERE run_id = ? "
                                                 "ORDER BY recorded_at", [self.run_id]).fetchall())  # latest last
        for name, path in self._files().items():
            if name in self.outputs or name in self.expected or not path.is_file():
                continue
            with same_file(path):
                sha256, size = model_sha256(path), _bytes(path)
            self._record(name, "input", path, sha256, size)

    def check(self, name: str, sha256: str, what: str) -> None:
        """Refuse `sha256`, what `what` loaded for artifact `name`, unless it is the one this run
        holds that artifact to; an artifact with none yet (a file that did not exist when the
        run started) is held from now on to the first file loaded."""
        expected, path = self.expected.get(name), self._files()[name]
        if expected is None:
            self._record(name, "input", path, sha256, _bytes(path) if path.is_file() else 0)
        elif expected != sha256:
            role = "wrote" if name in self.outputs else "recorded at its start"
            where = name if name.startswith("policies.") else f"artifacts.{name}"
            raise ArtifactChanged(
                f"{where} ({path}): {what} loaded sha256 {sha256[:12]}, but this run {role} sha256 {expected[:12]}: "
                "another file was put at that path, or other external data beside it; no row about it is stored")

    @contextlib.contextmanager
    def loaded(self, name: str, what: str) -> Iterator[tuple[Path, str]]:
        """(path, sha256) of artifact `name`, checked; everything the block reads from the path is
        that one file (breakout_core.common.files.FileReplaced otherwise)."""
        path = self.readable_path(name) if name in self.spec.artifacts else self._files()[name]
        with same_file(path):
            sha256 = model_sha256(path)
            self.check(name, sha256, what)
            yield path, sha256

    def _files(self) -> dict[str, Path]:
        """Every file the spec names: its artifacts by name, its checkpoint policies as `policies.NAME`."""
        files = {name: Path(artifact.path) for name, artifact in self.spec.artifacts.items()}
        files.update({f"policies.{name}": Path(policy.path) for name, policy in self.spec.policies.items()
                      if getattr(policy, "path", None)})
        return files

    def _record(self, name: str, role: str, path: Path, sha256: str, size: int) -> None:
        from runner.store.database import utcnow

        self.expected[name] = sha256
        self.store.append_rows("run_files", [{"run_id": self.run_id, "artifact": name, "role": role,
                                              "path": str(path), "sha256": sha256, "bytes": size,
                                              "recorded_at": utcnow()}])


def _bytes(path: Path) -> int:
    """The size of a file with its external data files, if any."""
    from breakout_core.common.external_data import data_files

    return sum(file.stat().st_size for file in (Path(path), *data_files(path)))
