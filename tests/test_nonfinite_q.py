"""A model that gives NaN or infinite Q-values has no greedy action, and none is played for it: the
pre-check refuses it on the fixed states in one line, a policy raises on such a row rather than
take argmax's pick (or parity's -1), and the game refuses an action outside the contract's set
(-1 would index LEFT)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from hostile_onnx import nan_onnx
from small_check import SMALL_CHECK, set_args
from test_cli_inputs import assert_one_line_usage_error, cli

from breakout_core.evaluation.fixed_states import load_fixed_states
from breakout_core.evaluation.policies import epsilon_greedy
from breakout_core.game.contract import DEFAULT_CONTRACT, contract_by_name
from breakout_core.game.driver import EpisodeDriver
from breakout_core.game.greedy import NonFiniteQ
from breakout_core.runtimes.onnxruntime_runtime import OnnxRuntimeRuntime
from runner.kinds.shared.runtime_lifecycle import RuntimePolicy
from runner.store.database import Store

STATES = load_fixed_states(Path(__file__).resolve().parents[1] / "models" / "reference" / "fixed_states_60.npz").obs


@pytest.mark.parametrize("command", [("check",), ("check", "--json"), ("convert", "int8")],
                         ids=["check", "check-json", "convert"])
def test_a_nan_model_is_refused_at_the_precheck_in_one_line_within_seconds(tmp_path, command):
    model = nan_onnx(tmp_path / "nan.onnx")
    started = time.monotonic()
    result = cli(*command, model.name, "--db", "r.duckdb", cwd=tmp_path)
    assert time.monotonic() - started < 60
    assert_one_line_usage_error(result, "MODEL nan.onnx: the model gives NaN Q-values (nan, nan, nan, nan) on fixed "
                                        "state 0 of 60: with them no action is greedy")
    assert result.stdout == "" and not (tmp_path / "r.duckdb").exists()


def test_no_policy_plays_a_row_of_nan_or_inf(tmp_path):
    rngs = [np.random.default_rng(0), np.random.default_rng(1)]
    with pytest.raises(NonFiniteQ, match=r"infinite Q-values \(1, inf, 0, 0\) on an observation in play"):
        epsilon_greedy(np.array([[0.0, 1, 2, 3], [1, np.inf, 0, 0]]), rngs, 0.0)
    with OnnxRuntimeRuntime(intra_op_threads=1, node_placement=False) as runtime:
        policy = RuntimePolicy(runtime.load(nan_onnx(tmp_path / "nan.onnx")), "nan")
        with pytest.raises(NonFiniteQ, match=r"gives NaN Q-values \(nan, nan, nan, nan\)"):
            policy.act(STATES[:2], rngs)


def test_the_game_refuses_an_action_outside_the_contracts_set():
    driver = EpisodeDriver(contract_by_name(DEFAULT_CONTRACT), 1)
    driver.start(0, 7)
    while driver.forced()[0]:  # FIRE at the reset: the contract's, not the caller's
        driver.step(np.array([0]))
    with pytest.raises(ValueError, match=r"action -1 for slot 0 is not one of contract breakout-v3's actions 0\.\.3"):
        driver.step(np.array([-1]))


def test_nan_met_in_a_run_ends_it_in_one_line_exit_2_and_stores_it_failed(tmp_path):
    """`runner run` has no pre-check: the closed loop meets the NaN at its first decision."""
    model = nan_onnx(tmp_path / "nan.onnx")
    spec = Path(__file__).resolve().parents[1] / "specs" / "check_onnx.yaml"
    result = cli("run", str(spec), *set_args(f"artifacts.candidate={{path: {model}}}", *SMALL_CHECK,
                                             "measurements=[{kind: closed_loop, name: closed_loop, baseline: baseline, "
                                             "runtimes: [baseline, candidate], seed: 0, steps: 256}]", "verdicts=[]"),
                 "--db", "r.duckdb", "--reports", "reports", cwd=tmp_path)
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), (result.exit_code, result.exception)
    assert result.stderr.strip().splitlines()[-1].startswith(  # after the run's progress lines
        "error: run failed: the model gives NaN Q-values (nan, nan, nan, nan) on closed-loop step 0: with them no "
        "action is greedy")
    with Store(tmp_path / "r.duckdb").reader() as con:
        assert con.execute("SELECT status FROM runs").fetchall() == [("failed",)]
