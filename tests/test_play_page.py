"""The play page in headless Chromium: Start pressed three times during a game leaves one step
loop and no game lost silently; a page before its first game; a key tapped between two steps;
the Q-value bars' scale; the person's game over while the agent plays on; and an 18-action model
under full_action_space, with a bar per action and keys mapped by the actions' names."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from breakout_core.game.contract import FULL_ACTION_NAMES, Contract
from runner.play.server import PlayServer
from runner.store.database import Store

MODEL = Path(__file__).resolve().parent.parent / "models" / "reference" / "dqn_breakout.onnx"
PACE_MS = 50  # 20 steps a second at most, with one loop

pytestmark = [pytest.mark.browser]


@pytest.fixture
def browser():
    from breakout_core.browser import chromium

    launched = chromium.launch()
    yield launched
    launched.close()
    chromium.release()


def _open(browser, server: PlayServer, pace_ms: float):
    page = browser.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url() + f"?pace_ms={pace_ms}&seed=2")
    page.wait_for_function("window.playPage && window.playPage.ready", timeout=60_000)
    return page, errors


def _steps_per_s(page, seconds: float = 2.0) -> float:
    before = page.evaluate("window.playPage.steps")
    page.wait_for_timeout(seconds * 1000)
    return (page.evaluate("window.playPage.steps") - before) / seconds


def test_start_three_times_during_a_game_leaves_one_loop_and_stores_the_games_left(tmp_path, browser):
    store = Store(tmp_path / "play.duckdb")
    with PlayServer(store, MODEL, Contract(), port=0) as server:
        page, errors = _open(browser, server, PACE_MS)
        # before the first game: placeholders that load (no broken image), and a prompt
        for screen in ("#human", "#agent"):
            assert page.evaluate(f"document.querySelector('{screen}').naturalWidth") > 0
        assert "press Start" in page.inner_text("#status")
        page.keyboard.press(" ")  # space starts the first game
        page.wait_for_function("window.playPage.steps > 5", timeout=60_000)
        rates = []
        for _ in range(3):
            page.click("#start")
            page.wait_for_timeout(1000)  # the new game set up and under way
            rates.append(_steps_per_s(page))
        shown = page.evaluate("window.playPage.games")
        most_acting = page.evaluate("window.playPage.mostActing")
        table = page.inner_text("#games")
        page.close()
    assert not errors
    assert most_acting == 1  # never two steps computed at once: one loop
    assert max(rates) <= 1000 / PACE_MS * 1.1, rates  # two loops would step twice as fast
    assert [g["status"] for g in shown] == ["abandoned"] * 3 and table.count("abandoned") >= 3
    with store.reader() as con:
        stored = con.execute("SELECT game_id, status FROM play_games ORDER BY started_at").fetchall()
    assert stored == [(g["game_id"], "abandoned") for g in shown]  # every game left is stored, as abandoned


def test_the_q_bars_start_at_zero_and_a_tap_between_steps_counts(tmp_path, browser):
    with PlayServer(Store(tmp_path / "play.duckdb"), MODEL, Contract(), port=0) as server:
        page, errors = _open(browser, server, 400)  # steps 400 ms apart: taps fall between them
        bars = page.evaluate("import('/play_view.js').then((m) => m.qBars([1.5649, 1.6093, -0.4, 0.8]))")
        latched = page.evaluate("""import('/play_view.js').then((m) => {
            const latch = new m.KeyLatch(['NOOP', 'FIRE', 'RIGHT', 'LEFT']);
            latch.down('ArrowLeft'); latch.up('ArrowLeft');
            const tapped = latch.take();
            latch.down('ArrowRight');
            return [tapped, latch.take(), latch.take()];
        })""")
        page.click("#start")
        page.wait_for_function("window.playPage.steps > 1", timeout=60_000)
        for _ in range(3):  # each tap 20 ms, well inside the 400 ms between two steps
            page.keyboard.down("ArrowLeft")
            page.wait_for_timeout(20)
            page.keyboard.up("ArrowLeft")
            page.wait_for_timeout(500)
        left = page.evaluate("window.playPage.humanActions.LEFT")
        # one evaluate reads bars, values and scale together: the page steps every 400 ms, and
        # reads spread over several calls could straddle a step and pair one step's bars with
        # the next step's values
        shown = page.evaluate("""({
            widths: [...document.querySelectorAll('#q .bar')].map((b) => parseFloat(b.style.width)),
            values: [...document.querySelectorAll('#q .value')].map((v) => v.textContent),
            scale: document.querySelector('#q-scale').innerText,
        })""")
        widths, values, scale = shown["widths"], [float(v) for v in shown["values"]], shown["scale"]
        page.close()
    assert not errors
    assert bars["top"] == 1.6093 and [b["negative"] for b in bars["bars"]] == [False, False, True, False]
    assert [round(b["percent"], 2) for b in bars["bars"]] == [97.24, 100.0, 24.86, 49.71]
    assert latched == [3, 2, 2]  # a tap counts once, at the next step; a held key every step
    assert left == 3
    top = max(abs(v) for v in values)
    assert widths == pytest.approx([100 * abs(v) / top for v in values], abs=0.05)
    assert scale.startswith(f"bar length: Q-value on a scale from 0 to {top:.4f}")


@pytest.mark.slow
def test_the_page_says_the_agent_plays_on_after_the_persons_game_ends(tmp_path, browser):
    store = Store(tmp_path / "play.duckdb")
    with PlayServer(store, MODEL, Contract(), port=0) as server:
        page, errors = _open(browser, server, 0)
        page.click("#start")
        page.wait_for_function("window.playPage.steps > 0", timeout=60_000)
        page.keyboard.down(" ")  # serve at every step and never move: the person loses every life
        page.wait_for_function("window.playPage.lastState && window.playPage.lastState.human.done", timeout=240_000)
        page.keyboard.up(" ")
        last = page.evaluate("window.playPage.lastState")
        banner = page.is_visible("#human-banner")
        status = page.inner_text("#status")
        page.close()
    assert not errors
    assert last["human"]["ended_by"] == "game_over" and not last["agent"]["done"]
    assert banner and "the agent is still playing" in status


def test_an_18_action_model_plays_with_a_bar_per_action_and_keys_by_name(tmp_path, browser):
    from user_exports import cleanrl_onnx

    from breakout_core.conversion.input_convention import InputConvention, write_adapted

    full18 = cleanrl_onnx(tmp_path / "full18.onnx", dynamic_batch=True, actions=18)  # float input, as CleanRL's
    model = write_adapted(full18, InputConvention.parse("float32:0-255:nchw"), tmp_path / "full18_uint8.onnx",
                          np.zeros((1, 4, 84, 84), np.uint8)).path
    store = Store(tmp_path / "play.duckdb")
    with PlayServer(store, model, Contract(full_action_space=True), port=0) as server:
        page, errors = _open(browser, server, 100)
        page.click("#start")
        page.wait_for_function("window.playPage.steps > 3", timeout=60_000)
        page.keyboard.down("ArrowLeft")
        page.wait_for_function("window.playPage.humanActions.LEFT > 2", timeout=60_000)
        page.keyboard.up("ArrowLeft")
        names = page.evaluate("[...document.querySelectorAll('#q > span:not(.track):not(.value)')]"
                              ".map((s) => s.textContent)")
        counted = page.evaluate("Object.keys(window.playPage.humanActions)")
        page.click("#start")  # the game is retired and stored as abandoned, with its counts
        page.wait_for_function("window.playPage.games.length > 0", timeout=60_000)
        page.close()
    assert not errors
    assert names == list(FULL_ACTION_NAMES) and counted == list(FULL_ACTION_NAMES)
    with store.reader() as con:
        human, unlike = con.execute("SELECT human_actions, agent_actions_unlike_cpu FROM play_games").fetchone()
    assert json.loads(human)["LEFT"] > 2 and unlike == 0  # the page's 18-way argmax is the CPU model's
