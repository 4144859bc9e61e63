"""Run ids and names as people type them, and tables that fit a 100-column terminal: unique
prefixes, ambiguity listed, "did you mean", `runs` filters, `--version`, progress units."""

from __future__ import annotations

import re
from importlib.metadata import version
from io import StringIO
from pathlib import Path

import pytest
from click.testing import CliRunner
from gate_specs import gate_runs

from runner.cli.commands import main
from runner.store.database import Store

REPO = Path(__file__).resolve().parent.parent
ANSI = re.compile(r"\x1b\[[0-9;]*m")
NARROW = {"TTY_COMPATIBLE": "1", "COLUMNS": "100", "NO_COLOR": "1"}  # a terminal of 100 columns


@pytest.fixture(scope="module")
def gate(tmp_path_factory) -> tuple[Path, str, str]:
    db, rejected, worthy = gate_runs(tmp_path_factory.mktemp("gate"))
    store = Store(db)  # a third run, of another spec, that failed
    store.begin_run({"run_id": "20250101-000000-abcdef", "spec_name": "broken_spec", "spec_hash": "h",
                     "spec_text": "name: broken_spec", "host": "h"})
    store.finish_run("20250101-000000-abcdef", "failed", "RuntimeError: the runtime crashed")
    return db, rejected, worthy


def _cli(*args: str, env: dict | None = None):
    return CliRunner().invoke(main, list(args), env=env)


def _refused(result, *mentions: str) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for mention in mentions:
        assert mention in lines[0], (mention, lines[0])
    return lines[0]


def test_a_unique_prefix_or_hex_part_names_the_run(gate, tmp_path):
    db, rejected, _ = gate
    for typed in (rejected[:-2], rejected.split("-")[-1][:4], rejected):
        result = _cli("report", typed, "--db", str(db), "--reports", str(tmp_path))
        assert result.exit_code == 0, (typed, result.output)
        assert rejected in result.output


def test_an_ambiguous_prefix_lists_the_runs_it_begins(gate, tmp_path):
    db, rejected, worthy = gate
    common = rejected[:8]  # the day both gate runs began
    assert worthy.startswith(common)
    _refused(_cli("report", common, "--db", str(db), "--reports", str(tmp_path)), "ambiguous", rejected, worthy)
    _refused(_cli("compare", common, worthy, "--db", str(db), "--no-report"), "ambiguous")


def test_did_you_mean_for_run_ids_and_spec_names(gate, tmp_path):
    db, rejected, _ = gate
    typo = rejected[:-1] + ("0" if rejected[-1] != "0" else "1")
    _refused(_cli("report", typo, "--db", str(db), "--reports", str(tmp_path)), f"no run {typo!r}",
             f"did you mean {rejected}")
    _refused(_cli("compare", "--spec", "perturbed", "--db", str(db)), "no run of spec 'perturbed'",
             "did you mean perturbed_gate")
    line = _refused(_cli("runs", "--spec", "gate", "--db", str(db)), "did you mean")
    assert "perturbed_gate" in line and "reference_gate" in line
    _refused(_cli("report", "--spec", "nothing_like_it", "--db", str(db)), "no run of spec 'nothing_like_it'")


def test_did_you_mean_for_a_spec_file(monkeypatch):
    monkeypatch.chdir(REPO)
    _refused(_cli("run", "day24"), "day24: no such file", "did you mean specs/day24_ort_latency.yaml")
    _refused(_cli("run", "specs/quickstrat.yaml"), "did you mean specs/quickstart.yaml")


def test_runs_filters_by_spec_and_status(gate):
    db, rejected, worthy = gate
    listed = _cli("runs", "--db", str(db))
    assert listed.exit_code == 0 and "3 run(s)" in listed.output
    failed = _cli("runs", "--status", "failed", "--db", str(db))
    assert "broken_spec" in failed.output and rejected not in failed.output and "1 run(s)" in failed.output
    of_spec = _cli("runs", "--spec", "perturbed_gate", "--status", "done", "--db", str(db))
    assert rejected in of_spec.output and worthy not in of_spec.output and "1 run(s)" in of_spec.output
    assert "0 run(s)" in _cli("runs", "--spec", "perturbed_gate", "--status", "failed", "--db", str(db)).output
    wrong = _cli("runs", "--status", "finished", "--db", str(db))  # click's usage error: exit 2 as well
    assert wrong.exit_code == 2 and "'finished' is not one of" in wrong.output


def test_runs_fit_100_columns_without_folding_a_run_id(gate):
    db, rejected, worthy = gate
    result = _cli("runs", "--db", str(db), env=NARROW)
    text = ANSI.sub("", result.output)
    assert result.exit_code == 0 and all(len(line) <= 100 for line in text.splitlines()), text
    for run_id in (rejected, worthy, "20250101-000000-abcdef"):
        assert run_id in text, text  # whole, on one line
    header = next(line for line in text.splitlines() if "run_id" in line)
    assert "took" in header and "verdicts" in header
    assert "20250101-000000-abcdef: RuntimeError: the runtime crashed" in text
    row = next(line for line in text.splitlines() if rejected in line)
    assert re.search(r"\d+\.\d s", row) and "1 rejected" in row
    assert "1 deployment-worthy" in text


def test_verdicts_table_keeps_outcomes_and_run_ids_whole(gate, tmp_path):
    db, rejected, worthy = gate
    result = _cli("report", "--verdicts", "--db", str(db), "--reports", str(tmp_path), env=NARROW)
    text = ANSI.sub("", result.output)
    assert result.exit_code == 0 and all(len(line) <= 100 for line in text.splitlines()), text
    for whole in ("deployment-worthy", rejected, worthy):
        assert whole in text, text


def test_version_and_a_readable_pace():
    assert _cli("--version").output.strip() == f"runner, version {version('breakout-runner')}"
    help_text = _cli("play", "--help").output
    assert "66.67" in help_text and "66.666" not in help_text


def test_progress_bars_count_in_their_own_unit():
    from rich.console import Console

    from runner.run.progress import run_progress

    out = StringIO()
    progress = run_progress(Console(file=out, width=200, force_terminal=False))
    with progress:
        series = progress.add_task("latency", total=20, unit="series")
        episodes = progress.add_task("evaluate", total=4, unit="episodes")
        training = progress.add_task("train", total=512, unit="transitions")
        progress.update(series, completed=20)
        progress.update(episodes, completed=4, transitions=812)
        progress.update(training, completed=512, transitions=512)
    lines = {line.split()[0]: " ".join(line.split()) for line in out.getvalue().splitlines() if line.strip()}
    assert "20/20 series 0:00" in lines["latency"] and "transitions" not in lines["latency"]
    assert "4/4 episodes 812 transitions" in lines["evaluate"]
    assert "512/512 transitions 0:00" in lines["train"] and lines["train"].count("transitions") == 1
