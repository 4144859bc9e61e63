"""Replay rebuilds stacks from single frames without leaking across episodes or envs."""

import numpy as np
import pytest

from breakout_core.learning.replay import FrameReplay


def _frame(stream: int, step: int) -> np.ndarray:
    """A 2x2 frame whose pixels encode (stream, step) so a stack can be decoded."""
    return np.full((2, 2), stream * 100 + step + 1, dtype=np.uint8)


def _fill(replay: FrameReplay, episode_lengths: list[list[int]]) -> dict:
    """Play scripted episodes per stream, in lockstep; returns expected (obs, next) per entry."""
    expected = {}
    streams = len(episode_lengths)
    plans = []
    for s in range(streams):
        plan = []
        for length in episode_lengths[s]:
            plan += [(i == 0, i == length - 1) for i in range(length)]
        plans.append(plan)
    counters = [0] * streams  # step id used in frame values (unique per stream)
    history: list[list[int]] = [[] for _ in range(streams)]  # frame ids of the current episode
    for t in range(max(len(p) for p in plans)):
        live = [s for s in range(streams) if t < len(plans[s])]
        idx = np.array(live)
        starts = np.array([plans[s][t][0] for s in live])
        ends = np.array([plans[s][t][1] for s in live])
        frames, keys = [], []
        for s in live:
            if plans[s][t][0]:
                history[s] = []
            history[s].append(counters[s])
            frames.append(_frame(s, counters[s]))
            keys.append((s, counters[s]))
            counters[s] += 1
        replay.add(idx, np.stack(frames), np.arange(len(live)), np.ones(len(live), np.float32), ends, starts)
        for k, s in enumerate(live):
            stack_ids = ([None] * 4 + history[s])[-4:]
            next_ids = stack_ids[1:] + [counters[s]]  # next frame is the following entry's frame
            expected[keys[k]] = (stack_ids, next_ids)
        finals = [s for k, s in enumerate(live) if ends[k]]
        if finals:
            replay.add_final_frames(np.array(finals), np.stack([_frame(s, counters[s]) for s in finals]))
            for s in finals:
                counters[s] += 1
    return expected


def _decode(stack: np.ndarray, stream: int) -> list:
    return [None if v == 0 else int(v) - 1 - stream * 100 for v in stack[:, 0, 0]]


@pytest.mark.parametrize("device", ["numpy", "cpu"])
def test_stacks_respect_episode_starts_and_streams(device):
    replay = FrameReplay(400, 2, frame_shape=(2, 2), device=device, seed=1)
    expected = _fill(replay, [[3, 6, 2, 9], [10, 1, 7]])
    batch = replay.sample(256)
    obs, nxt = batch.obs.numpy(), batch.next_obs.numpy()
    for i in range(len(obs)):
        newest = obs[i, -1, 0, 0]
        stream = (int(newest) - 1) // 100
        key = (stream, int(newest) - 1 - stream * 100)
        assert key in expected, "sampled an entry that is not a transition (a final frame?)"
        stack_ids, next_ids = expected[key]
        assert _decode(obs[i], stream) == stack_ids
        assert _decode(nxt[i], stream) == next_ids


def test_final_frame_of_an_episode_is_the_next_obs_of_its_last_transition():
    replay = FrameReplay(200, 1, frame_shape=(2, 2), seed=0)
    _fill(replay, [[2, 3]])
    batch = replay.sample(200)
    terminal_rows = batch.terminal.numpy() == 1.0
    newest = batch.obs.numpy()[terminal_rows, -1, 0, 0]
    following = batch.next_obs.numpy()[terminal_rows, -1, 0, 0]
    assert terminal_rows.any()
    assert np.all(following == newest + 1)  # the stored final frame, not the next episode's first


def test_wrapped_ring_never_samples_overwritten_history():
    replay = FrameReplay(40, 1, frame_shape=(2, 2), seed=3)
    expected = _fill(replay, [[25, 30]])
    batch = replay.sample(500)
    newest = batch.obs.numpy()[:, -1, 0, 0].astype(int) - 1
    assert newest.min() >= 55 - 40 + 3  # the oldest 3 held frames only serve as history
    for i, key in enumerate(newest):
        stack_ids, _ = expected[(0, int(key))]
        assert _decode(batch.obs.numpy()[i], 0) == stack_ids


def test_sampling_too_early_is_a_clear_error():
    replay = FrameReplay(100, 1, frame_shape=(2, 2))
    with pytest.raises(ValueError, match="too few"):
        replay.sample(32)


def test_replay_bytes_is_what_a_replay_allocates():
    from breakout_core.learning.replay_layout import replay_bytes

    replay = FrameReplay(1_000, 2, frame_shape=(84, 84))
    held = sum(a.nbytes for a in (replay.frames, replay.actions, replay.rewards, replay.terminal, replay.has_next,
                                  replay.starts))
    assert replay_bytes(1_000) == held
