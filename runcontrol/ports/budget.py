"""Budget (BC-05): reserve a run's cost limit against the tenant's budget at acceptance."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Protocol
from uuid import UUID

from sqlalchemy import func, select, update
from sqlalchemy.dialects.postgresql import insert

from ..domain import errors
from ..store.database import Database
from ..store.tables import budget_reservations


class Budget(Protocol):
    def reserve(self, tenant_id: str, run_id: UUID, amount_usd: float, now: datetime) -> UUID: ...

    def release(self, tenant_id: str, run_id: UUID, now: datetime) -> None: ...


class EmbeddedBudget:
    """Reservations in Postgres against one limit per tenant (None: unlimited)."""

    def __init__(self, db: Database, tenant_limit_usd: float | None) -> None:
        self._db = db
        self._limit = tenant_limit_usd

    def reserve(self, tenant_id: str, run_id: UUID, amount_usd: float, now: datetime) -> UUID:
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
        with self._db.tenant(tenant_id) as conn:
            conn.execute(
                update(budget_reservations)
                .where(
                    budget_reservations.c.run_id == run_id,
                    budget_reservations.c.released_at.is_(None),
                )
                .values(released_at=now)
            )
