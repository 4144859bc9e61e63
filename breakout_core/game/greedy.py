"""The action a model's Q-values choose: a row with NaN or inf has none (argmax would pick the
first NaN, parity marks it -1, which a game would index as LEFT), so it is never played."""

from __future__ import annotations

import numpy as np


class NonFiniteQ(ValueError):
    """A model gave NaN or infinite Q-values: no action is greedy, and none is played for it."""


def finite_q(q: np.ndarray, where: str = "an observation in play") -> np.ndarray:
    """`q` (B, A), whose every value is finite; NonFiniteQ naming the first row that is not
    (`where` says what the rows are: '{row}' in it is replaced by that row's index)."""
    bad = np.flatnonzero(~np.isfinite(q).all(axis=1))
    if bad.size:
        row = int(bad[0])
        kinds = " and ".join(k for k, f in (("NaN", np.isnan), ("infinite", np.isinf)) if f(q[row]).any())
        values = ", ".join(f"{v:.4g}" for v in q[row].tolist())
        raise NonFiniteQ(f"the model gives {kinds} Q-values ({values}) on {where.format(row=row)}: with them no "
                         f"action is greedy (NaN weights or an overflow in the file)")
    return q
