"""The ledger of `runner check`: every check of a model's content, with what it asked and how it
ended, so that a check can say how many came before it and a confirmation is played once.

A model's content (breakout_core.conversion.model_content) keys its drawn seeds: a re-save of
the same weights draws the same games, so checking again does not draw new games. What a
check measures anew each time (latency, and any `--set` of a modified gate) is what repeated
checks could fish with, and the ledger lets the check say so. `--confirm` plays the
confirmation seeds drawn for a content once: a second confirmation of the same content in this
database is refused unless `--confirm-again`, which is recorded beside it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from runner.store import schema

MIGRATIONS = [
    (
        "0700_check_attempts",
        """
        CREATE TABLE check_attempts (
            model_content VARCHAR NOT NULL, run_id VARCHAR NOT NULL, checked_at TIMESTAMPTZ NOT NULL,
            question VARCHAR NOT NULL, confirm BOOLEAN NOT NULL, confirm_again BOOLEAN NOT NULL,
            modified_gate JSON NOT NULL, passed BOOLEAN NOT NULL
        )
        """,
    )
]

schema.declare("check_attempts", MIGRATIONS)

PER_CHECK_FALSE_PASS = 0.025  # a gating interval's one-sided error: what each re-measured check risks


@dataclass(frozen=True)
class Attempts:
    checks: int  # earlier checks of the content in this database
    confirmations: int  # of them, with --confirm

    def words(self, content: str) -> str:
        """One line: which check of this content this is, and what repeating checks costs."""
        number = self.checks + 1
        if number == 1:
            return f"check 1 of this model (content {content[:12]}) in this database"
        chance = 1 - (1 - PER_CHECK_FALSE_PASS) ** number
        return (f"check {number} of this model (content {content[:12]}) in this database: its games are the same "
                f"drawn seeds each time, but what is measured anew (latency) would pass a model exactly at its "
                f"limit at least once in {number} checks with chance up to {chance:.1%}, not "
                f"{PER_CHECK_FALSE_PASS:.1%}")


def earlier_attempts(store, content: str) -> Attempts:
    """The checks of `content` this database holds (none where there is no database yet)."""
    if not store.path.exists():
        return Attempts(0, 0)
    with store.reader() as con:
        checks, confirmations = con.execute(
            "SELECT count(*), count(*) FILTER (WHERE confirm) FROM check_attempts WHERE model_content = ?",
            [content]).fetchone()
    return Attempts(checks, confirmations)


def record_attempt(store, *, content: str, run_id: str, question: str, confirm: bool, confirm_again: bool,
                   modified_gate: list[str], passed: bool) -> None:
    from runner.store.database import utcnow

    store.append_rows("check_attempts", [{
        "model_content": content, "run_id": run_id, "checked_at": utcnow(), "question": question,
        "confirm": confirm, "confirm_again": confirm_again, "modified_gate": json.dumps(modified_gate),
        "passed": passed}])
