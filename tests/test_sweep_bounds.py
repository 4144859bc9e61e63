"""A sweep's size is judged before it is expanded: too many trials, a swept value that is
not a plain value or a short list of them, and a document that is large only once its YAML
aliases are expanded are each refused in one line, at once, by `validate` and by `run`."""

from __future__ import annotations

import time

import pytest
from click.testing import CliRunner

from runner.cli.commands import main
from runner.spec.document import MAX_PROBLEMS, SpecError, load_spec
from runner.spec.sweeps import DEFAULT_MAX_TRIALS, MAX_LISTED_VALUE_ITEMS, MAX_TRIALS_LIMIT
from runner.spec.yaml_source import MAX_EXPANDED_VALUES

TRAIN = """\
name: sweeps
measurements:
  - kind: train
    name: t
    total_transitions: 10000
    sweep:
"""  # the sweep's keys follow, from line 7

# six training fields of twelve values each: 2,985,984 trials from a spec of 1.4 KB
SIX_BY_TWELVE = TRAIN + "".join(
    f"      {field}: [{', '.join(str(start + step * i) for i in range(12))}]\n"
    for field, start, step in (("learning_rate", 0.0001, 0.0001), ("gamma", 0.9, 0.005), ("batch_size", 8, 8),
                               ("train_every", 1, 1), ("epsilon_end", 0.01, 0.01), ("target_sync_every", 1000, 1000)))


def laughs(levels: int = 8, fan_out: int = 5) -> str:
    """A train spec whose one swept value is a "billion laughs": each level aliases the one
    before it `fan_out` times (levels x fan_out aliases, within the loader's alias cap)."""
    lines = ["x0: &a0 [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]"]
    lines += [f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * fan_out)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n" + TRAIN + f"      checkpoint_at: [*a{levels}, *a{levels}]\n"


def _refused(path) -> tuple[list[str], float]:
    start = time.perf_counter()
    with pytest.raises(SpecError) as info:
        load_spec(path)
    return info.value.problems, time.perf_counter() - start


@pytest.mark.parametrize("kind", ["train", "throughput"])
def test_three_million_trials_are_refused_at_once(write_spec, kind):
    path = write_spec(SIX_BY_TWELVE.replace("kind: train", f"kind: {kind}"))
    assert len(SIX_BY_TWELVE) < 1500
    problems, seconds = _refused(path)
    assert problems == [f"{path}:6: measurements[0].sweep: the sweep makes 2,985,984 trials (12 x 12 x 12 x 12 x 12 x "
                        f"12 values), more than max_trials {DEFAULT_MAX_TRIALS:,} (which may be set up to "
                        f"{MAX_TRIALS_LIMIT:,})"]
    assert seconds < 1.0


def test_max_trials_sets_the_cap_up_to_its_maximum(write_spec):
    six = TRAIN + "      batch_size: [16, 32]\n      gamma: [0.9, 0.95, 0.99]\n"
    assert [m.name for m in load_spec(write_spec(six)).spec.measurements] == ["t"]  # 6 trials: within the default
    capped = write_spec(six.replace("    sweep:\n", "    max_trials: 4\n    sweep:\n"))
    assert _refused(capped)[0] == [f"{capped}:7: measurements[0].sweep: the sweep makes 6 trials (2 x 3 values), "
                                   f"more than max_trials 4 (which may be set up to {MAX_TRIALS_LIMIT:,})"]
    spec = load_spec(write_spec(six.replace("    sweep:\n", "    max_trials: 6\n    sweep:\n"))).spec
    assert spec.measurements[0].max_trials == 6
    beyond = write_spec(six.replace("    sweep:\n", f"    max_trials: {MAX_TRIALS_LIMIT + 1}\n    sweep:\n"))
    assert _refused(beyond)[0] == [f"{beyond}:6: measurements[0].max_trials: Input should be less than or equal to "
                                   f"{MAX_TRIALS_LIMIT}"]


def test_an_aliased_sweep_value_is_refused_at_once(write_spec):
    """8 levels of 5 aliases (40, within the alias cap) make 8.8 million values of 1.3 KB."""
    path = write_spec(laughs())
    problems, seconds = _refused(path)
    assert problems == [f"{path}:16: 8,789,063 values once its YAML aliases are expanded, more than the "
                        f"{MAX_EXPANDED_VALUES:,} a spec may hold"]
    assert seconds < 1.0


def test_a_swept_value_is_a_plain_value_or_a_short_list(write_spec):
    small = write_spec(laughs(levels=1, fan_out=10))  # 100 values once expanded: within the document's cap
    # an aliased value is placed where its anchor is written (line 2, the list of 100 values)
    assert _refused(small)[0][0] == (f"{small}:2: measurements[0].sweep.checkpoint_at[0]: sweep 'checkpoint_at': "
                                     f"a swept list holds at most {MAX_LISTED_VALUE_ITEMS} plain values")
    nested = write_spec(TRAIN + "      checkpoint_at: [[1000, [2000]]]\n")
    assert _refused(nested)[0] == [f"{nested}:7: measurements[0].sweep.checkpoint_at[0]: sweep 'checkpoint_at': a "
                                   f"swept list holds at most {MAX_LISTED_VALUE_ITEMS} plain values"]
    mapping = write_spec(TRAIN + "      gamma: [{a: 1}]\n")
    assert _refused(mapping)[0] == [f"{mapping}:7: measurements[0].sweep.gamma[0]: sweep 'gamma': a swept value is a "
                                    "plain value or a list of them, not a dict"]
    listed = write_spec(TRAIN + "      checkpoint_at: [[1000, 2000], [5000]]\n")
    assert len(load_spec(listed).spec.measurements[0].sweep["checkpoint_at"]) == 2


@pytest.mark.parametrize("text", [SIX_BY_TWELVE, laughs()], ids=["six-by-twelve", "aliases"])
@pytest.mark.parametrize("command", ["validate", "run"])
def test_validate_and_run_refuse_in_one_line(write_spec, tmp_path, command, text):
    path = write_spec(text)
    args = [command, str(path)] + (["--db", str(tmp_path / "results.duckdb")] if command == "run" else [])
    start = time.perf_counter()
    result = CliRunner().invoke(main, args)
    assert time.perf_counter() - start < 1.0
    assert result.exit_code == 2, result.output
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith(f"error: {path}:"), result.stderr
    assert not (tmp_path / "results.duckdb").exists()


def _most_trials(*lines: str) -> str:
    return TRAIN.replace("    sweep:\n", f"    max_trials: {MAX_TRIALS_LIMIT}\n    sweep:\n") + "".join(
        f"      {line}\n" for line in lines)


def test_ten_thousand_values_that_share_one_trial_name_are_told_by_the_first_few(write_spec):
    """Told in full, they made one line of 237,000 characters."""
    values = ", ".join(repr(0.0001 + i * 1e-15) for i in range(MAX_TRIALS_LIMIT))
    path = write_spec(_most_trials(f"learning_rate: [{values}]"))
    (problem,) = _refused(path)[0]
    assert problem == (f"{path}:8: measurements[0].sweep.learning_rate[1]: sweep 'learning_rate' values 0.0001 and "
                       "0.000100000000001 and 0.000100000000002 ... and 9,997 more share one trial name, "
                       "learning_rate=0.0001 (a float is named to 6 significant digits): each value is one trial")


def test_the_most_trials_each_failing_alike_are_told_by_the_first_few_lines(write_spec, tmp_path):
    """10,000 trials, 4,555 of them with a replay too small for their envs: each was a line."""
    path = write_spec(_most_trials(f"replay_capacity: [{', '.join(str(1000 + i) for i in range(100))}]",
                                   f"num_envs: [{', '.join(str(20 + i) for i in range(100))}]"))
    result = CliRunner().invoke(main, ["run", str(path), "--db", str(tmp_path / "results.duckdb")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == MAX_PROBLEMS + 1, lines[:3]
    assert all(len(line.replace(str(path), "SPEC")) < 200 for line in lines), lines[:3]  # however long the folder
    assert lines[0] == (f"error: {path}:7: measurements[0].sweep: sweep trial 'replay_capacity=1000,num_envs=20': "
                        "replay_capacity 1000 is too small for 20 envs")
    assert lines[-1] == f"error: ... and {4555 - MAX_PROBLEMS:,} more problems in this spec"
    assert not (tmp_path / "results.duckdb").exists()
