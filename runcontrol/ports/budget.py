"""Budget (BC-05): reserve a run's cost limit against the tenant's budget at acceptance."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Protocol
from uuid import UUID

from sqlalchemy import func, select
from sqlalchemy.dialects.postgresql import insert

from ..domain import errors
from ..store.database import Database
from ..store.tables import budget_reservations


class Budget(Protocol):
    # True when reservations live in the run's own database: the transition that makes a run
    # terminal then releases its reservation in the same statement (migration 0004) instead of
    # calling ``release`` after the commit.
    releases_with_run: bool

    def reserve(self, tenant_id: str, run_id: UUID, amount_usd: float, now: datetime) -> UUID: ...

    def release(self, tenant_id: str, run_id: UUID, now: datetime) -> None: ...


# Insert the run's reservation, or answer the one it already has (idempotent per run). When a
# concurrent insert of the same run wins, neither half sees a row: the caller reads it again.
_RESERVE = """
WITH inserted AS (
    INSERT INTO budget_reservations (reservation_id, tenant_id, run_id, amount_usd, created_at)
    VALUES (%s, %s, %s, %s, %s) ON CONFLICT (run_id) DO NOTHING RETURNING reservation_id
)
SELECT reservation_id FROM inserted
UNION ALL SELECT reservation_id FROM budget_reservations WHERE run_id = %s
"""
_RESERVATION = "SELECT reservation_id FROM budget_reservations WHERE run_id = %s"
_RELEASE = (
    "UPDATE budget_reservations SET released_at = %s WHERE run_id = %s AND released_at IS NULL"
)


class EmbeddedBudget:
    """Reservations in Postgres against one limit per tenant (None: unlimited)."""

    releases_with_run = True

    def __init__(self, db: Database, tenant_limit_usd: float | None) -> None:
        self._db = db
        self._limit = tenant_limit_usd

    def reserve(self, tenant_id: str, run_id: UUID, amount_usd: float, now: datetime) -> UUID:
        if self._limit is None:  # nothing to check: one round trip
            found = self._db.tenant_rows(
                tenant_id, _RESERVE, (uuid.uuid4(), tenant_id, run_id, amount_usd, now, run_id)
            ) or self._db.tenant_rows(tenant_id, _RESERVATION, (run_id,))
            return UUID(str(found[0]["reservation_id"]))
        with self._db.tenant(tenant_id) as conn:
            existing = conn.execute(
                select(budget_reservations.c.reservation_id).where(
                    budget_reservations.c.run_id == run_id
                )
            ).scalar_one_or_none()
            if existing is not None:
                return UUID(str(existing))  # idempotent per run
            if self._limit is not None:
                # Serialise reservations of one tenant so two cannot both squeeze under the limit.
                conn.exec_driver_sql(
                    "SELECT pg_advisory_xact_lock(hashtext('budget:' || %s))", (tenant_id,)
                )
                used = conn.execute(
                    select(func.coalesce(func.sum(budget_reservations.c.amount_usd), 0)).where(
                        budget_reservations.c.released_at.is_(None)
                    )
                ).scalar_one()
                if float(used) + amount_usd > self._limit:
                    raise errors.BudgetReservationDenied(
                        f"tenant budget exhausted: {float(used):.2f} of {self._limit:.2f} USD "
                        f"reserved, {amount_usd:.2f} requested"
                    )
            reservation_id = uuid.uuid4()
            conn.execute(
                insert(budget_reservations)
                .values(
                    reservation_id=reservation_id,
                    tenant_id=tenant_id,
                    run_id=run_id,
                    amount_usd=amount_usd,
                    created_at=now,
                )
                .on_conflict_do_nothing()
            )
        return reservation_id

    def release(self, tenant_id: str, run_id: UUID, now: datetime) -> None:
        self._db.tenant_rows(tenant_id, _RELEASE, (now, run_id))
