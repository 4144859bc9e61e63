"""`runner play`: a person plays Breakout in the browser beside the agent, on the same seed.

The games run in the real ALE here, in the server, on the episode driver: one game for the
person, one for the agent, both episode `seed` of the contract, as in every evaluation.
Over a WebSocket the page receives, each agent step, both screens (the game's RGB frame,
as a PNG) and the agent's 4-frame 84x84 observation; it computes the agent's
Q-values with onnxruntime-web in the page, reads the person's keys, and sends both actions
back. The page paces the steps (15 a second by default: one agent step is 4 frames of a
60 Hz game). When both games are over the server stores one row in `play_games`.

Protocol (JSON text messages):
    page -> server  {"type": "start", "seed": int}
                    {"type": "act", "human_action": 0-3, "agent_action": 0-3}
    server -> page  {"type": "state", ...both sides...}    after start and each act
                    {"type": "over", ...both sides' last views..., "game": {...the stored row...}}
                    {"type": "error", "message": str}      a bad message; nothing is stepped
"""

from __future__ import annotations

import base64
import json
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import cv2

from breakout_core.contract import Contract
from breakout_core.driver import EpisodeDriver
from breakout_core.envs import ACTION_NAMES, NUM_ACTIONS
from runner import schema
from runner.spec_base import MAX_SEED

MAX_MESSAGE_BYTES = 4096  # a start or act message is a few dozen bytes

MIGRATIONS = [
    (
        "0900_play_games",
        """
        CREATE TABLE play_games (
            game_id VARCHAR PRIMARY KEY, started_at TIMESTAMPTZ NOT NULL, finished_at TIMESTAMPTZ NOT NULL,
            seed BIGINT NOT NULL, contract_hash VARCHAR NOT NULL, contract JSON NOT NULL,
            model_path VARCHAR NOT NULL, model_sha256 VARCHAR NOT NULL, provider VARCHAR NOT NULL,
            human_score DOUBLE NOT NULL, human_steps INTEGER NOT NULL, human_ended_by VARCHAR NOT NULL,
            human_actions JSON NOT NULL,
            agent_score DOUBLE NOT NULL, agent_steps INTEGER NOT NULL, agent_ended_by VARCHAR NOT NULL,
            agent_actions JSON NOT NULL
        );
        """,
    )
]

schema.declare("play", MIGRATIONS)


@dataclass
class Side:
    """One game in the ALE, the person's or the agent's, on a one-slot episode driver."""

    driver: EpisodeDriver
    score: float = 0.0
    steps: int = 0
    ended_by: str | None = None
    actions: np.ndarray = field(default_factory=lambda: np.zeros(NUM_ACTIONS, dtype=np.int64))

    @classmethod
    def start(cls, contract: Contract, seed: int) -> "Side":
        driver = EpisodeDriver(contract, 1)
        driver.start(0, seed)
        side = cls(driver=driver)
        while driver.forced()[0]:  # the contract's no-op start, the same for both sides
            side.step(0)
        return side

    @property
    def done(self) -> bool:
        return self.ended_by is not None

    def step(self, action: int) -> None:
        """One agent step; the contract's forced actions (a serve after a lost life) replace `action`."""
        result = self.driver.step(np.array([action], dtype=np.int64))
        played = int(result.actions[0])
        self.score += float(result.reward[0])
        self.steps += 1
        self.actions[played] += 1
        if result.finished:
            self.ended_by = result.finished[0].ended_by

    def view(self, with_obs: bool) -> dict[str, Any]:
        """The screen as the person sees it (the game's RGB frame, PNG), and the agent's own
        4-frame observation for the page's model."""
        game = self.driver.games[0]
        png = cv2.imencode(".png", cv2.cvtColor(game.rgb(), cv2.COLOR_RGB2BGR))[1]
        out = {"screen": base64.b64encode(png.tobytes()).decode("ascii"), "score": self.score,
               "lives": game.lives, "steps": self.steps, "done": self.done, "ended_by": self.ended_by}
        if with_obs and not self.done:
            out["obs"] = base64.b64encode(self.driver.obs[0].tobytes()).decode("ascii")
        return out

    def action_counts(self) -> str:
        return json.dumps({name: int(n) for name, n in zip(ACTION_NAMES, self.actions)})


class PlayGame:
    """The person's and the agent's games on one seed."""

    def __init__(self, contract: Contract, seed: int):
        from runner.store import utcnow

        self.contract, self.seed = contract, seed
        self.game_id = uuid.uuid4().hex[:12]
        self.started_at = utcnow()
        self.human = Side.start(contract, seed)
        self.agent = Side.start(contract, seed)

    @property
    def over(self) -> bool:
        return self.human.done and self.agent.done

    def step(self, human_action: int, agent_action: int) -> None:
        if not self.human.done:
            self.human.step(human_action)
        if not self.agent.done:
            self.agent.step(agent_action)

    def state(self) -> dict[str, Any]:
        return {"type": "state", "game_id": self.game_id, "seed": self.seed,
                "human": self.human.view(with_obs=False), "agent": self.agent.view(with_obs=True)}

    def row(self, model_path: Path, model_sha256: str, provider: str) -> dict[str, Any]:
        from runner.store import utcnow

        return {
            "game_id": self.game_id, "started_at": self.started_at, "finished_at": utcnow(), "seed": self.seed,
            "contract_hash": self.contract.hash, "contract": json.dumps(self.contract.to_dict()),
            "model_path": str(model_path), "model_sha256": model_sha256, "provider": provider,
            "human_score": self.human.score, "human_steps": self.human.steps, "human_ended_by": self.human.ended_by,
            "human_actions": self.human.action_counts(),
            "agent_score": self.agent.score, "agent_steps": self.agent.steps, "agent_ended_by": self.agent.ended_by,
            "agent_actions": self.agent.action_counts(),
        }


def _parse(data: str) -> dict:
    """A page message as a JSON object; ValueError, with the reason in one line, for anything else."""
    size = len(data.encode())
    if size > MAX_MESSAGE_BYTES:
        raise ValueError(f"a message of {size} bytes; messages are at most {MAX_MESSAGE_BYTES}")
    try:
        message = json.loads(data)
    except RecursionError:
        raise ValueError("a message nested too deeply; messages are flat JSON objects") from None
    if not isinstance(message, dict):
        raise ValueError("a message must be a JSON object")
    return message


def _seed(message: dict) -> int:
    seed = message.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be an integer from 0 to {MAX_SEED}, got {seed!r}")
    return seed


def _action(message: dict, key: str) -> int:
    value = message.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < NUM_ACTIONS:
        raise ValueError(f"{key} must be an integer 0..{NUM_ACTIONS - 1} ({', '.join(ACTION_NAMES)}), got {value!r}")
    return value


class PlayServer:
    """The page, the model and the game WebSocket on 127.0.0.1; finished games go to `store`."""

    def __init__(self, store, model: Path, contract: Contract, *, provider: str = "wasm", seed: int = 0,
                 port: int = 0, pace_ms: float = 1000 / 15):
        from breakout_core.hashing import file_sha256

        self.store, self.model, self.contract = store, Path(model), contract
        self.model_sha256 = file_sha256(self.model)
        self.provider, self.seed, self.port, self.pace_ms = provider, seed, port, pace_ms
        self.server = None

    def config(self) -> dict[str, Any]:
        return {"model": "/artifact/model.onnx", "provider": self.provider, "seed": self.seed,
                "pace_ms": self.pace_ms, "actions": list(ACTION_NAMES), "contract_hash": self.contract.hash,
                "model_sha256": self.model_sha256}

    async def _config(self, request):
        from aiohttp import web

        return web.json_response(self.config())

    async def _games(self, request):
        import asyncio

        from aiohttp import WSMsgType, web

        # larger than this, aiohttp closes the socket (1009); up to it, _parse answers with an error
        ws = web.WebSocketResponse(max_msg_size=1 << 20)
        await ws.prepare(request)
        loop = asyncio.get_running_loop()
        game: PlayGame | None = None
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            try:
                message = _parse(msg.data)
                kind = message.get("type")
                if kind == "start":
                    # two emulators set up and played through the no-op start: off the event loop,
                    # which serves every other player and page meanwhile
                    game = await asyncio.to_thread(PlayGame, self.contract, _seed(message))
                    await ws.send_json(await asyncio.to_thread(game.state))
                elif kind == "act":
                    if game is None:
                        raise ValueError("send {'type': 'start', 'seed': N} before any action")
                    game.step(_action(message, "human_action"), _action(message, "agent_action"))
                    if game.over:
                        row = game.row(self.model, self.model_sha256, self.provider)
                        await loop.run_in_executor(None, self.store.append_rows, "play_games", [row])
                        final = game.state()
                        game = None
                        await ws.send_json({**final, "type": "over", "game": _jsonable(row)})
                    else:
                        await ws.send_json(game.state())
                else:
                    raise ValueError(f"unknown message type {kind!r}; expected 'start' or 'act'")
            except ValueError as exc:
                await ws.send_json({"type": "error", "message": str(exc)})
        return ws

    def start(self) -> "PlayServer":
        from breakout_core.browser.server import PageServer

        self.server = PageServer(files={"/artifact/model.onnx": self.model},
                                 routes={"/play/config.json": self._config, "/play/ws": self._games},
                                 port=self.port).start()
        return self

    def url(self) -> str:
        return self.server.url("/play.html")

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None

    def __enter__(self) -> "PlayServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else json.loads(v) if k.endswith("actions") else v)
            for k, v in row.items() if k != "contract"}
