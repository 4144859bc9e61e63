"""A process that steps some of an episode driver's games, so that they run on another core.

ale-py's `ALEInterface.act` holds Python's GIL (0.12.1), so games in threads of one process
step one after another; a second core needs a second process. The driver keeps every rule
of the contract and all episode bookkeeping; a worker only resets and steps the games of
its slots when the driver asks, writing each slot's observation and what its step gave
into arrays that both processes map (`SlotArrays`). A seeded reset restores
the same episode start (`envs.episode_start`, made once per seed in the worker's own process) as
the driver's own games do, so an episode is the same function of its seed wherever it is
stepped.

A worker is a fresh interpreter running this module (`python -m breakout_core.game.game_worker`:
~0.35 s to import numpy, OpenCV and ale-py, ~0.5 s with its first ROM loads), talking to
the driver over its stdin and stdout. It is neither forked from the driver's process,
which may hold torch's, DuckDB's or Ray's threads, nor made by multiprocessing's spawn or
forkserver, which would import the driver's main module again in it. It ends when the
driver closes it or when the driver's process goes away (its stdin closes; a process forked
from the driver's since holds it open too). It runs in its own session, so a Ctrl-C at the
terminal reaches the driver's process alone, which then ends it.
"""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import traceback
import weakref
from multiprocessing.connection import Connection
from typing import Sequence

import numpy as np

from breakout_core.common.messages import last_line
from breakout_core.game.contract import Contract
from breakout_core.game.envs import AleGame, episode_start, new_emulator


def step_games(games: Sequence[AleGame], slots: Sequence[int], actions: Sequence[int], out: SlotArrays) -> None:
    """Step each game (that of slot `slots[k]`) once with its action; each writes its new
    observation and what the step gave into its slot's rows of `out`."""
    for game, slot, action in zip(games, slots, actions):
        lives = game.lives
        out.reward[slot], out.terminated[slot], out.truncated[slot] = game.step(int(action))
        out.life_lost[slot] = game.lives < lives
        out.frames[slot] = game.episode_frames()


def reset_game(game: AleGame, contract: Contract, seed: int | None) -> int:
    """Start a game from seed `seed`'s episode start (None: ALE's reset where its emulator
    is); the emulator frames already in its episode."""
    game.reset(None if seed is None else episode_start(contract, seed))
    return game.episode_frames()


class SlotArrays:
    """A driver's per-slot arrays, laid out in one block of memory: each slot's observation
    stack, and what its game's last step gave. Each game writes its slot's rows in place,
    wherever it runs.

    For a driver with worker processes the block is an anonymous memory file (memfd) that
    the workers map too (`shared`, `mapped`): a step sends them only its slots and actions
    and gets back only an acknowledgement, no observation or outcome is pickled or copied,
    and nothing is left behind in /dev/shm when a process is killed.
    """

    obs: np.ndarray  # (N, stack, H, W) uint8
    reward: np.ndarray  # (N,) raw reward
    terminated: np.ndarray  # (N,) game over
    truncated: np.ndarray  # (N,) time limit
    life_lost: np.ndarray  # (N,)
    frames: np.ndarray  # (N,) emulator frames into the episode after the step
    _STEP_FIELDS = (("reward", np.float64), ("terminated", np.bool_), ("truncated", np.bool_),
                    ("life_lost", np.bool_), ("frames", np.int64))

    def __init__(self, obs_shape: tuple[int, ...], buffer) -> None:
        self.obs_shape = tuple(int(d) for d in obs_shape)
        self.fd: int | None = None
        arrays, _ = self._layout(self.obs_shape)
        for name, dtype, shape, offset in arrays:
            setattr(self, name, np.frombuffer(buffer, dtype=dtype, count=int(np.prod(shape)),
                                              offset=offset).reshape(shape))

    @classmethod
    def _layout(cls, obs_shape: tuple[int, ...]) -> tuple[list[tuple[str, type, tuple[int, ...], int]], int]:
        """(name, dtype, shape, byte offset) of each array, each 8-byte aligned; the block's size."""
        fields = [("obs", np.uint8, tuple(obs_shape))] + [(name, dtype, tuple(obs_shape[:1]))
                                                          for name, dtype in cls._STEP_FIELDS]
        arrays, offset = [], 0
        for name, dtype, shape in fields:
            arrays.append((name, dtype, shape, offset))
            offset += -(-int(np.prod(shape)) * np.dtype(dtype).itemsize // 8) * 8
        return arrays, offset

    @classmethod
    def nbytes(cls, obs_shape: tuple[int, ...]) -> int:
        return cls._layout(obs_shape)[1]

    @classmethod
    def local(cls, obs_shape: tuple[int, ...]) -> SlotArrays:
        """Arrays in this process's memory alone."""
        return cls(obs_shape, bytearray(cls.nbytes(obs_shape)))

    @classmethod
    def shared(cls, obs_shape: tuple[int, ...]) -> SlotArrays:
        """Arrays in a memfd (its descriptor in `fd`) that worker processes can map."""
        fd = os.memfd_create("driver-slots")
        os.ftruncate(fd, cls.nbytes(obs_shape))
        arrays = cls.mapped(fd, obs_shape)
        arrays.fd = fd
        weakref.finalize(arrays, os.close, fd)
        return arrays

    @classmethod
    def mapped(cls, fd: int, obs_shape: tuple[int, ...]) -> SlotArrays:
        """The arrays of a memfd made by `shared` in another process."""
        return cls(obs_shape, mmap.mmap(fd, cls.nbytes(obs_shape)))


class GameWorkerError(RuntimeError):
    """A game worker failed or went away; the driver that owns it cannot go on."""


class GameWorker:
    """The driver's side of one worker process holding the games of `slots`."""

    def __init__(self, contract: Contract, slots: Sequence[int], arrays: SlotArrays):
        self.slots = [int(s) for s in slots]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # this interpreter's imports
        self._process = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, env=env, start_new_session=True,
                                         pass_fds=[arrays.fd])
        self._to = Connection(os.dup(self._process.stdin.fileno()), readable=False)
        self._from = Connection(os.dup(self._process.stdout.fileno()), writable=False)
        self._process.stdin.close()
        self._process.stdout.close()
        self._close = weakref.finalize(self, _shut_down, self._to, self._from, self._process)
        self._send((contract, self.slots, arrays.fd, arrays.obs_shape))

    def reset(self, slot: int, seed: int | None) -> int:
        """Start a game in `slot` (from seed `seed`'s state, or where its emulator is); its
        first observation is in the shared arrays on return. The emulator frames already in
        its episode."""
        self._send(("reset", slot, seed))
        return self._receive()

    def send_step(self, slots: np.ndarray, actions: np.ndarray) -> None:
        """Ask the worker to step `slots` (its own) with `actions`; `receive_step` waits for it."""
        self._send(("step", slots.tolist(), actions.tolist()))

    def receive_step(self) -> None:
        """Wait for the asked step: its slots' observations and outcomes are then in the shared arrays."""
        self._receive()

    def close(self) -> None:
        self._close()

    def _send(self, message: tuple) -> None:
        if not self._close.alive:
            raise GameWorkerError(f"the game worker for slots {self.slots} is closed")
        try:
            self._to.send(message)
        except (OSError, ValueError) as exc:
            raise self._gone() from exc

    def _receive(self):
        try:
            status, payload = self._from.recv()
        except (EOFError, OSError) as exc:
            raise self._gone() from exc
        except BaseException:  # interrupted mid-reply (Ctrl-C): later replies could no longer be matched
            self.close()
            raise
        if status == "error":
            self.close()
            raise GameWorkerError(f"the game worker for slots {self.slots} failed: {last_line(payload)}")
        return payload

    def _gone(self) -> GameWorkerError:
        try:
            code = self._process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            code = None
        self.close()
        return GameWorkerError(f"the game worker for slots {self.slots} (pid {self._process.pid}) ended "
                               f"unexpectedly (exit code {code})")


def _shut_down(to: Connection, from_: Connection, process: subprocess.Popen) -> None:
    to.close()  # the worker reads the end of its stdin and returns
    from_.close()
    try:
        process.wait(timeout=5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _serve(conn_in: Connection, conn: Connection) -> None:
    """The worker's loop: answer the driver's resets and steps until its stdin ends."""
    try:
        contract, slots, fd, shape = conn_in.recv()
        arrays = SlotArrays.mapped(fd, shape)
        games = {slot: AleGame(contract, new_emulator(contract, 0), arrays.obs[slot]) for slot in slots}
        while True:
            try:
                message = conn_in.recv()
            except EOFError:  # the driver closed the worker, or its process is gone
                return
            if message[0] == "reset":
                _, slot, seed = message
                conn.send(("ok", reset_game(games[slot], contract, seed)))
            else:
                _, stepped, actions = message
                step_games([games[slot] for slot in stepped], stepped, actions, arrays)
                conn.send(("ok", None))
    except EOFError:  # the driver went away before it said what to play
        pass
    except Exception:  # the driver raises it as a GameWorkerError
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass


if __name__ == "__main__":
    to_driver = Connection(os.dup(1), readable=False)
    os.dup2(2, 1)  # anything printed goes to stderr, never into the driver's messages
    _serve(Connection(os.dup(0), writable=False), to_driver)
