"""The contracts a user can name: gymnasium's ALE/Breakout-v5 defaults and the DeepMind evaluation of
CleanRL's and SB3's wrappers, each the project's rules with other values, played on the real ALE,
and said in words wherever a check or a run names its game."""

from __future__ import annotations

import numpy as np
import pytest
from small_check import SMALL_CHECK, set_args
from test_cli_inputs import assert_one_line_usage_error, cli

from breakout_core.game.contract import CONTRACTS, DEFAULT_CONTRACT, FIRE
from breakout_core.game.driver import NOOP, EpisodeDriver, play_seeds
from runner.cli.check import CHECK_SPEC
from runner.cli.check_contract import contract_sets, played_contract, unlabelled_line
from runner.spec.document import SpecError, load_spec

V2, V3 = CONTRACTS["breakout-v2"], CONTRACTS["breakout-v3"]
V5, DEEPMIND = CONTRACTS["ale-breakout-v5"], CONTRACTS["deepmind-noframeskip-v4"]
LEFT = 3


def test_the_presets_are_the_projects_rules_with_other_values_and_their_hashes_are_pinned():
    assert V5 == V3.replace(name="ale-breakout-v5", fire_on_reset=False)
    assert DEEPMIND == V2.replace(name="deepmind-noframeskip-v4", serve_after_life_loss=True)
    assert (V5.hash, DEEPMIND.hash) == ("1b3853a0781f2fef", "c2a484b13d8b5f3a")
    assert (V2.hash, V3.hash) == ("34831b6a492c742d", "d462bb08a939ded6")  # as stored before the presets
    assert DEFAULT_CONTRACT == "breakout-v3" and len({c.hash for c in CONTRACTS.values()}) == len(CONTRACTS)


def test_each_contract_says_its_rules_in_words():
    assert DEEPMIND.rules().startswith("no sticky actions, a no-op start of 0-30 agent steps, FIRE pressed at the "
                                       "reset, a forced FIRE step after each lost life; each action held 4 frames, "
                                       "max-pooled over its last 2 frames")
    assert V5.rules().startswith("sticky actions at 0.25, no no-op start, no FIRE at the reset (the agent serves);")
    assert "full games up to 108,000 frames, raw score" in V3.rules()
    assert V3.described() == f"breakout-v3 ({V3.hash}): {V3.rules()}"


def _play(contract, action: int, steps: int):
    """One episode of seed 7 holding `action` for at most `steps` steps: (results of every step, the episode)."""
    driver, results = EpisodeDriver(contract, 1), []
    done = play_seeds(driver, [7], lambda obs, slots, rngs: np.full(len(slots), action), on_step=results.append,
                      max_steps=steps)
    return results, done[7]


def test_under_the_deepmind_preset_every_lost_life_is_served_by_a_forced_fire_step():
    results, episode = _play(DEEPMIND, LEFT, 3_000)
    lost = [i for i, r in enumerate(results) if r.life_lost[0] and not r.terminated[0]]
    assert episode.ended_by == "game_over" and len(lost) == 4  # 5 lives: the last one ends the game
    assert all(results[i + 1].forced[0] and results[i + 1].actions[0] == FIRE for i in lost)
    assert 1 <= episode.noop_steps <= 30 or episode.noop_steps == 0  # drawn from the seed
    assert all(r.actions[0] == NOOP for r in results[:episode.noop_steps])


def test_under_the_v5_preset_nothing_serves_for_the_agent():
    _, episode = _play(V5, NOOP, 200)
    assert episode.ended_by == "stopped" and episode.score == 0  # the ball never came into play
    results, _ = _play(V5, NOOP, 200)
    assert not any(r.life_lost[0] for r in results) and not any(r.forced[0] for r in results)


def test_a_spec_names_a_preset_and_the_check_spec_plays_the_one_given(capsys):
    assert played_contract(CHECK_SPEC, ()) == V3
    assert played_contract(CHECK_SPEC, ("contract.name=deepmind-noframeskip-v4",)) == DEEPMIND
    tweaked = played_contract(CHECK_SPEC, ("contract.name=ale-breakout-v5", "contract.noop_start_max=5"))
    assert tweaked == V5.replace(noop_start_max=5)
    with pytest.raises(SystemExit) as refused:  # said as the run says it
        played_contract(CHECK_SPEC, ("contract.name=pong",))
    assert refused.value.code == 2 and "contract.name: unknown contract 'pong'" in capsys.readouterr().err
    assert contract_sets(V3, None) == []  # the shipped fixed states are breakout-v3's
    own = ("artifacts.fixed_states.path=/somewhere/mine.npz",)
    assert contract_sets(DEEPMIND, None, own) == ["contract.other_contracts=deliberate"]  # nothing captured
    assert contract_sets(DEEPMIND, CHECK_SPEC, own) == []


@pytest.mark.slow
def test_fixed_states_are_refused_under_another_contract_than_they_were_captured_in():
    with pytest.raises(SpecError, match=r"fixed_states_60.npz was made under contract breakout-v3 .*this spec plays "
                                        r"ale-breakout-v5 \(1b3853a0781f2fef\); re-capture them under this contract"):
        load_spec(CHECK_SPEC, overrides=("contract.name=ale-breakout-v5", "contract.other_contracts=deliberate"))


def test_a_model_that_records_no_contract_gets_one_line_naming_the_game(tmp_path):
    from tiny_onnx import tiny_model

    bare = tiny_model(tmp_path / "bare.onnx")
    labelled = CHECK_SPEC.parents[1] / "models" / "reference" / "dqn_breakout.onnx"
    line = unlabelled_line({"MODEL": bare, "--baseline": labelled}, DEEPMIND)
    assert line == (f"MODEL {bare} records no contract in its metadata: judged under deepmind-noframeskip-v4 "
                    f"({DEEPMIND.hash}); --contract names another game")
    assert unlabelled_line({"MODEL": labelled, "--baseline": None}, V3) is None


def test_check_refuses_an_unknown_contract_and_stores_nothing(tmp_path):
    result = cli("check", str(CHECK_SPEC.parents[1] / "models" / "reference" / "dqn_breakout_fp16.onnx"),
                 "--contract", "pong", "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(result, " check: Invalid value for '--contract': 'pong' is not one of "
                                "'ale-breakout-v5'")
    assert not (tmp_path / "r.duckdb").exists()


@pytest.mark.slow
def test_a_cleanrl_shaped_model_is_checked_against_its_own_fp32_file_under_the_deepmind_preset(tmp_path):
    """No checkpoint of the user's, no --set for the game: --baseline and --contract. (The --set here
    only make the games few.)"""
    from cleanrl_shaped import export_cleanrl_shaped

    from breakout_core.conversion.fp16 import convert_fp16
    from breakout_core.evaluation.fixed_states import load_fixed_states
    from runner.store.database import Store

    export_cleanrl_shaped(tmp_path / "cleanrl.onnx")
    convert_fp16(tmp_path / "cleanrl.onnx", tmp_path / "cleanrl_fp16.onnx")
    result = cli("check", "cleanrl_fp16.onnx", "--baseline", "cleanrl.onnx", "--contract", "deepmind-noframeskip-v4",
                 *set_args(*SMALL_CHECK), "--db", "r.duckdb", "--reports", "reports", cwd=tmp_path)
    assert result.exit_code in (0, 1), (result.output, result.exception)
    lines = result.stdout.splitlines()
    assert lines[0] == f"check cleanrl_fp16.onnx under contract {DEEPMIND.described()}"
    assert (f"MODEL cleanrl_fp16.onnx and --baseline cleanrl.onnx record no contract in their metadata: "
            f"judged under deepmind-noframeskip-v4 ({DEEPMIND.hash}); --contract names another game") in lines
    assert "verdict same_decisions: deployment-worthy" in result.stdout
    # the fixed states are the baseline's own, from its games in the game it is judged in
    [states] = (tmp_path / "runs" / "baseline_states").glob(f"cleanrl-*-{DEEPMIND.hash[:12]}.npz")
    assert load_fixed_states(states).contract_hash == DEEPMIND.hash
    with Store(tmp_path / "r.duckdb").reader() as con:
        assert con.execute("SELECT contract_hash FROM runs").fetchall() == [(DEEPMIND.hash,)]


@pytest.mark.slow  # 6 full games: 26 s on the loaded 2-core machine
def test_the_reference_agents_states_played_from_its_onnx_file_are_the_shipped_ones(tmp_path, monkeypatch):
    """The states a check captures of the reference agent under another contract come from its FP32
    ONNX file, as a user's baseline file's do; under breakout-v3 that capture gives the shipped
    fixed states (captured from the checkpoint by day22_export), state for state."""
    from breakout_core.evaluation.fixed_states import load_fixed_states
    from runner.cli.check_contract import REFERENCE_ONNX, reference_states_under

    monkeypatch.chdir(tmp_path)
    captured = load_fixed_states(reference_states_under(V3))
    shipped = load_fixed_states(REFERENCE_ONNX.with_name("fixed_states_60.npz"))
    for field in ("obs", "episode_seeds", "steps", "actions"):
        assert np.array_equal(getattr(captured, field), getattr(shipped, field)), field
    assert captured.contract_hash == shipped.contract_hash == V3.hash
    again = reference_states_under(V3)  # kept, and reused while the file and the contract are the same
    assert again.parent == tmp_path / "runs" / "baseline_states" and again.stat().st_size > 0
