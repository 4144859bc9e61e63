"""`runner play`: a person plays Breakout in the browser beside the agent, on the same seed.

The games run in the real ALE here, in the server, on the episode driver: one game for the
person, one for the agent, both episode `seed` of the contract, as in every evaluation.
Over a WebSocket the page receives, each agent step, both screens (the game's RGB frame,
as a PNG) and the agent's 4-frame 84x84 observation; it computes the agent's
Q-values with onnxruntime-web in the page, reads the person's keys, and sends both actions
back. The page paces the steps (15 a second by default: one agent step is 4 frames of a
60 Hz game). When both games are over the server stores one row in `play_games`, with
status `finished`. A start while this socket's game is still on replaces it: the game left
is stored with status `abandoned` (each unfinished side's `ended_by` is `abandoned`) and
the page is told so before the new game's first state. A game left by closing the page is
not stored. An act names the game it is for; one for a game this socket no longer plays
(sent just before a start) is dropped unanswered, so one game is stepped by one loop.

The agent's score is only as honest as the actions the page sends, so the server runs the
same ONNX model with onnxruntime on the CPU on each observation it sent and counts the steps
where the page's action is not that model's argmax (`agent_actions_unlike_cpu`). It plays
the page's action all the same: two runtimes may rank near-equal Q-values differently, so
a count above zero is evidence to look at, not proof of a forged game.

At most MAX_OPEN_GAMES games are open at once (each holds two emulators), and a game that
gets no message for `idle_timeout_s` is closed. The server starts only on a database it can
store games in (not damaged, unreadable or written by a newer runner). A finished game whose
row cannot be appended, for whatever reason (another process holds the database past
STORE_WAIT_S, or the file went bad while the server ran), is spooled beside it and appended
once the file takes it: after the next game stored, when the server stops, or by the next
runner command that writes to the database; each spooled game goes in once. A game that can
be neither appended nor spooled (the spool folder cannot be written) is held in the server's
memory, the page told so, and tried again, appended or else spooled, at each start of a game,
after each game and when the server stops; one still held then is written to the log whole.

Protocol (JSON text messages):
    page -> server  {"type": "start", "seed": int}
                    {"type": "act", "human_action": 0-3, "agent_action": 0-3, "game_id": str}
                    (indices into config's `actions`, the contract's set: 0-17 under full_action_space;
                    game_id optional; an act for another game than this socket's is dropped)
    server -> page  {"type": "state", ...both sides...}    after start and each act
                    {"type": "abandoned", "game": {...the row...}, "stored": ..., "stored_reason": ...}
                                                           a start replaced a game still on
                    {"type": "over", ...both sides' last views..., "game": {...the row...},
                     "stored": "now" | "later" | "held", "stored_reason": null | str}
                    {"type": "error", "message": str}      a bad message (nothing is stepped),
                                                           a refused start, or why the socket closes
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import threading
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import cv2
import numpy as np

from breakout_core.common.messages import first_line
from breakout_core.game.contract import Contract
from breakout_core.game.driver import EpisodeDriver
from breakout_core.runtimes.base import Runtime
from breakout_core.runtimes.registry import make_runtime
from runner.spec.fields import MAX_SEED
from runner.store import schema
from runner.store.database import Store, utcnow
from runner.store.errors import StoreBusy

log = logging.getLogger(__name__)

MAX_MESSAGE_BYTES = 4096  # a start or act message is a few dozen bytes
MAX_OPEN_GAMES = 8  # each holds two ALE emulators: 400 idle games took a server from 252 to 834 MB
IDLE_TIMEOUT_S = 300.0  # a page steps 15 times a second; one silent for 5 minutes is gone
STORE_WAIT_S = 3.0  # how long a finished game waits for a busy database before it is spooled
SPOOL = "play"  # the spool folder of the play server's rows (Store.spool's run id)

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
    ),
    (
        # NULL in games stored before the server checked the page's actions
        "0901_play_games_agent_source",
        """
        ALTER TABLE play_games ADD COLUMN agent_actions_from VARCHAR;
        ALTER TABLE play_games ADD COLUMN agent_actions_unlike_cpu INTEGER;
        """,
    ),
    (
        # 'finished': both games ended; 'abandoned': a new game was started while this one was on
        "0902_play_games_status",
        """
        ALTER TABLE play_games ADD COLUMN status VARCHAR DEFAULT 'finished';
        """,
    ),
]
FINISHED, ABANDONED = "finished", "abandoned"

schema.declare("play", MIGRATIONS)


@dataclass
class Side:
    """One game in the ALE, the person's or the agent's, on a one-slot episode driver."""

    driver: EpisodeDriver
    score: float = 0.0
    steps: int = 0
    ended_by: str | None = None
    actions: np.ndarray = field(init=False)  # per action of the contract's set, as played

    def __post_init__(self) -> None:
        self.actions = np.zeros(self.driver.contract.num_actions, dtype=np.int64)

    @classmethod
    def start(cls, contract: Contract, seed: int) -> Side:
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
        return json.dumps({name: int(n) for name, n in zip(self.driver.contract.action_names, self.actions)})


class PlayGame:
    """The person's and the agent's games on one seed; `cpu_model` checks the page's agent actions."""

    def __init__(self, contract: Contract, seed: int, cpu_model: Runtime):
        self.contract, self.seed, self.cpu_model = contract, seed, cpu_model
        self.game_id = uuid.uuid4().hex[:12]
        self.started_at = utcnow()
        self.human = Side.start(contract, seed)
        self.agent = Side.start(contract, seed)
        self.agent_unlike_cpu = 0  # steps where the page's agent action was not the CPU model's

    @property
    def over(self) -> bool:
        return self.human.done and self.agent.done

    def step(self, human_action: int, agent_action: int) -> None:
        if not self.human.done:
            self.human.step(human_action)
        if not self.agent.done:
            # the observation the last state sent: the page's action should be its argmax
            q = self.cpu_model.infer(self.agent.driver.obs[:1])[0]
            self.agent_unlike_cpu += int(agent_action != int(np.argmax(q)))
            self.agent.step(agent_action)

    def state(self) -> dict[str, Any]:
        return {"type": "state", "game_id": self.game_id, "seed": self.seed,
                "human": self.human.view(with_obs=False), "agent": self.agent.view(with_obs=True)}

    def row(self, model_path: Path, model_sha256: str, provider: str) -> dict[str, Any]:
        """The game's row: finished when both sides are over, else abandoned (its open sides too)."""
        status = FINISHED if self.over else ABANDONED
        return {
            "game_id": self.game_id, "started_at": self.started_at, "finished_at": utcnow(), "seed": self.seed,
            "contract_hash": self.contract.hash, "contract": json.dumps(self.contract.to_dict()),
            "model_path": str(model_path), "model_sha256": model_sha256, "provider": provider,
            "human_score": self.human.score, "human_steps": self.human.steps,
            "human_ended_by": self.human.ended_by or ABANDONED, "human_actions": self.human.action_counts(),
            "agent_score": self.agent.score, "agent_steps": self.agent.steps,
            "agent_ended_by": self.agent.ended_by or ABANDONED, "agent_actions": self.agent.action_counts(),
            "agent_actions_from": f"page: onnxruntime-web {provider}",
            "agent_actions_unlike_cpu": self.agent_unlike_cpu,
            "status": status,
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
        raise ValueError("a message must be a JSON object")  # every bad message is a ValueError
    return message


def _seed(message: dict) -> int:
    seed = message.get("seed")
    if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed <= MAX_SEED:
        raise ValueError(f"seed must be an integer from 0 to {MAX_SEED}, got {seed!r}")
    return seed


def _action(message: dict, key: str, names: tuple[str, ...]) -> int:
    """The action `key` of a page's message: an index into the contract's action set (`names`)."""
    value = message.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < len(names):
        raise ValueError(f"{key} must be an integer 0..{len(names) - 1} ({', '.join(names)}), got {value!r}")
    return value


class PlayServer:
    """The page, the model and the game WebSocket on 127.0.0.1; finished games go to `store`."""

    def __init__(self, store: Store, model: Path, contract: Contract, *, provider: str = "wasm", seed: int = 0,
                 port: int = 0, pace_ms: float = 1000 / 15, idle_timeout_s: float = IDLE_TIMEOUT_S):
        self.store, self.model, self.contract = store, Path(model), contract
        # one thread: a batch-1 inference takes well under a millisecond, and games run side by side
        self.cpu_model = make_runtime("onnxruntime", provider="cpu", node_placement=False,
                                      intra_op_threads=1).load(self.model)
        self.model_sha256 = self.cpu_model.artifact_sha256
        self.provider, self.seed, self.port, self.pace_ms = provider, seed, port, pace_ms
        self.idle_timeout_s = idle_timeout_s
        self.quick_store = Store(store.path, busy_timeout_s=STORE_WAIT_S)  # a game's row waits this long
        self.open_games = 0  # sockets with a game open or being set up, at most MAX_OPEN_GAMES
        self.held: list[dict[str, Any]] = []  # rows neither appended nor spooled, tried again later
        self._held_lock = threading.Lock()  # rows are stored from worker threads
        self.server = None

    def config(self) -> dict[str, Any]:
        return {"model": "/artifact/model.onnx", "provider": self.provider, "seed": self.seed,
                "pace_ms": self.pace_ms, "actions": list(self.contract.action_names),
                "contract_hash": self.contract.hash, "model_sha256": self.model_sha256}

    async def _config(self, request):
        from aiohttp import web

        return web.json_response(self.config())

    async def _games(self, request):
        from aiohttp import WSMsgType, web

        # larger than this, aiohttp closes the socket (1009); up to it, _parse answers with an error
        ws = web.WebSocketResponse(max_msg_size=1 << 20)
        await ws.prepare(request)
        game: PlayGame | None = None
        seated = False  # this socket counts in open_games: its game is open or being set up
        try:
            while True:
                try:
                    msg = await ws.receive(timeout=self.idle_timeout_s if seated else None)
                except TimeoutError:
                    await ws.send_json(_error(f"the game was closed for inactivity: no message for "
                                              f"{self.idle_timeout_s:g} s; reload the page to play again"))
                    break
                if msg.type == WSMsgType.BINARY:
                    await ws.send_json(_error("binary frames are not accepted; send JSON text messages"))
                    continue
                if msg.type != WSMsgType.TEXT:
                    break
                try:
                    message = _parse(msg.data)
                    kind = message.get("type")
                    if kind == "start":
                        seed = _seed(message)
                        if self.held:
                            await asyncio.to_thread(self.store_held)
                        if not seated:
                            if self.open_games >= MAX_OPEN_GAMES:
                                raise ValueError(f"{MAX_OPEN_GAMES} games are open, the most this server plays "
                                                 "at once; finish one or try later")
                            self.open_games, seated = self.open_games + 1, True
                        if game is not None:  # a start replaces this socket's game: stored as abandoned
                            await ws.send_json(await self._over(game, "abandoned"))
                        game = None  # its emulators go before the new game's are made
                        # two emulators set up and played through the no-op start: off the event loop,
                        # which serves every other player and page meanwhile
                        game = await asyncio.to_thread(PlayGame, self.contract, seed, self.cpu_model)
                        await ws.send_json(await asyncio.to_thread(game.state))
                    elif kind == "act":
                        if "game_id" in message and (game is None or message["game_id"] != game.game_id):
                            continue  # sent for a game this socket left: dropped, so no second loop steps
                        if game is None:
                            raise ValueError("send {'type': 'start', 'seed': N} before any action")
                        names = self.contract.action_names
                        game.step(_action(message, "human_action", names), _action(message, "agent_action", names))
                        if game.over:
                            over = await self._over(game)
                            game, seated, self.open_games = None, False, self.open_games - 1
                            await ws.send_json(over)
                        else:
                            await ws.send_json(game.state())
                    else:
                        raise ValueError(f"unknown message type {kind!r}; expected 'start' or 'act'")
                except ValueError as exc:
                    await ws.send_json(_error(str(exc)))
        except Exception as exc:  # never a silent close: the page is told why its game ends
            log.exception("play server: a game failed")
            with contextlib.suppress(ConnectionError):
                await ws.send_json(_error(f"the server failed ({first_line(exc)}); this game is closed"))
        finally:
            if seated:
                self.open_games -= 1
            await ws.close()
        return ws

    async def _over(self, game: PlayGame, kind: str = "over") -> dict[str, Any]:
        """A finished (or abandoned) game's last message, once its row is stored or kept to be stored later."""
        row = game.row(self.model, self.model_sha256, self.provider)
        stored, reason = await asyncio.to_thread(self._store, row)
        return {**game.state(), "type": kind, "game": _jsonable(row), "stored": stored, "stored_reason": reason}

    def check_database(self) -> None:
        """Refuse (StoreError) a database no game could be stored in: damaged, unreadable, or
        written by a newer runner. One that another process holds is fine: games wait for it."""
        try:
            self.quick_store.verify_readable()
            with self.quick_store.writer():  # this runner's tables, and the version check
                pass
        except StoreBusy as exc:
            log.warning("%s: finished games are kept beside it until it is free", first_line(exc))

    def _store(self, row: dict[str, Any]) -> tuple[str, str | None]:
        """Append a finished game's row: ("now", None); or, where it cannot be appended (another
        process holds the database past STORE_WAIT_S, or the file cannot be written), spool it
        to be appended later: ("later", why); or, where it cannot be spooled either, hold it
        here to be tried again: ("held", why)."""
        try:
            self.quick_store.append_rows("play_games", [row])
        except Exception as exc:  # noqa: BLE001 -- whatever keeps the row out, the game is kept
            self._file_failed(exc)
            try:
                path = self.store.spool(SPOOL, "play_games", [row])
            except Exception as spool_exc:  # noqa: BLE001 -- held in memory instead, and said so
                with self._held_lock:
                    self.held.append(row)
                why = f"{first_line(exc)}; its spool folder: {first_line(spool_exc)}"
                log.warning("game %s held in memory until the database or its spool folder takes it: %s",
                            row["game_id"], why)
                return "held", why
            log.warning("game %s kept in %s until the database takes it: %s", row["game_id"], path, first_line(exc))
            return "later", first_line(exc)
        self.append_spooled()  # the database takes rows: games kept earlier go in too
        return "now", None

    def store_held(self) -> int:
        """Append the games held in memory, or else spool them; those neither takes stay held.
        The rows appended or spooled."""
        with self._held_lock:
            rows, self.held = self.held, []
        if not rows:
            return 0
        try:
            self.quick_store.append_rows("play_games", rows)
        except Exception as exc:  # noqa: BLE001 -- spooled instead, or held on
            self._file_failed(exc)
            try:
                self.store.spool(SPOOL, "play_games", rows)
            except Exception as spool_exc:  # noqa: BLE001 -- held on, for the next try
                with self._held_lock:
                    self.held[:0] = rows
                log.warning("%d game(s) still held in memory: %s; its spool folder: %s", len(rows),
                            first_line(exc), first_line(spool_exc))
                return 0
        log.info("%d game(s) held in memory are stored or spooled", len(rows))
        return len(rows)

    def append_spooled(self) -> int:
        """Append the games kept while the database could not take them, unless it still cannot;
        the rows appended. Games held in memory are tried first."""
        self.store_held()
        if not (self.store.spool_root / SPOOL).is_dir():
            return 0
        try:
            with self.quick_store.writer() as con:
                return self.quick_store.append_spooled(con, SPOOL)
        except Exception as exc:  # noqa: BLE001 -- they stay kept, for the next try
            self._file_failed(exc)
            log.warning("games kept in %s stay there: %s", self.store.spool_root / SPOOL, first_line(exc))
            return 0

    def _file_failed(self, exc: Exception) -> None:
        """After an error other than a busy file, the next append opens the file as new: it may
        have been replaced or repaired meanwhile, and needs this runner's tables made again."""
        if not isinstance(exc, StoreBusy):
            self.quick_store = Store(self.store.path, busy_timeout_s=STORE_WAIT_S)

    def start(self) -> Self:
        from breakout_core.browser.server import PageServer

        self.check_database()
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
            self.append_spooled()
            if self.held:  # the last place these games are: the log
                log.warning("%d game(s) could be neither stored in %s nor spooled; their rows: %s", len(self.held),
                            self.store.path, json.dumps(self.held, default=str))

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _error(message: str) -> dict[str, str]:
    return {"type": "error", "message": message}


def _jsonable(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (v.isoformat() if hasattr(v, "isoformat") else json.loads(v) if k.endswith("actions") else v)
            for k, v in row.items() if k != "contract"}
