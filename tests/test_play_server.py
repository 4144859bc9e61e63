"""The play server's WebSocket against hostile or heavy use: a seed the store cannot hold,
nested and oversized messages, and many players starting games at once."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest

from breakout_core.contract import Contract
from runner.play import PlayServer
from runner.store import Store

MODEL = Path(__file__).resolve().parent.parent / "models" / "reference" / "dqn_breakout.onnx"


@pytest.fixture
def server(tmp_path):
    with PlayServer(Store(tmp_path / "play.duckdb"), MODEL, Contract(), port=0, pace_ms=0) as running:
        yield running


async def _replies(server: PlayServer, messages: list[str]) -> list[dict]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(server.server.url("/play/ws").replace("http", "ws")) as ws:
            replies = []
            for message in messages:
                await ws.send_str(message)
                replies.append(json.loads((await ws.receive(timeout=60)).data))
            return replies


@pytest.mark.parametrize("message, mentions", [
    ({"type": "start", "seed": 2 ** 63}, "seed must be an integer from 0 to 2147483647"),
    ({"type": "start", "seed": 2 ** 31}, "seed must be an integer from 0 to 2147483647"),  # ALE's seed: 32 bits
    ({"type": "start", "seed": -1}, "seed must be an integer from 0"),
    ({"type": "start", "seed": 1.5}, "seed must be an integer"),
    ("[" * 2_000 + "]" * 2_000, "nested"),
    ({"type": "act", "human_action": "x" * 100_000, "agent_action": 0}, "bytes"),
], ids=["seed-2^63", "seed-2^31", "negative", "float", "nested", "oversized"])
def test_a_bad_message_gets_one_line_and_the_server_goes_on(server, caplog, message, mentions):
    text = message if isinstance(message, str) else json.dumps(message)
    with caplog.at_level(logging.WARNING):
        error, after = asyncio.run(_replies(server, [text, json.dumps({"type": "start", "seed": 3})]))
    assert error["type"] == "error" and mentions in error["message"] and "\n" not in error["message"]
    assert after["type"] == "state" and after["seed"] == 3  # the same connection still plays
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


def test_starting_games_leaves_the_server_answering(server):
    """Twenty players start a game at once; config.json is answered while most of their games
    are still being set up, not after them all."""
    import aiohttp

    players = 20

    async def scenario() -> int:
        async with aiohttp.ClientSession() as session:
            sockets = [await session.ws_connect(server.server.url("/play/ws").replace("http", "ws"))
                       for _ in range(players)]
            started: list[int] = []

            async def start(i: int, ws) -> None:
                await ws.send_json({"type": "start", "seed": i})
                assert (await ws.receive_json(timeout=300))["type"] == "state"
                started.append(i)

            tasks = [asyncio.create_task(start(i, ws)) for i, ws in enumerate(sockets)]
            await asyncio.sleep(0)  # the starts are sent first
            async with session.get(server.server.url("/play/config.json")) as response:
                assert (await response.json())["seed"] == 0
                answered_after = len(started)
            await asyncio.gather(*tasks)
            for ws in sockets:
                await ws.close()
            return answered_after

    assert asyncio.run(scenario()) <= players // 2
