"""Run a validated spec: record the run, execute each measurement, decide its verdicts.

The run row is written first with status 'running' and always closed: 'done', 'failed'
with the error, or 'interrupted' on Ctrl-C / SIGTERM. A run that a full disk failed, wherever
(the database, its spool, checkpoints, exports, reports), fails with `no space left on device:
PATH`, found from the first error the full disk caused; where the full disk keeps even the
failure from being stored, the run stays 'running' and is closed as interrupted later, as a
killed run is. A run killed outright (SIGKILL)
is closed as interrupted by the next process that opens the database for writing: at
once on the same host, and after its heartbeat has been silent for a while anywhere.
"""

from __future__ import annotations

import json
import secrets
import signal
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from breakout_core.game.contract import Contract
from runner.run.errors import ResumeRefused
from runner.spec.document import LoadedSpec, settings_as_written
from runner.store.errors import no_space_left

if TYPE_CHECKING:
    from runner.kinds.train.executors import Executor
    from runner.run.fail_fast import FailFast


class RunInterrupted(KeyboardInterrupt):
    """Raised in the main thread on SIGTERM, so it ends a run like Ctrl-C does."""


@contextmanager
def _sigterm_interrupts():
    def handler(signum, frame):
        raise RunInterrupted(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-") + secrets.token_hex(3)


def run_spec(loaded: LoadedSpec, store, reports_dir: Path, console, *, resume: bool = False,
             runs_dir: Path = Path("runs"), executor: "Executor | None" = None,
             confirm: bool = False, fail_fast: "FailFast | None" = None) -> tuple[str, list[dict]]:
    """Execute every measurement of `loaded`; returns the run id and its verdict rows.

    With `resume`, the latest interrupted or failed run of the same spec text goes on under
    its own run id; each kind skips or continues the work that run already stored. With
    `confirm`, seeds a spec draws come from the confirmation range; a resumed run is held to the
    `confirm` it began with. With `fail_fast`, the run stops at the first rejected gating verdict
    (runner.run.fail_fast). Every path
    the spec's measurements write is locked before anything is stored, until the run ends
    (runner.run.artifact_files)."""
    from runner.kinds.registry import KINDS
    from runner.run.artifact_files import RunFiles

    spec = loaded.spec
    if resume:
        run_id = store.unfinished_run(spec.name, loaded.hash)
        if run_id is None:
            raise ResumeRefused(f"no interrupted or failed run of spec {spec.name!r} with this exact text to resume")
    else:
        run_id = new_run_id()
    files = RunFiles(run_id, spec, store, Path(runs_dir) / run_id,
                     [name for m in spec.measurements for name in KINDS[m.kind].outputs(m)], loaded.folders)
    with files.locked():  # a path another run writes refuses this one here (ArtifactBusy)
        return _run_locked(loaded, store, reports_dir, console, run_id, files, resume, runs_dir, executor, confirm,
                           fail_fast=fail_fast)


def _run_locked(loaded: LoadedSpec, store, reports_dir: Path, console, run_id: str, files, resume: bool,
                runs_dir: Path, executor: "Executor | None", confirm: bool, *,
                fail_fast: "FailFast | None") -> tuple[str, list[dict]]:
    from runner.kinds.registry import KINDS
    from runner.run.context import RunContext
    from runner.run.progress import run_progress
    from runner.run.verdicts import evaluate_verdicts
    from runner.store.heartbeat import Heartbeat
    from runner.store.provenance import provenance

    spec = loaded.spec
    contract = spec.contract.build()
    if resume:
        if problem := _confirm_changed(store, run_id, confirm):
            raise ResumeRefused(problem)
        own = _stored_contract(store, run_id)
        if own.hash != contract.hash:
            console.print(f"run {run_id} goes on under its own contract {own.name} ({own.hash}), not {contract.name} "
                          f"({contract.hash}), what this spec text builds today", highlight=False)
        contract = own
        if changed := _settings_changed_since(store, run_id, settings_as_written(loaded.text)):
            raise ResumeRefused(f"run {run_id} began with other settings than this runner reads from its spec "
                                  f"({'; '.join(changed)}): resume it with the runner that began it, or start anew")
        for measurement in spec.measurements:  # before any of them goes on
            if problem := KINDS[measurement.kind].resume_problem(measurement, store, run_id):
                raise ResumeRefused(problem)
        store.reopen_run(run_id)
    else:
        store.begin_run({
            "run_id": run_id, "spec_name": spec.name, "spec_path": str(loaded.path), "spec_hash": loaded.hash,
            "spec_text": loaded.text, "spec_settings": json.dumps(settings_as_written(loaded.text)),
            "overrides": json.dumps(list(loaded.overrides)) if loaded.overrides else None,
            "contract_hash": contract.hash, "contract": json.dumps(contract.to_dict()), "confirm": confirm,
            **provenance(loaded.path),
        })
    progress = run_progress(console)
    ctx = RunContext(run_id=run_id, spec=spec, contract=contract, store=store,
                     reports_dir=Path(reports_dir), progress=progress,
                     artifacts_dir=Path(runs_dir) / run_id, resume=resume, executor=executor, files=files,
                     confirm=confirm)
    try:
        with Heartbeat(store, run_id):  # stopped before the run's status is set below
            files.record_inputs(resume)  # the sha256 of each file it reads, which every load is held to
            measured: set[str] = set()
            with _sigterm_interrupts(), progress:
                for measurement in fail_fast.order(spec, bool(files.outputs)) if fail_fast else spec.measurements:
                    KINDS[measurement.kind].execute(measurement, ctx)
                    measured.add(measurement.name)
                    if fail_fast and (rejected := fail_fast.stopped_by(store, run_id, spec, measurement.name)):
                        console.print(f"--fail-fast: verdict {rejected} is rejected; the run stops here",
                                      highlight=False)
                        break
            verdicts = evaluate_verdicts(store, run_id, spec, measured)
    except KeyboardInterrupt as exc:
        reason = "interrupted by SIGTERM" if isinstance(exc, RunInterrupted) else "interrupted by the user (Ctrl-C)"
        store.finish_run(run_id, "interrupted", reason)
        raise
    except BaseException as exc:
        full = no_space_left(exc, store.path)
        try:
            store.finish_run(run_id, "failed", str(full) if full else f"{exc.__class__.__name__}: {exc}")
        except Exception:  # noqa: BLE001 -- the disk that failed the run may fail this too: the run's own error is told
            if full is None:
                raise exc from None
        if full is not None:
            raise full from exc
        raise
    store.finish_run(run_id, "done")
    return run_id, verdicts


def _stored_contract(store, run_id: str) -> Contract:
    """The contract a run began under: a resumed run goes on in the same game, whatever the
    defaults of the runner that resumes it (a spec that names no contract takes the default)."""
    with store.reader() as con:
        text, stored_hash = con.execute("SELECT contract, contract_hash FROM runs WHERE run_id = ?",
                                        [run_id]).fetchone()
    contract = Contract(**json.loads(text))
    if contract.hash != stored_hash:
        raise ResumeRefused(f"run {run_id}: its stored contract does not rebuild to its hash {stored_hash}, "
                              "so it cannot be resumed in the same game")
    return contract


def _confirm_changed(store, run_id: str, confirm: bool) -> str | None:
    """Why a run cannot go on with `confirm` (None: it can): it began with the other, or, stored
    before runs kept it, with drawn seeds whose pool says the other."""
    with store.reader() as con:
        began = con.execute("SELECT confirm FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
        if began is None:
            pools = {p for (p,) in con.execute("SELECT DISTINCT pool FROM drawn_seeds WHERE run_id = ?",
                                                [run_id]).fetchall()}
            began = pools == {"confirmation"} if pools else None
    if began is None or began == confirm:
        return None
    then, now = ("with --confirm" if flag else "without --confirm" for flag in (began, confirm))
    return (f"run {run_id} began {then} (its drawn seeds come from the {'confirmation' if began else 'check'} "
            f"range): resume it {then}, not {now}")


def _settings_changed_since(store, run_id: str, now: dict) -> list[str]:
    """Where the settings a run stored as it began differ from `now` (at most three, as
    'path: then → now'); nothing for a run stored before runs kept their settings. The contract
    is left out: a resumed run goes on under the contract it stored, whatever the spec builds."""
    with store.reader() as con:
        stored = con.execute("SELECT spec_settings FROM runs WHERE run_id = ?", [run_id]).fetchone()[0]
    if stored is None:
        return []
    then, changed = (_leaves({k: v for k, v in tree.items() if k != "contract"}) for tree in (json.loads(stored), now))
    paths = sorted(p for p in then.keys() | changed.keys() if then.get(p) != changed.get(p))
    return [f"{p}: {then.get(p)!r} → {changed.get(p)!r}" for p in paths[:3]]


def _leaves(tree, path: str = "") -> dict[str, object]:
    """{dotted path: value} of every leaf of a JSON tree."""
    if isinstance(tree, dict):
        return {k: v for key, child in tree.items()
                for k, v in _leaves(child, f"{path}.{key}" if path else key).items()}
    if isinstance(tree, list):
        return {k: v for i, child in enumerate(tree) for k, v in _leaves(child, f"{path}[{i}]").items()}
    return {path: tree}
