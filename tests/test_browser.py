"""The browser runtime and the play page, in real headless Chromium with onnxruntime-web.

Needs Debian's `chromium` and `npm ci --prefix web` (both done by .ci/run). The runtime
tests compare the page's Q-values with PyTorch's on states captured from real ALE play,
for WASM and for WebGPU on Chromium's software adapter (SwiftShader); a tiny spec runs
parity, in-page latency, a closed loop and episodes through the CLI into DuckDB; the play
page is driven by a scripted keyboard player until both games end, and the stored row is
checked against what the page showed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import numpy as np
import pytest
from test_end_to_end import cli

from breakout_core.diagnosis.parity import compare_q
from breakout_core.runtimes.base import RuntimeUnavailable
from breakout_core.runtimes.browser_runtime import BrowserRuntime
from breakout_core.runtimes.registry import make_runtime, runtime_available

REPO = Path(__file__).parents[1]


@pytest.fixture(scope="module")
def torch_q(artifacts):
    with make_runtime("torch") as rt:
        rt.load(artifacts.checkpoint)
        return rt.infer(artifacts.states.obs)


@pytest.mark.browser
@pytest.mark.parametrize("provider", ["wasm", "webgpu"])
def test_page_q_values_match_torch_on_real_states(artifacts, torch_q, provider):
    with make_runtime("browser", provider=provider) as rt:
        rt.load(artifacts.export.onnx_path)
        q_batch = rt.infer(artifacts.states.obs)
        q_one = np.concatenate([rt.infer(artifacts.states.obs[i:i + 1]) for i in range(4)])
        actual = rt.describe()["actual"]
    assert q_batch.shape == (len(artifacts.states.obs), 4) and q_batch.dtype == np.float32
    report = compare_q(torch_q, q_batch, atol=1e-4, rtol=1e-4)
    assert report.action_agreement_fraction == 1.0 and report.max_abs_diff <= 1e-4, report
    np.testing.assert_allclose(q_one, q_batch[:4], atol=1e-5)
    assert actual["requested_provider"] == provider and actual["provider"] == provider
    assert actual["cross_origin_isolated"] is True
    assert actual["wasm_threads"] >= 1 and actual["timer_resolution_ms"] > 0
    assert actual["browser_version"].split(".")[0].isdigit()
    if provider == "webgpu":
        # every node on the WebGPU provider, and the adapter named for what it is
        assert set(actual["nodes_by_provider"]) == {"WebGpuExecutionProvider"}
        assert actual["adapter"]["architecture"] == "swiftshader" and actual["adapter"]["software"] is True
        assert "software" in actual["device"]
    else:
        assert set(actual["nodes_by_provider"]) == {"CPUExecutionProvider"} and actual["adapter"] is None


@pytest.mark.browser
def test_in_page_latency_samples(artifacts):
    with make_runtime("browser", provider="wasm") as rt:
        rt.load(artifacts.export.onnx_path)
        result = rt.timed_runs(artifacts.states.obs[:1], warmup=3, iterations=64)
    samples = result.samples_ms
    assert samples.shape == (64,) and np.all(samples > 0) and np.all(np.isfinite(samples))
    assert result.timer == "performance.now() in the page" and 0 < result.timer_resolution_s < 1e-3


def test_missing_browser_is_unavailable_with_the_reason(artifacts, monkeypatch):
    monkeypatch.setenv("BREAKOUT_CHROMIUM", str(REPO / "no-such-chromium"))
    ok, reason = runtime_available("browser", provider="wasm")
    assert not ok and "BREAKOUT_CHROMIUM" in reason and "not an executable" in reason
    with pytest.raises(RuntimeUnavailable, match="not an executable"):
        BrowserRuntime(provider="webgpu").load(artifacts.export.onnx_path)


def test_browser_option_errors_are_one_line():
    with pytest.raises(ValueError, match="provider='webgl' is not one of"):
        make_runtime("browser", provider="webgl")
    with pytest.raises(ValueError, match="num_threads=0 is below 1"):  # the option's declared minimum
        runtime_available("browser", num_threads=0)


BROWSER_SPEC = """
name: browser_tiny
contract: {name: breakout-v2}
artifacts:
  checkpoint: {path: CHECKPOINT}
  onnx_fp32: {path: ONNX}
  states: {path: STATES}
runtimes:
  torch_fp32: {runtime: torch, threads: 1, artifact: checkpoint}
  browser_wasm: {runtime: browser, provider: wasm, artifact: onnx_fp32}
  browser_webgpu: {runtime: browser, provider: webgpu, artifact: onnx_fp32}
measurements:
  - kind: parity
    name: parity
    fixed_states: states
    baseline: torch_fp32
    runtimes: [torch_fp32, browser_wasm, browser_webgpu]
    batch_sizes: [1, 24]
  - kind: latency
    name: latency
    fixed_states: states
    baseline: browser_wasm
    runtimes: [browser_wasm, torch_fp32]
    iterations: 64
    warmup: 3
  - kind: closed_loop
    name: loop
    baseline: torch_fp32
    runtimes: [torch_fp32, browser_wasm]
    steps: 20
verdicts:
  - {name: wasm_same, measurement: parity, candidate: browser_wasm, baseline: torch_fp32,
     deployment_worthy_when: {action_agreement: ">= 1.0", max_abs_dq: "<= 1e-4"}}
  - {name: webgpu_same, measurement: parity, candidate: browser_webgpu, baseline: torch_fp32,
     deployment_worthy_when: {action_agreement: ">= 1.0", max_abs_dq: "<= 1e-4"}}
  - {name: loop_same, measurement: loop, candidate: browser_wasm, baseline: torch_fp32,
     deployment_worthy_when: {score_diff: "== 0", diverged: "== 0"}}
"""

# full games, capped at 100 agent steps by the contract (an untrained agent stalls until the cap);
# a spec of their own, as the states above were captured under breakout-v2 uncapped
EPISODES_SPEC = """
name: browser_episodes
contract: {name: breakout-v2, max_episode_frames: 400, other_contracts: deliberate}  # a capped game
artifacts:
  checkpoint: {path: CHECKPOINT}
  onnx_fp32: {path: ONNX}
runtimes:
  torch_fp32: {runtime: torch, threads: 1, artifact: checkpoint}
  browser_wasm: {runtime: browser, provider: wasm, artifact: onnx_fp32}
measurements:
  - kind: episodes
    name: scores
    baseline: torch_fp32
    runtimes: [torch_fp32, browser_wasm]
    seeds: [0, 1]
    batch_size: 2
verdicts:
  - {name: scores_same, measurement: scores, candidate: browser_wasm, baseline: torch_fp32,
     deployment_worthy_when: {paired_score_diff_ci_low: ">= 0", paired_score_diff_ci_high: "<= 0"}}
"""


@pytest.mark.browser
@pytest.mark.slow
def test_browser_spec_runs_through_the_cli(artifacts, tmp_path):
    db = tmp_path / "browser.duckdb"
    for name, text in (("browser.yaml", BROWSER_SPEC), ("episodes.yaml", EPISODES_SPEC)):
        spec = tmp_path / name
        spec.write_text(text.replace("CHECKPOINT", str(artifacts.checkpoint))
                        .replace("ONNX", str(artifacts.export.onnx_path)).replace("STATES", str(artifacts.states_path)))
        out = cli("run", str(spec), "--db", str(db), "--no-report", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
        assert out.exit_code == 0, (out.stderr[-3000:], out.exception)
    con = duckdb.connect(str(db), read_only=True)
    outcomes = dict(con.execute("SELECT verdict, outcome FROM verdicts").fetchall())
    assert outcomes == {name: "deployment-worthy" for name in ("wasm_same", "webgpu_same", "loop_same", "scores_same")}
    status = {r[0]: json.loads(r[1]) for r in con.execute(
        "SELECT runtime, runtime_describe FROM runtime_status WHERE measurement = 'parity'").fetchall()}
    assert status["browser_webgpu"]["actual"]["adapter"]["software"] is True
    series = con.execute(
        "SELECT timer, timer_resolution_s FROM latency_series WHERE runtime = 'browser_wasm'").fetchone()
    assert series[0] == "performance.now() in the page" and series[1] > 0
    assert con.execute("SELECT count(*) FROM latency_samples WHERE runtime = 'browser_wasm'").fetchone()[0] == 64
    scores = con.execute(
        "SELECT policy, count(*) FROM episodes WHERE measurement = 'scores' GROUP BY policy").fetchall()
    assert dict(scores) == {"torch_fp32": 2, "browser_wasm": 2}


# a few short games (50 agent steps each) for both providers beside ONNX Runtime on the CPU
PROVIDER_SPEC = """
name: browser_provider_games
contract: {name: breakout-v2, max_episode_frames: 200, other_contracts: deliberate}
artifacts:
  onnx_fp32: {path: ONNX}
runtimes:
  ort_cpu: {runtime: onnxruntime, provider: cpu, intra_op_threads: 1, artifact: onnx_fp32}
  browser_wasm: {runtime: browser, provider: wasm, artifact: onnx_fp32}
  browser_webgpu: {runtime: browser, provider: webgpu, artifact: onnx_fp32}
measurements:
  - kind: episodes
    name: games
    baseline: ort_cpu
    runtimes: [ort_cpu, browser_wasm, browser_webgpu]
    seeds: [0, 1]
    batch_size: 2
verdicts:
  - {name: webgpu_keeps_wasm_scores, measurement: games, candidate: browser_webgpu, baseline: browser_wasm,
     deployment_worthy_when: {paired_score_diff_ci_low: ">= -1.0"}}
  - {name: wasm_keeps_cpu_scores, measurement: games, candidate: browser_wasm, baseline: ort_cpu,
     deployment_worthy_when: {paired_score_diff_ci_low: ">= -1.0"}}
"""


@pytest.mark.browser
@pytest.mark.slow
def test_both_providers_play_the_same_games_each_call_timed_in_the_page(artifacts, tmp_path):  # noqa: F811
    db = tmp_path / "games.duckdb"
    spec = tmp_path / "games.yaml"
    spec.write_text(PROVIDER_SPEC.replace("ONNX", str(artifacts.export.onnx_path)))
    out = cli("run", str(spec), "--db", str(db), "--no-report", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert out.exit_code == 0, (out.stderr[-3000:], out.exception)
    con = duckdb.connect(str(db), read_only=True)
    games = dict(con.execute("SELECT policy, count(*) FROM episodes GROUP BY policy").fetchall())
    assert games == {"ort_cpu": 2, "browser_wasm": 2, "browser_webgpu": 2}
    inference = {r[0]: r[1:] for r in con.execute(
        "SELECT runtime, inference_calls, states_inferred, call_timer, software_adapter "
        "FROM episode_inference").fetchall()}
    calls = {r[0]: r[1:] for r in con.execute(
        "SELECT runtime, count(*), sum(states), min(ms) FROM episode_inference_calls GROUP BY runtime").fetchall()}
    for runtime, (n, states, timer, software) in inference.items():
        assert calls[runtime][:2] == (n, states) and calls[runtime][2] >= 0  # every call of the game loop, timed
        assert timer == ("time.perf_counter() around infer() in Python" if runtime == "ort_cpu"
                         else "performance.now() around session.run in the page")
        assert software is (runtime == "browser_webgpu")  # Chromium's WebGPU here is SwiftShader
    verdicts = {v: (o, r, json.loads(e)) for v, o, r, e in con.execute(
        "SELECT verdict, outcome, reason, evidence FROM verdicts").fetchall()}
    outcome, reason, evidence = verdicts["webgpu_keeps_wasm_scores"]
    assert "browser_webgpu ran on webgpu software adapter (SwiftShader" in reason  # its in-game times, shown
    assert evidence["metrics"]["candidate_game_call_p95_ms"] > 0 and evidence["metrics"]["game_call_p95_ratio"] > 0
    outcome, reason, evidence = verdicts["wasm_keeps_cpu_scores"]
    assert "SwiftShader" not in reason and evidence["metrics"]["candidate_game_call_p95_ms"] > 0, reason


# -- the play page ------------------------------------------------------------------------------

@pytest.mark.browser
@pytest.mark.slow
def test_play_page_person_and_agent_play_to_the_end_and_the_row_is_stored(tmp_path):
    from breakout_core.browser import chromium
    from breakout_core.game.contract import Contract
    from runner.play.server import PlayServer
    from runner.store.database import Store

    # a shorter time limit (recorded: the row's contract hash differs from breakout-v2's) keeps
    # a stalling agent's episode to 750 steps; an agent that loses its lives ends sooner
    contract = Contract().replace(max_episode_frames=3000)
    store = Store(tmp_path / "play.duckdb")
    model = REPO / "models" / "reference" / "dqn_breakout.onnx"
    with PlayServer(store, model, contract, port=0, pace_ms=0) as server:
        browser = chromium.launch()
        try:
            page = browser.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(server.url() + "?pace_ms=0&seed=5")
            page.wait_for_function("window.playPage && window.playPage.ready", timeout=60_000)
            # a bad message is answered with an error and steps nothing
            reply = page.evaluate("""() => new Promise((resolve) => {
                const ws = new WebSocket(`ws://${location.host}/play/ws`);
                ws.onopen = () => ws.send(JSON.stringify({type: 'act', human_action: 9, agent_action: 0}));
                ws.onmessage = (e) => { resolve(JSON.parse(e.data)); ws.close(); };
            })""")
            assert reply == {"type": "error", "message": "send {'type': 'start', 'seed': N} before any action"}
            page.click("#start")
            # the scripted player: hold right, then left, serving with space now and then
            for i in range(2000):
                if page.evaluate("window.playPage.games.length") > 0:
                    break
                key = "ArrowRight" if (i // 10) % 2 == 0 else "ArrowLeft"
                serve = i % 5 == 0  # held for the wait, so a step reads it (a bare press falls between steps)
                page.keyboard.down(key)
                if serve:
                    page.keyboard.down(" ")
                page.wait_for_timeout(40)
                page.keyboard.up(key)
                if serve:
                    page.keyboard.up(" ")
            page.wait_for_function("window.playPage.games.length > 0", timeout=120_000)
            shown = page.evaluate("window.playPage.games[0]")
            last = page.evaluate("window.playPage.lastState")
            page_text = page.inner_text("#games")
        finally:
            browser.close()
            chromium.release()
    assert not errors
    with store.reader() as con:
        rows = con.execute("SELECT * FROM play_games").df().to_dict("records")
    assert len(rows) == 1
    row = rows[0]
    assert row["game_id"] == shown["game_id"] and row["seed"] == 5 == shown["seed"]
    assert row["contract_hash"] == contract.hash != Contract().hash
    for side in ("human", "agent"):
        assert row[f"{side}_score"] == shown[f"{side}_score"] == last[side]["score"]
        assert row[f"{side}_steps"] == shown[f"{side}_steps"] == last[side]["steps"]
        assert row[f"{side}_ended_by"] == last[side]["ended_by"] in ("game_over", "time_limit")
        assert sum(json.loads(row[f"{side}_actions"]).values()) == row[f"{side}_steps"]
    human_actions = json.loads(row["human_actions"])
    assert human_actions["RIGHT"] > 0 and human_actions["LEFT"] > 0 and human_actions["FIRE"] > 0
    if row["human_ended_by"] == "game_over":
        assert last["human"]["lives"] == 0
    if row["agent_ended_by"] == "time_limit":
        assert row["agent_steps"] == contract.max_episode_frames // contract.frame_skip
    assert f"{row['human_score']:g}" in page_text and row["model_sha256"] == shown["model_sha256"]


@pytest.mark.browser
def test_runner_play_serves_the_page_and_refuses_a_missing_model(tmp_path):
    import time
    import urllib.request

    missing = subprocess.run([sys.executable, "-m", "runner", "play", "--model", str(tmp_path / "none.onnx")],
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    process = subprocess.Popen([sys.executable, "-m", "runner", "play", "--port", "0", "--seed", "7",
                                "--db", str(tmp_path / "play.duckdb")], stdout=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        assert line.startswith("play page: http://127.0.0.1:"), line
        url = line.split()[2]
        page = urllib.request.urlopen(url, timeout=10)
        assert page.headers["Cross-Origin-Embedder-Policy"] == "require-corp" and b"Breakout" in page.read()
        config = json.load(urllib.request.urlopen(url.replace("/play.html", "/play/config.json"), timeout=10))
        assert config["seed"] == 7 and config["provider"] == "wasm" and len(config["model_sha256"]) == 64
    finally:
        process.terminate()
        started = time.monotonic()
        while process.poll() is None and time.monotonic() - started < 10:
            time.sleep(0.1)
        if process.poll() is None:
            process.kill()
