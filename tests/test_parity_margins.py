"""Margins beside agreement in parity: each state's baseline top-2 margin, agreement on the
decisive states (margin above the spec's decisive_margin), and the flipped states with their
margins and |dQ|, checked on Q-values whose answers are worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from runner.kinds.shared.runtime_lifecycle import greedy
from runner.kinds.shared.runtime_metrics import parity_pair_metrics
from runner.store.database import Store

Q_COLUMNS = ("q_noop", "q_fire", "q_right", "q_left")

BASE = np.array([
    [1.0, 2.0, 3.0, 0.0],    # margin 1.0: decisive; the candidate keeps RIGHT
    [0.5, 0.52, 0.0, 0.0],   # margin 0.02: not decisive; the candidate flips it to NOOP
    [0.0, 0.0, 0.0, 4.0],    # margin 4.0: decisive; kept
    [-2.0, 5.0, 1.0, 1.0],   # margin 4.0: decisive; the candidate flips it to LEFT
    [3.0, 3.0, 1.0, 0.0],    # margin 0: a tie, not decisive; kept (NOOP, lowest index)
    [1.0, 1.1, 0.0, 0.0],    # margin 0.1: decisive at 0.05, not at 0.2; flipped to NOOP
])
CANDIDATE = BASE.copy()
CANDIDATE[1, 0] = 0.53       # |dQ| 0.03
CANDIDATE[3, 3] = 5.5        # |dQ| 4.5
CANDIDATE[5, 1] = 0.9        # |dQ| 0.2


def _rows(runtime: str, q: np.ndarray) -> list[dict]:
    actions = greedy(q)
    return [{"run_id": "r", "measurement": "p", "runtime": runtime, "batch_size": 1, "state": i,
             **{c: float(q[i, j]) for j, c in enumerate(Q_COLUMNS)}, "action": int(actions[i])} for i in range(len(q))]


def _settings(runtime: str, margin: float | None) -> dict:
    return {"run_id": "r", "measurement": "p", "runtime": runtime, "precision": "int8", "atol": 0.05, "rtol": 0.05,
            "tolerance_from": "test", "states_path": "-", "states_sha256": "-", "n_states": len(BASE),
            "decisive_margin": margin}


@pytest.mark.parametrize("margin,decisive,kept", [(0.05, [0, 2, 3, 5], [0, 2]), (0.2, [0, 2, 3], [0, 2])])
def test_decisive_agreement_and_flips_by_hand(tmp_path, margin, decisive, kept):
    store = Store(tmp_path / "margins.duckdb")
    store.append_rows("parity_q", _rows("fp32", BASE) + _rows("int8", CANDIDATE))
    store.append_rows("parity_settings", [_settings("fp32", margin), _settings("int8", margin)])
    with store.reader() as con:
        margins = con.execute("SELECT state, baseline_top2_margin, decisive FROM parity_state_pairs "
                              "WHERE candidate = 'int8' ORDER BY state").fetchall()
        summary = con.execute("SELECT action_agreement, decisive_states, decisive_agreement, "
                              "decisive_agreement_fraction FROM parity_summary WHERE candidate = 'int8'").fetchone()
        flips = con.execute("SELECT state, baseline_action, candidate_action, baseline_top2_margin, max_abs_dq, "
                            "decisive FROM parity_flips WHERE candidate = 'int8' ORDER BY state").fetchall()
        metrics = parity_pair_metrics(con, "r", "p", "int8", "fp32")
    assert [s for s, _, _ in margins] == list(range(6))
    np.testing.assert_allclose([m for _, m, _ in margins], [1.0, 0.02, 4.0, 4.0, 0.0, 0.1], atol=1e-12)
    assert [s for s, _, d in margins if d] == decisive
    assert summary[:3] == (3, len(decisive), len(kept))
    assert summary[3] == pytest.approx(len(kept) / len(decisive))
    assert [f[:3] for f in flips] == [(1, 1, 0), (3, 1, 3), (5, 1, 0)]
    np.testing.assert_allclose([f[3] for f in flips], [0.02, 4.0, 0.1], atol=1e-12)
    np.testing.assert_allclose([f[4] for f in flips], [0.03, 4.5, 0.2], atol=1e-12)
    assert [f[5] for f in flips] == [False, True, margin < 0.1]
    assert metrics["action_agreement"] == pytest.approx(0.5)
    assert metrics["decisive_action_agreement"] == pytest.approx(len(kept) / len(decisive))
    assert metrics["decisive_states"] == len(decisive)


def test_rows_stored_before_the_margin_have_no_decisive_figures(tmp_path):
    store = Store(tmp_path / "old.duckdb")
    store.append_rows("parity_q", _rows("fp32", BASE) + _rows("int8", CANDIDATE))
    store.append_rows("parity_settings", [_settings("fp32", None), _settings("int8", None)])
    with store.reader() as con:
        summary = con.execute("SELECT action_agreement, decisive_states, decisive_agreement_fraction "
                              "FROM parity_summary WHERE candidate = 'int8'").fetchone()
        metrics = parity_pair_metrics(con, "r", "p", "int8", "fp32")
    assert summary == (3, None, None)
    assert "decisive_action_agreement" not in metrics and "decisive_states" not in metrics
