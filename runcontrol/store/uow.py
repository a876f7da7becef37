"""UnitOfWork: one tenant-scoped transaction in which a command's row changes, its outbox
events and its recovery-journal entries commit together or not at all (invariant 3)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Table, select, update
from sqlalchemy.dialects.postgresql import insert

from ..domain import AuditRecord, Options, RunAggregate, errors
from . import rows
from .database import Database
from .tables import (
    approval_decisions,
    approval_requests,
    attempts,
    audit_log,
    cancellation_intents,
    leases,
    outbox,
    recovery_journal,
    runs,
    steps,
)

Fault = Callable[[str], None]
DISPATCH_CHANNEL = "runcontrol_dispatch"
EVENTS_CHANNEL = "runcontrol_events"


def _upsert(table: Table) -> Any:
    stmt = insert(table)
    pk = [c.name for c in table.primary_key.columns]
    return stmt.on_conflict_do_update(
        index_elements=pk,
        set_={c.name: stmt.excluded[c.name] for c in table.columns if c.name not in pk},
    )


_UPSERT = {t.name: _upsert(t) for t in (steps, attempts, leases, approval_requests)}
_INSERT_RUN = (
    insert(runs)
    .on_conflict_do_nothing(index_elements=["tenant_id", "project_id", "idempotency_key"])
    .returning(runs.c.run_id)
)


class DuplicateSubmission(Exception):
    """The idempotency key already names a run (raised inside the store, handled by the grain)."""


class UnitOfWork:
    def __init__(
        self,
        db: Database,
        tenant_id: str,
        *,
        options: Options | None = None,
        fault: Fault | None = None,
    ) -> None:
        self._db = db
        self.options = options or Options()
        self.tenant_id = tenant_id
        self._fault = fault
        self._committed = False

    def __enter__(self) -> UnitOfWork:
        self.conn: Connection = self._db.app.connect()
        self._tx = self.conn.begin()
        self.conn.exec_driver_sql(
            "SELECT set_config('runcontrol.tenant_id', %s, true)", (self.tenant_id,)
        )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if not self._committed and self._tx.is_active:
                self._tx.rollback()
        finally:
            self.conn.close()

    def commit(self) -> None:
        self._tx.commit()
        self._committed = True

    # ------------------------------------------------------------------ reads

    def load(self, run_id: UUID) -> RunAggregate:
        conn = self.conn
        row = conn.execute(select(runs).where(runs.c.run_id == run_id)).first()
        if row is None:
            raise errors.RunNotFound(f"run {run_id} not found", run_id=str(run_id))
        by_run = {"run_id": run_id}
        return RunAggregate(
            rows.row_to_run(row),
            [rows.row_to_step(r) for r in conn.execute(select(steps).filter_by(**by_run))],
            [rows.row_to_attempt(r) for r in conn.execute(select(attempts).filter_by(**by_run))],
            [
                rows.row_to_lease(r)
                for r in conn.execute(
                    select(leases).filter_by(**by_run).where(leases.c.released_at.is_(None))
                )
            ],
            [
                rows.row_to_approval(r)
                for r in conn.execute(select(approval_requests).filter_by(**by_run))
            ],
            [
                rows.row_to_decision(r)
                for r in conn.execute(select(approval_decisions).filter_by(**by_run))
            ],
            [
                rows.row_to_intent(r)
                for r in conn.execute(select(cancellation_intents).filter_by(**by_run))
            ],
        )

    def run_version(self, run_id: UUID) -> int | None:
        return self.conn.execute(
            select(runs.c.version).where(runs.c.run_id == run_id)
        ).scalar_one_or_none()

    def run_id_for_key(self, project_id: str, idempotency_key: str) -> UUID | None:
        return self.conn.execute(
            select(runs.c.run_id).where(
                runs.c.tenant_id == self.tenant_id,
                runs.c.project_id == project_id,
                runs.c.idempotency_key == idempotency_key,
            )
        ).scalar_one_or_none()

    # ------------------------------------------------------------------ writes

    def save(self, agg: RunAggregate) -> None:
        """Persist everything the aggregate recorded since the last save."""
        changes = agg.take_changes()
        if changes.empty:
            return
        conn = self.conn
        run_row = rows.run_to_row(changes.run)
        run_row["next_due_at"] = agg.next_due(self.options)
        if changes.expected_version is None:
            if conn.execute(_INSERT_RUN, run_row).first() is None:
                raise DuplicateSubmission(changes.run.idempotency_key)
        elif changes.run_dirty:
            result = conn.execute(
                update(runs)
                .where(runs.c.run_id == changes.run.run_id)
                .where(runs.c.version == changes.expected_version)
                .values(run_row)
            )
            if result.rowcount != 1:
                raise errors.ConcurrencyConflict(
                    "the run changed since it was loaded", run_id=str(changes.run.run_id)
                )
        self._checkpoint("after-run")
        if changes.steps:
            conn.execute(_UPSERT["steps"], [rows.step_to_row(s) for s in changes.steps.values()])
        if changes.attempts:
            agent = {s.step_id: s.agent_id for s in agg.steps}
            conn.execute(
                _UPSERT["attempts"],
                [rows.attempt_to_row(a, agent[a.step_id]) for a in changes.attempts.values()],
            )
        if changes.leases:
            conn.execute(_UPSERT["leases"], [rows.lease_to_row(x) for x in changes.leases.values()])
        if changes.approvals:
            conn.execute(
                _UPSERT["approval_requests"],
                [rows.approval_to_row(a) for a in changes.approvals.values()],
            )
        self._insert(approval_decisions, [rows.decision_to_row(d) for d in changes.decisions])
        self._insert(cancellation_intents, [rows.intent_to_row(i) for i in changes.intents])
        self._checkpoint("before-outbox")
        self._insert(
            outbox,
            [
                {
                    "event_id": e.event_id,
                    "tenant_id": e.tenant_id,
                    "project_id": e.project_id,
                    "run_id": e.run_id,
                    "seq": e.seq,
                    "topic": e.topic,
                    "event_type": e.event_type,
                    "step_id": e.step_id,
                    "attempt_id": e.attempt_id,
                    "correlation_id": e.correlation_id,
                    "causation_id": e.causation_id,
                    "producer": e.producer,
                    "schema_version": e.schema_version,
                    "payload": e.payload,
                    "occurred_at": e.occurred_at,
                }
                for e in changes.events
            ],
        )
        self._checkpoint("before-journal")
        self._insert(
            recovery_journal,
            [
                {
                    "tenant_id": j.tenant_id,
                    "run_id": j.run_id,
                    "sequence": j.sequence,
                    "entity": j.entity,
                    "entity_id": j.entity_id,
                    "from_state": None if j.from_state is None else str(j.from_state),
                    "to_state": str(j.to_state),
                    "cause": j.cause,
                    "actor": j.actor,
                    "occurred_at": j.occurred_at,
                }
                for j in changes.journal
            ],
        )
        self.add_audits(changes.audits)
        # Wake long-polling claimers and event watchers; NOTIFY is delivered only on commit.
        agents = {e.payload["agentId"] for e in changes.events if e.event_type == "AttemptDispatched"}
        for agent_id in agents:
            conn.exec_driver_sql("SELECT pg_notify(%s, %s)", (DISPATCH_CHANNEL, agent_id))
        if changes.events:
            conn.exec_driver_sql(
                "SELECT pg_notify(%s, %s)", (EVENTS_CHANNEL, str(changes.run.run_id))
            )

    def add_audits(self, audits: Iterable[AuditRecord]) -> None:
        self._insert(
            audit_log,
            [
                {
                    "tenant_id": a.tenant_id,
                    "run_id": a.run_id,
                    "kind": a.kind,
                    "actor": a.actor,
                    "detail": a.detail,
                    "occurred_at": a.occurred_at,
                }
                for a in audits
            ],
        )

    def _insert(self, table: Table, values: list[dict[str, Any]]) -> None:
        if values:
            self.conn.execute(table.insert(), values)

    def _checkpoint(self, name: str) -> None:
        if self._fault is not None:
            self._fault(name)
