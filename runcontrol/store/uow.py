"""UnitOfWork: one tenant-scoped transaction in which a command's row changes, its outbox
events and its recovery-journal entries commit together or not at all (invariant 3)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import Any
from uuid import UUID

import psycopg
from psycopg.types.json import Jsonb
from sqlalchemy import Connection, Table, select
from sqlalchemy import exc as sa_exc

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


def _columns(table: Table) -> list[str]:
    return [c.name for c in table.columns if not (c.autoincrement is True and c.primary_key)]


def _insert_sql(table: Table, suffix: str = "") -> str:
    cols = _columns(table)
    names = ", ".join(cols)
    values = ", ".join(f"%({c})s" for c in cols)
    return f"INSERT INTO {table.name} ({names}) VALUES ({values}){suffix}"


def _upsert_sql(table: Table) -> str:
    pk = [c.name for c in table.primary_key.columns]
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _columns(table) if c not in pk)
    return _insert_sql(table, f" ON CONFLICT ({', '.join(pk)}) DO UPDATE SET {updates}")


# The write path is precompiled SQL sent through psycopg's pipeline mode: one round trip for
# all of a command's statements instead of one each (measured: see docs/benchmarks.md).
_UPSERT = {t.name: _upsert_sql(t) for t in (steps, attempts, leases, approval_requests)}
_INSERT = {
    t.name: _insert_sql(t)
    for t in (approval_decisions, cancellation_intents, outbox, recovery_journal, audit_log)
}
_INSERT_RUN = _insert_sql(
    runs, " ON CONFLICT (tenant_id, project_id, idempotency_key) DO NOTHING RETURNING run_id"
)
_UPDATE_RUN = (
    "UPDATE runs SET {} WHERE run_id = %(run_id)s AND version = %(expected_version)s".format(
        ", ".join(f"{c} = %({c})s" for c in _columns(runs) if c != "run_id")
    )
)
_JSONB = {"payload", "detail", "input"}
_SET_TENANT = "SELECT set_config('runcontrol.tenant_id', %s, true)"


def _adapt(row: dict[str, Any]) -> dict[str, Any]:
    for key in _JSONB.intersection(row):
        if row[key] is not None:
            row[key] = Jsonb(row[key])
    return row


@contextmanager
def _lost_race_is_a_conflict(
    guarded: bool, run_cur: psycopg.Cursor[Any], run_id: UUID
) -> Iterator[None]:
    """In pipeline mode the rows queued behind the version-guarded UPDATE are written even when
    it matched nothing, and may collide with the winner's rows (lease token, outbox seq,
    attempt number). psycopg raises that at whichever call fetches it (an ``executemany`` as
    well as the final sync): it is the lost race, so answer as the guard would have."""
    try:
        yield
    except psycopg.errors.IntegrityError as exc:
        if guarded and run_cur.rowcount != 1:  # 0, or -1 if its result was discarded
            raise errors.ConcurrencyConflict(
                "the run changed since it was loaded", run_id=str(run_id)
            ) from exc
        raise


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
        self._conn: Connection = self._db.app.connect()
        self._tx = self._conn.begin()
        self._scoped = False  # set lazily: a cached grain's write needs no read first
        return self

    def _scope(self) -> Connection:
        """Limit this transaction to the tenant (row-level security) before any statement."""
        if not self._scoped:
            self._conn.exec_driver_sql(_SET_TENANT, (self.tenant_id,))
            self._scoped = True
        return self._conn

    @property
    def conn(self) -> Connection:
        """The transaction's connection, already limited to the tenant."""
        return self._scope()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        lost = isinstance(exc, psycopg.OperationalError | sa_exc.OperationalError)
        try:
            if lost:
                self._conn.invalidate()  # never hand a broken connection back to the pool
            elif not self._committed and self._tx.is_active:
                self._tx.rollback()
        finally:
            self._conn.close()
        if lost:
            # Unknown whether the commit happened: the caller retries the (idempotent) command.
            raise errors.Unavailable("the database connection was lost") from exc

    def commit(self) -> None:
        self._tx.commit()
        self._committed = True

    # ------------------------------------------------------------------ reads

    def load(self, run_id: UUID) -> RunAggregate:
        """The run and its rows as of one commit.

        Under READ COMMITTED each SELECT sees the latest commit, so another activation's commit
        landing between them would tear the aggregate (an attempt still Leased beside its
        already-released lease) and a refusal decided on it would be wrong. Every commit bumps
        the run's version, so an unchanged version after the child reads proves they match.
        """
        version = select(runs.c.version).where(runs.c.run_id == run_id)
        for _ in range(5):
            agg = self._load_once(run_id)
            if self._scope().execute(version).scalar_one_or_none() == agg.run.version:
                return agg
        raise errors.ConcurrencyConflict(
            "the run kept changing while it was loaded", run_id=str(run_id)
        )

    def _load_once(self, run_id: UUID) -> RunAggregate:
        conn = self._scope()
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
        return (
            self._scope()
            .execute(select(runs.c.version).where(runs.c.run_id == run_id))
            .scalar_one_or_none()
        )

    def run_id_for_key(self, project_id: str, idempotency_key: str) -> UUID | None:
        return (
            self._scope()
            .execute(
                select(runs.c.run_id).where(
                    runs.c.tenant_id == self.tenant_id,
                    runs.c.project_id == project_id,
                    runs.c.idempotency_key == idempotency_key,
                )
            )
            .scalar_one_or_none()
        )

    # ------------------------------------------------------------------ writes

    def save(self, agg: RunAggregate) -> None:
        """Persist everything the aggregate recorded since the last save (one round trip)."""
        changes = agg.take_changes()
        if changes.empty:
            return
        raw = self._conn.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        run_row = rows.run_to_row(changes.run)
        run_row["next_due_at"] = agg.next_due(self.options)
        _adapt(run_row)
        guarded = changes.expected_version is not None and changes.run_dirty
        with (
            raw.pipeline() as pipeline,
            raw.cursor() as run_cur,
            raw.cursor() as cur,
            _lost_race_is_a_conflict(guarded, run_cur, changes.run.run_id),
        ):
            if not self._scoped:
                cur.execute(_SET_TENANT, (self.tenant_id,))
                self._scoped = True
            if changes.expected_version is None:
                run_cur.execute(_INSERT_RUN, run_row)
                # A concurrent submission with the same key may have won the insert: the rows
                # queued below would then fail their foreign key (not a DuplicateSubmission).
                pipeline.sync()
                if run_cur.fetchone() is None:
                    raise DuplicateSubmission(changes.run.idempotency_key)
            elif changes.run_dirty:
                run_cur.execute(
                    _UPDATE_RUN, {**run_row, "expected_version": changes.expected_version}
                )
            self._checkpoint("after-run")
            if changes.steps:
                cur.executemany(
                    _UPSERT["steps"], [rows.step_to_row(x) for x in changes.steps.values()]
                )
            if changes.attempts:
                agent = {s.step_id: s.agent_id for s in agg.steps}
                cur.executemany(
                    _UPSERT["attempts"],
                    [rows.attempt_to_row(a, agent[a.step_id]) for a in changes.attempts.values()],
                )
            if changes.leases:
                cur.executemany(
                    _UPSERT["leases"], [rows.lease_to_row(x) for x in changes.leases.values()]
                )
            if changes.approvals:
                cur.executemany(
                    _UPSERT["approval_requests"],
                    [rows.approval_to_row(a) for a in changes.approvals.values()],
                )
            self._many(
                cur, "approval_decisions", [rows.decision_to_row(d) for d in changes.decisions]
            )
            self._many(
                cur, "cancellation_intents", [rows.intent_to_row(i) for i in changes.intents]
            )
            self._checkpoint("before-outbox")
            self._many(cur, "outbox", [rows.event_to_row(e) for e in changes.events])
            self._checkpoint("before-journal")
            self._many(cur, "recovery_journal", [rows.journal_to_row(j) for j in changes.journal])
            self._many(cur, "audit_log", [rows.audit_to_row(a) for a in changes.audits])
            # Wake long-polling claimers and event watchers; NOTIFY is delivered only on commit.
            for agent_id in {
                e.payload["agentId"] for e in changes.events if e.event_type == "AttemptDispatched"
            }:
                cur.execute("SELECT pg_notify(%s, %s)", (DISPATCH_CHANNEL, agent_id))
            if changes.events:
                cur.execute("SELECT pg_notify(%s, %s)", (EVENTS_CHANNEL, str(changes.run.run_id)))
            pipeline.sync()
            if guarded and run_cur.rowcount != 1:
                raise errors.ConcurrencyConflict(
                    "the run changed since it was loaded", run_id=str(changes.run.run_id)
                )

    def add_audits(self, audits: Iterable[AuditRecord]) -> None:
        raw = self._scope().connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        with raw.cursor() as cur:
            self._many(cur, "audit_log", [rows.audit_to_row(a) for a in audits])

    @staticmethod
    def _many(cur: psycopg.Cursor[Any], table: str, values: list[dict[str, Any]]) -> None:
        if values:
            cur.executemany(_INSERT[table], [_adapt(v) for v in values])

    def _checkpoint(self, name: str) -> None:
        if self._fault is not None:
            self._fault(name)
