"""Execution capacity (BC-26): may another attempt be dispatched now?"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import func, select

from ..store.database import Database
from ..store.tables import attempts


class Capacity(Protocol):
    # Whether ``allow`` reads the database (a run host then checks it on a thread).
    @property
    def reads_database(self) -> bool: ...

    def allow(self, tenant_id: str, agent_id: str) -> bool: ...


class EmbeddedCapacity:
    """At most ``max_open`` non-terminal attempts per tenant (None: unlimited)."""

    def __init__(self, db: Database, max_open: int | None) -> None:
        self._db = db
        self._max_open = max_open

    @property
    def reads_database(self) -> bool:
        return self._max_open is not None

    def allow(self, tenant_id: str, agent_id: str) -> bool:
        if self._max_open is None:
            return True
        with self._db.tenant(tenant_id) as conn:
            open_attempts = conn.execute(
                select(func.count()).where(attempts.c.state.in_(("Dispatched", "Leased")))
            ).scalar_one()
        return int(open_attempts) < self._max_open
