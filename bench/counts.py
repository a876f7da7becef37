"""What a measurement cost the database, counted from the server's side (issue 33): the
NOTIFYs actually sent, the rows written by table and the transactions.

- ``Notifies``: one plain LISTEN connection on every channel the schema NOTIFYs. It does not
  register as a listener (``runcontrol_listeners``, migration 0026), so it never makes a gated
  NOTIFY fire: it counts what the service sends on its own. PostgreSQL folds identical
  (channel, payload) pairs within a transaction, so this is the count queued, per channel.
- ``rows``: ``pg_stat_user_tables`` (rows inserted, updated, deleted by table). A backend
  reports its counts at most once a second and, when it goes idle within that second, 10 s
  later (``PGSTAT_IDLE_INTERVAL``): ``rows`` waits that out, so it holds everything committed
  before it (and what the service wrote meanwhile: the relay marking the outbox published is a
  run's cost too).
- ``transactions``: ``pg_stat_database``'s commits and rollbacks, read at once (as before
  issue 33, so the figures compare; the last second's may be unreported yet).
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from typing import Any

import psycopg

from runcontrol.reconcilers import DUE_CHANNEL
from runcontrol.store.commit import CONFIG_CHANNEL, DISPATCH_CHANNEL, EVENTS_CHANNEL
from runcontrol.store.output import OUTPUT_CHANNEL
from runcontrol.store.webhooks import FEED_CHANNEL

# Every channel a migration or the relay NOTIFYs (grep pg_notify in runcontrol/store).
CHANNELS = (
    DISPATCH_CHANNEL,
    EVENTS_CHANNEL,
    OUTPUT_CHANNEL,
    DUE_CHANNEL,
    FEED_CHANNEL,
    CONFIG_CHANNEL,
)
STATS_SETTLE_S = 11.0  # PGSTAT_IDLE_INTERVAL (10 s) and a margin


def _libpq(owner_url: str) -> str:
    return owner_url.replace("postgresql+psycopg://", "postgresql://")


class Notifies:
    """Counts, per channel, the NOTIFYs the service sends while it runs (see the module)."""

    def __init__(self, owner_url: str) -> None:
        self._conn = psycopg.connect(_libpq(owner_url), autocommit=True)
        for channel in CHANNELS:
            self._conn.execute(f'LISTEN "{channel}"')
        self.by_channel: Counter[str] = Counter()
        self._stop = False
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    @property
    def count(self) -> int:
        return sum(self.by_channel.values())

    def _loop(self) -> None:
        while not self._stop:
            for note in self._conn.notifies(timeout=0.5):
                self.by_channel[note.channel] += 1

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=5)
        self._conn.close()


Rows = dict[str, tuple[int, int, int]]  # table -> (inserted, updated, deleted) rows so far
_ROWS = "SELECT relname, n_tup_ins, n_tup_upd, n_tup_del FROM pg_stat_user_tables"
_TRANSACTIONS = (
    "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
)


def rows(owner_url: str, *, settle_s: float = STATS_SETTLE_S) -> Rows:
    """The rows written so far by table, after ``settle_s`` (every backend has reported)."""
    time.sleep(settle_s)
    with psycopg.connect(_libpq(owner_url), autocommit=True) as conn:
        found = conn.execute(_ROWS).fetchall()
    return {str(r[0]): (int(r[1]), int(r[2]), int(r[3])) for r in found}


def transactions(owner_url: str) -> int:
    with psycopg.connect(_libpq(owner_url), autocommit=True) as conn:
        found = conn.execute(_TRANSACTIONS).fetchone()
    return int(found[0]) if found else 0


def rows_per_unit(before: Rows, after: Rows, units: float) -> dict[str, dict[str, float]]:
    """Rows inserted / updated / deleted per unit of work (a completed run), by table (those
    written in between), with their sum as ``all``."""
    per: dict[str, dict[str, float]] = {}
    total = [0, 0, 0]
    for table, counts in sorted(after.items()):
        was = before.get(table, (0, 0, 0))
        delta = [a - b for a, b in zip(counts, was, strict=True)]
        if any(delta):
            per[table] = _per(delta, units)
            total = [t + d for t, d in zip(total, delta, strict=True)]
    per["all"] = _per(total, units)
    return per


def _per(delta: list[int], units: float) -> dict[str, float]:
    n = max(units, 1)
    return {"inserted": delta[0] / n, "updated": delta[1] / n, "deleted": delta[2] / n}


def print_rows(figures: dict[str, Any]) -> None:
    print(f"  {'rows written by table (ins / upd / del)':<42}")
    for table, counts in figures.items():
        print(
            f"    {table:<40}{counts['inserted']:>6.2f} /{counts['updated']:>6.2f} /"
            f"{counts['deleted']:>6.2f}"
        )
