"""The contract option full_action_space: an agent's outputs play ALE's 18 legal actions, as ale-py's
`full_action_space=True` maps them, on the real ALE; an 18-output network with the reference agent's
weights at the places of its 4 actions plays as the reference does, and `runner check` judges it
against its own FP32 file by 18-way argmaxes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from ale_py import Action, ALEInterface, roms
from small_check import SMALL_CHECK, set_args
from test_cli_inputs import assert_one_line_usage_error, cli
from user_exports import CleanRLQNetwork, cleanrl_onnx, export

from breakout_core.evaluation.policies import OnnxPolicy, QNetworkPolicy, RandomPolicy, check_fits
from breakout_core.game.contract import CONTRACTS, DEFAULT_CONTRACT, FULL_ACTION_NAMES, MINIMAL_ACTION_NAMES
from breakout_core.game.driver import EpisodeDriver, play_seeds
from breakout_core.game.envs import AleGame, new_emulator
from breakout_core.learning.qnetwork import QNetwork
from runner.store.database import Store

REPO = Path(__file__).resolve().parents[1]
REFERENCE_ONNX = REPO / "models" / "reference" / "dqn_breakout.onnx"
V3 = CONTRACTS[DEFAULT_CONTRACT]
FULL = V3.replace(full_action_space=True)
FULL_OPTION = "contract.full_action_space=true"
RIGHTFIRE = FULL_ACTION_NAMES.index("RIGHTFIRE")


def test_the_option_names_ales_own_sets_and_changes_only_its_own_hash():
    ale = ALEInterface()
    ale.loadROM(roms.get_rom_path("breakout"))
    assert tuple(a.name for a in ale.getMinimalActionSet()) == MINIMAL_ACTION_NAMES
    assert tuple(a.name for a in ale.getLegalActionSet()) == FULL_ACTION_NAMES  # ALE's Action enum, in order
    assert [Action[n].value for n in FULL_ACTION_NAMES] == list(range(18))
    assert FULL.minimal_outputs() == [0, 1, 3, 4] and V3.minimal_outputs() == [0, 1, 2, 3]
    assert (V3.hash, CONTRACTS["breakout-v2"].hash) == ("d462bb08a939ded6", "34831b6a492c742d")  # as before
    assert FULL.hash not in {c.hash for c in CONTRACTS.values()} and FULL.num_actions == 18
    assert "ALE's full set of 18 actions" in FULL.rules() and "18" not in V3.rules()
    game = AleGame(FULL, new_emulator(FULL, 0))
    assert [a.name for a in game.action_set] == list(FULL_ACTION_NAMES)


def _trajectory(contract, action: int, processes: int = 1) -> tuple[float, list[bytes]]:
    driver, frames = EpisodeDriver(contract, processes, processes=processes), []
    try:
        done = play_seeds(driver, [5], lambda obs, slots, rngs: np.full(len(slots), action),
                          on_step=lambda r: frames.append(r.obs[0].tobytes()), max_steps=120)
    finally:
        driver.close()
    return done[5].score, frames


def test_each_output_plays_its_action_of_the_contracts_set_here_and_in_a_worker_process():
    """Output 3 is RIGHT under the full set and output 2 under the minimal one: the same game, frame
    for frame, in this process and in a driver's worker; RIGHTFIRE exists only in the full set."""
    right_minimal = _trajectory(V3, MINIMAL_ACTION_NAMES.index("RIGHT"))
    assert _trajectory(FULL, FULL_ACTION_NAMES.index("RIGHT")) == right_minimal
    assert _trajectory(FULL, FULL_ACTION_NAMES.index("RIGHT"), processes=2)[1][:60] == right_minimal[1][:60]
    assert _trajectory(FULL, FULL_ACTION_NAMES.index("UP"))[1] != right_minimal[1]  # output 2 is UP here
    _, episode = play_seeds(EpisodeDriver(FULL, 1), [5], lambda obs, slots, rngs: np.full(len(slots), RIGHTFIRE),
                            max_steps=50).popitem()
    assert len(episode.action_counts) == 18 and episode.action_counts[RIGHTFIRE] == 50


def test_the_18_output_reference_plays_as_the_reference_does(tmp_path):
    full18 = cleanrl_onnx(tmp_path / "full18.onnx", dynamic_batch=True, actions=18)
    from breakout_core.conversion.input_convention import InputConvention, write_adapted

    adapted = write_adapted(full18, InputConvention.parse("float32:0-255:nchw"), tmp_path / "a.onnx",
                            np.zeros((1, 4, 84, 84), np.uint8)).path
    played = {}
    for name, path, contract in (("reference", REFERENCE_ONNX, V3), ("full18", adapted, FULL)):
        policy = OnnxPolicy(path)
        try:
            played[name] = play_seeds(EpisodeDriver(contract, 2), [0, 1], lambda obs, _s, rngs: policy.act(obs, rngs),
                                      max_steps=400)
        finally:
            policy.close()
    for seed in (0, 1):
        ref, full = played["reference"][seed], played["full18"][seed]
        assert (full.score, full.steps) == (ref.score, ref.steps) and ref.score > 0
        assert [full.action_counts[i] for i in FULL.minimal_outputs()] == list(ref.action_counts)
        assert sum(full.action_counts) == sum(ref.action_counts)  # no other action ever greedy


def test_a_network_with_another_width_than_the_contract_is_refused_before_it_plays():
    with pytest.raises(ValueError, match=r"chooses among 4 actions, and contract breakout-v3 \(\w+\) plays 18"):
        check_fits(QNetworkPolicy(QNetwork(), name="four"), FULL)
    check_fits(QNetworkPolicy(QNetwork(num_actions=18), name="eighteen"), FULL)
    with pytest.raises(ValueError, match="chooses among 18 actions"):
        check_fits(RandomPolicy(18), V3)


SPEC = """\
name: width
contract: {{full_action_space: true, other_contracts: deliberate}}
artifacts:
  model: {{path: {model}}}
runtimes:
  ort: {{runtime: onnxruntime, provider: cpu, intra_op_threads: 1, artifact: model}}
measurements:
  - kind: closed_loop
    name: loop
    runtimes: [ort]
    seed: 0
    steps: 16
"""


def test_a_spec_whose_runtime_plays_a_model_of_another_width_is_refused_where_it_names_the_file(tmp_path,
                                                                                               write_spec):
    result = cli("validate", str(write_spec(SPEC.format(model=REFERENCE_ONNX))), cwd=tmp_path)
    assert_one_line_usage_error(result, "spec.yaml:4: artifacts.model.path: dqn_breakout.onnx: it gives 4 Q-values",
                                "breakout-v3 with full_action_space plays ALE's 18 actions")


def test_training_under_the_option_learns_18_outputs_and_its_checkpoint_loads_so(tmp_path):
    from breakout_core.learning.qnetwork import load_checkpoint
    from breakout_core.learning.train_config import TrainConfig
    from breakout_core.learning.trainer import CheckpointSaved, Trainer

    config = TrainConfig(total_transitions=120, num_envs=2, learning_starts=100, replay_capacity=1_000,
                         diagnostics_every=100, target_sync_every=100, epsilon_decay_transitions=100, torch_threads=1,
                         batch_size=8)
    records = list(Trainer(config, FULL.replace(max_episode_frames=400), tmp_path).run())
    network, meta = load_checkpoint(next(r.path for r in records if isinstance(r, CheckpointSaved)))
    assert network.num_actions == 18 and network(torch.zeros(2, 4, 84, 84, dtype=torch.uint8)).shape == (2, 18)
    assert meta["contract"]["full_action_space"] is True


@pytest.fixture(scope="module")
def full_files(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("full")
    network = CleanRLQNetwork(18)
    head = network.network[-1]
    files = {"fp32": cleanrl_onnx(folder / "full18_fp32.onnx", actions=18),
             "dynamic": cleanrl_onnx(folder / "full18.onnx", actions=18, dynamic_batch=True)}
    # RIGHTFIRE a hair above RIGHT: wherever the reference moves right, this one moves right and fires
    head.weight.data[RIGHTFIRE] = head.weight.data[FULL_ACTION_NAMES.index("RIGHT")]
    head.bias.data[RIGHTFIRE] = head.bias.data[FULL_ACTION_NAMES.index("RIGHT")] + 1e-3
    files["rightfire"] = export(network, folder / "full18_rightfire.onnx", torch.zeros(1, 4, 84, 84),
                                dynamic_batch=True)
    return files


def _copy(files: dict[str, Path], folder: Path, *names: str) -> list[str]:
    """The files' names, copied into `folder` (where the command runs)."""
    for n in names:
        shutil.copy(files[n], folder / files[n].name)
    return [files[n].name for n in names]


@pytest.mark.parametrize("given, mentions", [
    (("dynamic",), ["MODEL full18.onnx: it gives 18 Q-values, ALE's full action space", "breakout-v3 plays "
                    "Breakout's minimal 4 actions", "contract option full_action_space", FULL_OPTION]),
    (("dynamic", "--set", FULL_OPTION), ["MODEL full18.onnx: under the contract option full_action_space the "
                                         "reference agent, which plays 4 actions, cannot be its baseline",
                                         "--baseline YOUR_FP32.onnx"]),
    (("dynamic", "--baseline", str(REFERENCE_ONNX), "--set", FULL_OPTION),
     ["--baseline", "dqn_breakout.onnx: it gives 4 Q-values, Breakout's minimal action set, and breakout-v3 with "
      "full_action_space plays ALE's 18 actions", "leave out the contract option full_action_space"]),
], ids=["18-without-the-option", "18-without-a-baseline", "4-wide-baseline-under-the-option"])
def test_a_width_the_contract_does_not_play_is_one_line_naming_both_and_the_option(tmp_path, full_files, given,
                                                                                   mentions):
    _copy(full_files, tmp_path, "dynamic")
    result = cli("check", full_files[given[0]].name, *given[1:], "--input", "float32:0-255:nchw", "--db", "r.duckdb",
                 cwd=tmp_path)
    assert_one_line_usage_error(result, *mentions)
    assert not (tmp_path / "r.duckdb").exists() and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_an_18_action_model_against_its_own_fp32_file_and_a_perturbed_one(tmp_path, full_files):
    """Fixed states from the baseline's own games under the full action set; parity, the closed loop
    and the games compare 18-way argmaxes: a file that plays RIGHTFIRE where its baseline plays RIGHT
    loses same_decisions."""
    model, perturbed, base = _copy(full_files, tmp_path, "dynamic", "rightfire", "fp32")
    common = ("--baseline", base, "--input", "float32:0-255:nchw", "--set", FULL_OPTION, *set_args(*SMALL_CHECK),
              "--db", "r.duckdb", "--reports", "reports")
    result = cli("check", model, *common, cwd=tmp_path)
    assert result.exit_code in (0, 1) and isinstance(result.exception, (SystemExit, type(None))), result.output
    first = result.stdout.splitlines()[0]
    assert first.startswith(f"check {model} under contract breakout-v3 ({FULL.hash})") and "18 actions" in first
    assert "capturing 60 fixed states from its own games under breakout-v3" in result.stdout
    for verdict in ("same_decisions", "plays_the_same_256_steps", "keeps_the_score"):
        assert f"verdict {verdict}: deployment-worthy" in result.stdout, result.stdout
    with Store(tmp_path / "r.duckdb").reader() as con:
        contract = json.loads(con.execute("SELECT contract FROM runs").fetchone()[0])
        actions = {a for (a,) in con.execute("SELECT DISTINCT action FROM parity_q").fetchall()}
        named = dict(con.execute("SELECT runtime, action_right FROM closed_loop_summary").fetchall())
    assert contract["full_action_space"] is True and actions <= set(FULL.minimal_outputs()) and 3 in actions
    assert named["candidate"] == named["baseline"] > 0  # RIGHT is output 3, counted by its name
    worse = cli("check", perturbed, *common, cwd=tmp_path)
    assert worse.exit_code == 1, worse.output
    assert "captured before" in worse.stdout and "verdict same_decisions: rejected" in worse.stdout
    with Store(tmp_path / "r.duckdb").reader() as con:
        flips = set(con.execute("SELECT DISTINCT baseline_action, candidate_action FROM parity_flips WHERE "
                                "candidate = 'candidate' AND baseline = 'baseline'").fetchall())
        widths = {n for (n,) in con.execute("SELECT DISTINCT len(q_values) FROM parity_q").fetchall()}
        least_dq = con.execute("SELECT min(max_abs_dq) FROM parity_flips WHERE candidate = 'candidate' "
                               "AND baseline = 'baseline'").fetchone()[0]
    # RIGHTFIRE where the baseline moves right, and where LEFT led RIGHT by less than the hair
    assert (3, RIGHTFIRE) in flips and {c for _, c in flips} == {RIGHTFIRE}
    # every Q-value is stored and compared: only RIGHTFIRE's moved, and each changed action shows it
    assert widths == {18} and least_dq > 0


@pytest.mark.slow
def test_runner_convert_takes_an_18_action_model_under_the_option(tmp_path, full_files):
    """Its width is checked against the game the option plays, and the FP16 file written keeps
    the 18 outputs and FP32's 18-way action on the fixed states of its own games."""
    model, = _copy(full_files, tmp_path, "dynamic")
    refused = cli("convert", "fp16", model, "--input", "float32:0-255:nchw", "--db", "r.duckdb", cwd=tmp_path)
    assert_one_line_usage_error(refused, "it gives 18 Q-values", "contract option full_action_space")
    made = cli("convert", "fp16", model, "--input", "float32:0-255:nchw", "--set", FULL_OPTION,
               *set_args("measurements.search.latency_runs=64"),
               "--db", "r.duckdb", "--reports", "reports", cwd=tmp_path)
    assert made.exit_code == 0, made.output
    written = tmp_path / "full18_fp16.onnx"
    assert f"recommended: {written.name}" in made.stdout or f"recommended: {written}" in made.stdout, made.stdout
    assert made.stdout.splitlines()[-1].endswith(f"--set {FULL_OPTION}")  # the check to run next plays it too
    with Store(tmp_path / "r.duckdb").reader() as con:
        agreement = con.execute("SELECT agreement FROM repair_steps WHERE chosen").fetchone()[0]
    assert agreement == 1.0
    import onnx

    out = onnx.load(str(written)).graph.output[0].type.tensor_type.shape.dim
    assert out[-1].dim_value == 18


def test_runner_play_takes_an_18_action_model_under_its_flag_and_refuses_a_width_that_does_not_fit(tmp_path):
    from breakout_core.conversion.input_convention import InputConvention, write_adapted

    full18 = cleanrl_onnx(tmp_path / "full18.onnx", dynamic_batch=True, actions=18)
    model = write_adapted(full18, InputConvention.parse("float32:0-255:nchw"), tmp_path / "full18_uint8.onnx",
                          np.zeros((1, 4, 84, 84), np.uint8)).path
    common = ("--port", "0", "--db", "play.duckdb")
    refused = cli("play", "--model", str(model), *common, cwd=tmp_path)
    assert_one_line_usage_error(refused, f"--model {model}: it gives 18 Q-values, ALE's full action space",
                                "judge it under --full-action-space")
    four = cli("play", "--model", str(REFERENCE_ONNX), "--full-action-space", *common, cwd=tmp_path)
    assert_one_line_usage_error(four, "it gives 4 Q-values, Breakout's minimal action set, and breakout-v3 with "
                                "full_action_space plays ALE's 18 actions", "leave out --full-action-space")
    floats = cli("play", "--model", str(full18), "--full-action-space", *common, cwd=tmp_path)
    assert_one_line_usage_error(floats, f"--model {full18}: takes float32 ('batch', 4, 84, 84); the play page feeds "
                                "the agent's uint8 observations (B, 4, 84, 84)")
    assert not (tmp_path / "play.duckdb").exists()
