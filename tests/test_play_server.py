"""The play server against hostile or heavy use: other web sites (a foreign or `null` Origin,
a rebinding Host), a seed the store cannot hold, nested, oversized and binary messages, more
players than it plays at once, idle games, agent actions the CPU model would not take, a
game that ends while another process holds the database or while the file is damaged, and a
database no game could be stored in at the start."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import subprocess
import sys
from pathlib import Path

import aiohttp
import numpy as np
import pytest

from breakout_core.game.contract import Contract
from runner.play.server import MAX_OPEN_GAMES, PlayServer
from runner.store.database import Store
from runner.store.errors import StoreError

MODEL = Path(__file__).resolve().parent.parent / "models" / "reference" / "dqn_breakout.onnx"
SHORT = Contract().replace(max_episode_frames=400)  # both games end by the time limit within 100 steps


@pytest.fixture
def server(tmp_path):
    with PlayServer(Store(tmp_path / "play.duckdb"), MODEL, Contract(), port=0, pace_ms=0) as running:
        yield running


def _origin(server: PlayServer) -> str:
    return server.server.url("")


def _connect(session: aiohttp.ClientSession, server: PlayServer, **headers: str):
    """The game socket as the server's own page opens it (its Origin), unless `headers` say otherwise."""
    return session.ws_connect(server.server.url("/play/ws").replace("http", "ws"),
                              headers={"Origin": _origin(server), **headers})


async def _replies(server: PlayServer, messages: list[str | bytes]) -> list[dict]:
    async with aiohttp.ClientSession() as session, _connect(session, server) as ws:
        replies = []
        for message in messages:
            await (ws.send_bytes(message) if isinstance(message, bytes) else ws.send_str(message))
            replies.append(json.loads((await ws.receive(timeout=60)).data))
        return replies


@pytest.mark.parametrize("message, mentions", [
    ({"type": "start", "seed": 2 ** 63}, "seed must be an integer from 0 to 2147483647"),
    ({"type": "start", "seed": 2 ** 31}, "seed must be an integer from 0 to 2147483647"),  # ALE's seed: 32 bits
    ({"type": "start", "seed": -1}, "seed must be an integer from 0"),
    ({"type": "start", "seed": 1.5}, "seed must be an integer"),
    ("[" * 2_000 + "]" * 2_000, "nested"),
    ({"type": "act", "human_action": "x" * 100_000, "agent_action": 0}, "bytes"),
    (b'{"type": "start", "seed": 3}', "binary frames are not accepted; send JSON text messages"),
], ids=["seed-2^63", "seed-2^31", "negative", "float", "nested", "oversized", "binary"])
def test_a_bad_message_gets_one_line_and_the_server_goes_on(server, caplog, message, mentions):
    text = message if isinstance(message, (str, bytes)) else json.dumps(message)
    with caplog.at_level(logging.WARNING):
        error, after = asyncio.run(_replies(server, [text, json.dumps({"type": "start", "seed": 3})]))
    assert error["type"] == "error" and mentions in error["message"] and "\n" not in error["message"]
    assert after["type"] == "state" and after["seed"] == 3  # the same connection still plays
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


# -- only the server's own page -------------------------------------------------------------------

@pytest.mark.parametrize("bad, header, value", [
    ({"Origin": "http://evil.example"}, "Origin", "'http://evil.example'"),
    ({"Origin": "null"}, "Origin", "'null'"),  # a sandboxed frame or a file:// page
    ({"Host": "evil.example:{port}"}, "Host", "'evil.example:{port}'"),  # DNS rebinding: evil.example -> 127.0.0.1
], ids=["cross-origin", "null-origin", "rebinding-host"])
def test_another_sites_page_and_socket_are_refused(server, caplog, bad, header, value):
    port = server.server.port
    bad = {k: v.format(port=port) for k, v in bad.items()}
    value = value.format(port=port)

    async def scenario() -> tuple[int, int]:
        async with aiohttp.ClientSession() as session:
            async with session.get(server.url(), headers={"Origin": _origin(server), **bad}) as page:
                page_status = page.status
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                async with _connect(session, server, **bad):
                    pass
            return page_status, refused.value.status

    with caplog.at_level(logging.WARNING):
        assert asyncio.run(scenario()) == (403, 403)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 2 and all(f"{header} {value}" in line and "\n" not in line for line in lines), lines
    assert "'/play.html'" in lines[0] and "'/play/ws'" in lines[1]


def test_a_socket_without_origin_is_refused_and_the_pages_own_origins_play(server, caplog):
    port = server.server.port

    async def scenario() -> list[dict]:
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                async with session.ws_connect(server.server.url("/play/ws").replace("http", "ws")):
                    pass
            assert refused.value.status == 403
            # a page fetched by name (Host localhost, any case) and its socket with that origin
            async with session.get(f"http://127.0.0.1:{port}/play/config.json",
                                   headers={"Host": f"LocalHost:{port}",
                                            "Origin": f"http://localhost:{port}"}) as config:
                assert config.status == 200 and (await config.json())["seed"] == 0
            replies = []
            for origin in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
                async with _connect(session, server, Origin=origin) as ws:
                    await ws.send_json({"type": "start", "seed": 1})
                    replies.append(await ws.receive_json(timeout=60))
            return replies

    with caplog.at_level(logging.WARNING):
        assert [reply["type"] for reply in asyncio.run(scenario())] == ["state", "state"]
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == \
        [f"refused '/play/ws': a WebSocket upgrade without Origin (send this server's: http://127.0.0.1:{port})"]


# -- open games: a cap and an idle timeout ------------------------------------------------------

def test_starting_games_leaves_the_server_answering(server):
    """Twenty players start a game at once: the first MAX_OPEN_GAMES get one, the others are
    refused at once with the reason, and config.json is answered while most of the admitted
    games are still being set up, not after them all."""
    players = 20

    async def scenario() -> tuple[int, list[dict]]:
        async with aiohttp.ClientSession() as session:
            sockets = [await _connect(session, server) for _ in range(players)]
            replies: list[dict] = []

            async def start(i: int, ws) -> None:
                await ws.send_json({"type": "start", "seed": i})
                replies.append(await ws.receive_json(timeout=300))

            tasks = [asyncio.create_task(start(i, ws)) for i, ws in enumerate(sockets)]
            await asyncio.sleep(0)  # the starts are sent first
            async with session.get(server.server.url("/play/config.json"),
                                   headers={"Origin": _origin(server)}) as response:
                assert (await response.json())["seed"] == 0
                answered_after = sum(reply["type"] == "state" for reply in replies)
            await asyncio.gather(*tasks)
            for ws in sockets:
                await ws.close()
            return answered_after, replies

    answered_after, replies = asyncio.run(scenario())
    assert answered_after <= MAX_OPEN_GAMES // 2
    assert sum(reply["type"] == "state" for reply in replies) == MAX_OPEN_GAMES
    refusals = [reply["message"] for reply in replies if reply["type"] == "error"]
    refusal = f"{MAX_OPEN_GAMES} games are open, the most this server plays at once; finish one or try later"
    assert refusals == [refusal] * (players - MAX_OPEN_GAMES)


def test_open_games_never_pass_the_cap_and_a_finished_one_frees_its_seat(server):
    async def scenario() -> tuple[list[int], int, list[str], str]:
        counts: list[int] = []

        async def watch() -> None:
            while True:
                counts.append(server.open_games)
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        async with aiohttp.ClientSession() as session:
            sockets = [await _connect(session, server) for _ in range(MAX_OPEN_GAMES + 1)]
            for i, ws in enumerate(sockets):
                await ws.send_json({"type": "start", "seed": i})
            kinds = [(await ws.receive_json(timeout=300))["type"] for ws in sockets]
            after_starts = server.open_games
            await sockets[kinds.index("state")].close()  # a player leaves: the refused one may start
            while server.open_games == MAX_OPEN_GAMES:
                await asyncio.sleep(0.01)
            refused = sockets[kinds.index("error")]
            await refused.send_json({"type": "start", "seed": 0})
            again = (await refused.receive_json(timeout=60))["type"]
            for ws in sockets:
                await ws.close()
        watcher.cancel()
        return counts, after_starts, kinds, again

    counts, after_starts, kinds, again = asyncio.run(scenario())
    assert sorted(kinds) == ["error"] + ["state"] * MAX_OPEN_GAMES and again == "state"
    assert after_starts == max(counts) == MAX_OPEN_GAMES


def test_an_idle_game_is_closed_with_the_reason(tmp_path):
    async def scenario(server: PlayServer) -> list:
        async with aiohttp.ClientSession() as session, _connect(session, server) as ws:
            await ws.send_json({"type": "start", "seed": 0})
            assert (await ws.receive_json(timeout=60))["type"] == "state"
            assert server.open_games == 1
            return [await ws.receive(timeout=10) for _ in range(2)]

    with PlayServer(Store(tmp_path / "play.duckdb"), MODEL, Contract(), port=0, pace_ms=0,
                    idle_timeout_s=1) as server:
        error, close = asyncio.run(scenario(server))
        assert json.loads(error.data) == {
            "type": "error",
            "message": "the game was closed for inactivity: no message for 1 s; reload the page to play again"}
        assert close.type == aiohttp.WSMsgType.CLOSE and server.open_games == 0


# -- a finished game: the page's agent actions checked, and stored even while the database is busy -

def _cpu_argmax():
    import onnxruntime as ort

    session = ort.InferenceSession(str(MODEL), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name

    def argmax(obs_base64: str) -> int:
        obs = np.frombuffer(base64.b64decode(obs_base64), dtype=np.uint8).reshape(1, 4, 84, 84)
        return int(np.argmax(session.run(None, {name: obs})[0][0]))
    return argmax


async def _play(ws, seed: int, argmax, unlike_every: int = 0) -> tuple[dict, int]:
    """One game to its end, the agent's action the CPU model's argmax except every
    `unlike_every`-th step (0: never); the over message and how many steps sent another."""
    await ws.send_json({"type": "start", "seed": seed})
    state, unlike = await ws.receive_json(timeout=60), 0
    for step in range(1, 10_000):
        assert state["type"] == "state", state
        action = 0
        if not state["agent"]["done"]:
            action = argmax(state["agent"]["obs"])
            if unlike_every and step % unlike_every == 0:
                action, unlike = (action + 1) % 4, unlike + 1
        await ws.send_json({"type": "act", "human_action": step % 4, "agent_action": action})
        state = await ws.receive_json(timeout=60)
        if state["type"] == "over":
            return state, unlike
    raise AssertionError("the game did not end")


def test_the_page_agent_actions_are_checked_against_the_cpu_model(tmp_path):
    store = Store(tmp_path / "play.duckdb")

    async def scenario(server: PlayServer) -> tuple[dict, int]:
        async with aiohttp.ClientSession() as session, _connect(session, server) as ws:
            return await _play(ws, 4, _cpu_argmax(), unlike_every=3)

    with PlayServer(store, MODEL, SHORT, port=0, pace_ms=0) as server:
        over, unlike = asyncio.run(scenario(server))
    assert over["stored"] == "now" and over["stored_reason"] is None and unlike > 0
    with store.reader() as con:
        row = con.execute("SELECT game_id, agent_steps, agent_actions_from, agent_actions_unlike_cpu "
                          "FROM play_games").fetchall()
    assert row == [(over["game"]["game_id"], over["game"]["agent_steps"], "page: onnxruntime-web wasm", unlike)]
    assert over["game"]["agent_actions_unlike_cpu"] == unlike


def _finished_game(server: PlayServer, seed: int, argmax) -> dict:
    """One game played to its end on a page's WebSocket: the server's last message."""
    async def play() -> dict:
        async with aiohttp.ClientSession() as session, _connect(session, server) as ws:
            return (await _play(ws, seed, argmax))[0]

    return asyncio.run(play())


def _stored_games(store: Store) -> list[str]:
    with store.reader() as con:
        return [game_id for game_id, in con.execute("SELECT game_id FROM play_games ORDER BY finished_at").fetchall()]


@pytest.mark.parametrize("kept_until", ["the next game", "the server stops"])
def test_a_game_that_ends_while_the_database_is_busy_is_kept_and_stored_later(tmp_path, caplog, kept_until):
    store = Store(tmp_path / "play.duckdb")  # its readers below write nothing: they append no spool
    argmax = _cpu_argmax()

    with PlayServer(store, MODEL, SHORT, port=0, pace_ms=0) as server:
        # a game stored first: the server's store has opened the file, so it is the server's own
        # retry, not a first writer's look at left spools, that appends the kept game later
        before = _finished_game(server, 0, argmax)
        assert before["stored"] == "now"
        # another process holds the file read-write (as a long `runner sql` would, or a DuckDB
        # shell) until the test closes its stdin
        hold = "import duckdb, sys; con = duckdb.connect(sys.argv[1]); print('held', flush=True); sys.stdin.read()"
        holder = subprocess.Popen([sys.executable, "-c", hold, str(store.path)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout.readline() == "held\n"
            with caplog.at_level(logging.WARNING):
                kept = _finished_game(server, 1, argmax)
            assert kept["stored"] == "later" and "busy" in kept["stored_reason"]
            assert "\n" not in kept["stored_reason"]
            assert any(kept["game"]["game_id"] in r.getMessage() for r in caplog.records)
            holder.stdin.close()
            assert holder.wait(timeout=60) == 0
            assert kept["game"]["game_id"] not in _stored_games(store)
            if kept_until == "the next game":
                after = _finished_game(server, 2, argmax)
                assert after["stored"] == "now" and after["stored_reason"] is None
                assert _stored_games(store) == [g["game"]["game_id"] for g in (before, kept, after)]
        finally:
            holder.kill()
            holder.wait()
    assert kept["game"]["game_id"] in _stored_games(store) and not (store.spool_root / "play").exists()


def test_a_start_during_a_game_stores_it_as_abandoned_and_drops_its_late_actions(tmp_path):
    """Start, two steps, start again: the first game comes back as `abandoned`, stored so, before
    the new game's first state; an act still naming the first game is dropped unanswered, and
    the new game steps once."""
    store = Store(tmp_path / "play.duckdb")

    async def scenario(server: PlayServer) -> tuple[str, dict, dict, dict]:
        async with aiohttp.ClientSession() as session, _connect(session, server) as ws:
            await ws.send_json({"type": "start", "seed": 3})
            first = (await ws.receive_json(timeout=60))["game_id"]
            for _ in range(2):
                await ws.send_json({"type": "act", "human_action": 0, "agent_action": 1, "game_id": first})
                assert (await ws.receive_json(timeout=60))["type"] == "state"
            await ws.send_json({"type": "start", "seed": 4})
            abandoned = await ws.receive_json(timeout=60)
            new = await ws.receive_json(timeout=60)
            await ws.send_json({"type": "act", "human_action": 0, "agent_action": 1, "game_id": first})  # late
            await ws.send_json({"type": "act", "human_action": 0, "agent_action": 1, "game_id": new["game_id"]})
            return first, abandoned, new, await ws.receive_json(timeout=60)

    with PlayServer(store, MODEL, Contract(), port=0, pace_ms=0) as server:
        first, abandoned, new, stepped = asyncio.run(scenario(server))
    assert abandoned["type"] == "abandoned" and abandoned["stored"] == "now"
    assert abandoned["game"]["game_id"] == first and abandoned["game"]["status"] == "abandoned"
    assert stepped["type"] == "state" and stepped["game_id"] != first and stepped["seed"] == 4
    assert stepped["agent"]["steps"] == new["agent"]["steps"] + 1  # the late act stepped nothing
    steps = abandoned["game"]["agent_steps"]  # the no-op start's steps and the two acts
    with store.reader() as con:
        rows = con.execute("SELECT game_id, status, human_steps, agent_steps, human_ended_by, agent_ended_by "
                           "FROM play_games").fetchall()
    assert rows == [(first, "abandoned", steps, steps, "abandoned", "abandoned")]


def test_games_stored_before_the_status_column_read_as_finished(tmp_path):
    """A database whose play_games predates the status column: its rows read `finished`."""
    import duckdb

    from runner.play.server import MIGRATIONS

    path = tmp_path / "old.duckdb"
    con = duckdb.connect(str(path))
    for _, sql in MIGRATIONS[:2]:
        con.execute(sql)
    con.execute("INSERT INTO play_games (game_id, started_at, finished_at, seed, contract_hash, contract, model_path, "
                "model_sha256, provider, human_score, human_steps, human_ended_by, human_actions, agent_score, "
                "agent_steps, agent_ended_by, agent_actions) VALUES ('g', now(), now(), 0, 'c', '{}', 'm', 's', "
                "'wasm', 1, 2, 'game_over', '{}', 3, 4, 'game_over', '{}')")
    con.execute(MIGRATIONS[2][1])
    assert con.execute("SELECT status FROM play_games").fetchall() == [("finished",)]
    con.close()


# -- a database that cannot take games: refused at the start, and a game that ends on one is kept -

def _garbage(path: Path) -> Path:
    path.write_bytes(b"not a database\n" * 1000)
    return path


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


def _newer(path: Path) -> Path:
    with Store(path).writer() as con:
        con.execute("INSERT INTO schema_migrations VALUES ('9999_of_a_newer_runner', now())")
    return path


@pytest.mark.parametrize("bad, mentions, told", [
    (_garbage, "damaged or unreadable", None),
    (_folder, "damaged or unreadable", "is a directory"),  # the command's --db refuses it first, as the user's
    (_newer, "written by a newer runner", None),
], ids=["garbage", "a-folder", "newer"])
def test_the_server_refuses_a_database_it_cannot_store_games_in(tmp_path, bad, mentions, told):
    from test_cli_inputs import cli

    db = bad(tmp_path / "play.duckdb")
    with pytest.raises(StoreError, match=mentions):
        PlayServer(Store(db), MODEL, SHORT, port=0).start()
    result = cli("play", "--model", str(MODEL), "--db", str(db), "--port", "0", cwd=tmp_path)
    assert result.exit_code == (3 if told is None else 2), result.output
    assert "Traceback" not in result.stderr and (told or mentions) in result.stderr
    if told is None:
        assert result.stderr.count("\n") == 1 and result.stderr.startswith(f"error: {db}: "), result.stderr


@pytest.mark.parametrize("kept_until", ["the next game", "the server stops"])
def test_a_game_that_ends_on_a_damaged_database_is_kept_and_stored_once_it_is_repaired(tmp_path, caplog, kept_until):
    store = Store(tmp_path / "play.duckdb")
    argmax = _cpu_argmax()

    with PlayServer(store, MODEL, SHORT, port=0, pace_ms=0) as server:
        before = _finished_game(server, 0, argmax)
        assert before["stored"] == "now"
        good = store.path.read_bytes()  # the server holds no connection between games
        store.path.write_bytes(b"\0" * 4096 + good[4096:])  # its header overwritten: the file no longer opens
        with caplog.at_level(logging.WARNING):
            kept = _finished_game(server, 1, argmax)
        assert kept["stored"] == "later" and str(store.path) in kept["stored_reason"], kept["stored_reason"]
        assert "\n" not in kept["stored_reason"]
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r for r in warned if kept["game"]["game_id"] in r.getMessage()] and not [r for r in warned
                                                                                       if r.exc_info], caplog.text
        store.path.write_bytes(good)  # repaired: the copy from before the damage
        assert _stored_games(store) == [before["game"]["game_id"]]
        if kept_until == "the next game":
            after = _finished_game(server, 2, argmax)
            assert after["stored"] == "now"
            assert _stored_games(store) == [g["game"]["game_id"] for g in (before, kept, after)]
    assert _stored_games(store).count(kept["game"]["game_id"]) == 1 and not (store.spool_root / "play").exists()


@pytest.mark.parametrize("kept_until", ["the next game", "the server stops"])
def test_a_game_neither_appended_nor_spooled_is_held_and_stored_once_either_takes_it(tmp_path, caplog, kept_until):
    """A damaged database and a plain file where the spool folder goes: the game was lost, the page
    told 'the server failed ([Errno 20] ...)' and the log held two tracebacks."""
    store = Store(tmp_path / "play.duckdb")
    argmax = _cpu_argmax()

    with PlayServer(store, MODEL, SHORT, port=0, pace_ms=0) as server:
        before = _finished_game(server, 0, argmax)
        good = store.path.read_bytes()
        store.path.write_bytes(b"\0" * 4096 + good[4096:])  # the file no longer opens
        store.spool_root.write_text("a plain file where the spool folder goes\n")
        with caplog.at_level(logging.WARNING):
            held = _finished_game(server, 1, argmax)
        assert held["type"] == "over" and held["stored"] == "held", held
        assert str(store.path) in held["stored_reason"] and "its spool folder: [Errno 20]" in held["stored_reason"]
        assert "\n" not in held["stored_reason"]
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING]
        assert [r for r in warned if held["game"]["game_id"] in r.getMessage()], caplog.text
        assert not [r for r in caplog.records if r.exc_info], "no traceback in the log"
        store.path.write_bytes(good)  # repaired; the spool folder still cannot be made
        assert _stored_games(store) == [before["game"]["game_id"]]
        if kept_until == "the next game":
            after = _finished_game(server, 2, argmax)
            assert after["stored"] == "now"
            assert _stored_games(store) == [g["game"]["game_id"] for g in (before, held, after)]
    assert _stored_games(store).count(held["game"]["game_id"]) == 1 and server.held == []
