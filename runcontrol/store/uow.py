"""UnitOfWork: one tenant-scoped transaction in which a command's row changes, its outbox
events and its recovery-journal entries commit together or not at all (invariant 3)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from types import TracebackType
from typing import Any
from uuid import UUID

import orjson
import psycopg
from sqlalchemy import Connection, select
from sqlalchemy import exc as sa_exc

from ..domain import AuditRecord, Event, Options, RunAggregate, errors
from . import answers, rows
from .database import Database
from .group import Answer
from .tables import (
    approval_decisions,
    approval_requests,
    attempts,
    cancellation_intents,
    command_answers,
    leases,
    runs,
    steps,
)

DISPATCH_CHANNEL = "runcontrol_dispatch"
EVENTS_CHANNEL = "runcontrol_events"

_APPLY = "SELECT runcontrol_apply(%s::jsonb)"
# A lost race: the version guard (RC409), or the database breaking a deadlock between two
# activations' transactions.
_LOST_RACE = frozenset({"RC409", "40P01", "40001"})
_SET_TENANT = "SELECT set_config('runcontrol.tenant_id', %s, true)"
# A JSON-escaped NUL (an even run of backslashes, then \u0000): not a literal "\u0000" in text.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


@dataclass(frozen=True, slots=True)
class PendingCommit:
    """A prepared ``runcontrol_apply`` document and what its answer is checked against."""

    doc: str
    key: str  # the run: a group writes its runs in this order (no deadlock between groups)
    changes: Any


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    """A command's answer, committed with its effect (``command_answers``): its resends get it."""

    command_id: str
    command: str
    value: Any
    at: datetime


class DuplicateSubmission(Exception):
    """The idempotency key already names a run (raised inside the store, handled by the grain)."""


class UnitOfWork:
    def __init__(
        self,
        db: Database,
        tenant_id: str,
        *,
        options: Options | None = None,
    ) -> None:
        self._db = db
        self.options = options or Options()
        self.tenant_id = tenant_id
        self._committed = False

    def __enter__(self) -> UnitOfWork:
        # Both set lazily: a cached grain's command reads nothing, and if another thread's
        # group commit carries its write, it never needs a connection at all.
        self._connection: Connection | None = None
        self._scoped = False
        return self

    @property
    def _conn(self) -> Connection:
        if self._connection is None:
            self._connection = self._db.app.connect()
            self._tx = self._connection.begin()
        return self._connection

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
        if isinstance(exc, sa_exc.TimeoutError):  # no pooled connection came free in time
            self._release()
            raise errors.Unavailable("no database connection is free") from exc
        lost = isinstance(exc, psycopg.OperationalError | sa_exc.OperationalError)
        conn = self._connection
        if conn is not None:
            try:
                if lost:
                    conn.invalidate()  # never hand a broken connection back to the pool
                elif not self._committed and self._tx.is_active:
                    self._tx.rollback()
            finally:
                conn.close()
        if lost:
            # Unknown whether the commit happened: the caller retries the (idempotent) command.
            raise errors.Unavailable("the database connection was lost") from exc

    def commit(self) -> None:
        self._settle()

    def commit_changes(
        self,
        agg: RunAggregate,
        *,
        release_budget_at: datetime | None = None,
        answer: StoredAnswer | None = None,
    ) -> list[Event]:
        """Save and commit the aggregate's changes: one ``runcontrol_apply`` document, sent
        with whatever else this process is committing at the same moment (group commit,
        ``store/group.py``): one statement and one commit for the whole group. Answers the
        events committed."""
        pending = self.prepare_commit(agg, release_budget_at=release_budget_at, answer=answer)
        if pending is None:
            return []
        self.conclude(
            pending, self._db.group.apply(pending.doc, self._db.send_documents, pending.key)
        )
        return list(pending.changes.events)

    def prepare_commit(
        self,
        agg: RunAggregate,
        *,
        release_budget_at: datetime | None = None,
        answer: StoredAnswer | None = None,
    ) -> PendingCommit | None:
        """The document that commits the aggregate's changes, for the caller to send
        (``Database.send_documents``, alone or in a group) and answer with ``conclude``; None
        when there is nothing to write (then this unit is settled). ``release_budget_at``: the
        same statement releases the run's embedded budget reservation (migration 0004);
        ``answer``: the same statement stores the command's answer (migration 0006)."""
        prepared = self._document(agg, release_budget_at, answer)
        if prepared is None:
            self._settle()
            return None
        doc, changes = prepared
        if self._scoped:
            # End this unit's reads (the document is checked by its version) and give the
            # connection back while the document is sent: the sender takes one from the pool,
            # and a waiting unit must not hold one it needs (the pool is finite).
            self._settle()
            self._release()
        return PendingCommit(doc, str(changes.run.run_id), changes)

    def conclude(self, pending: PendingCommit, answer: Answer) -> None:
        """Take the database's answer for a prepared document: raises its typed error."""
        self._committed = True
        if answer is not None:
            self._raise(answer, pending.changes)

    def _release(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _settle(self) -> None:
        if self._connection is not None and self._tx.is_active:
            self._tx.commit()
        self._committed = True

    def _raise(self, answer: tuple[str, str], changes: Any) -> None:
        sqlstate, message = answer
        run_id = str(changes.run.run_id)
        if sqlstate in _LOST_RACE:
            raise errors.ConcurrencyConflict("the run changed since it was loaded", run_id=run_id)
        if sqlstate == "RC001":
            raise DuplicateSubmission(changes.run.idempotency_key)
        try:
            error_class: type[psycopg.Error] = psycopg.errors.lookup(sqlstate)
        except KeyError:  # a code psycopg does not know (e.g. a new RCxxx of ours)
            error_class = psycopg.DatabaseError
        raise error_class(message)

    def _raw(self) -> psycopg.Connection[Any]:
        raw = self._conn.connection.driver_connection
        assert isinstance(raw, psycopg.Connection)
        return raw

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

    def answered(self, run_id: UUID, since: datetime) -> set[str]:
        """Ids of the run's commands committed since ``since`` (their answers are stored)."""
        query = select(command_answers.c.command_id).where(
            command_answers.c.run_id == run_id, command_answers.c.created_at >= since
        )
        return set(self._scope().execute(query).scalars())

    def stored_answer(self, run_id: UUID, command_id: str, since: datetime) -> tuple[bool, Any]:
        """``(True, answer)`` if the command committed since ``since``, else ``(False, None)``."""
        query = select(command_answers.c.answer).where(
            command_answers.c.run_id == run_id,
            command_answers.c.command_id == command_id,
            command_answers.c.created_at >= since,
        )
        stored = self._scope().execute(query).scalar_one_or_none()
        return (False, None) if stored is None else (True, answers.decode(stored))

    def answer_window_start(self, now: datetime) -> datetime:
        return now - timedelta(seconds=self.options.answer_retention_seconds)

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
        """Persist everything the aggregate recorded since the last save, inside this unit's
        transaction (``commit`` commits it): one statement, whatever the command touched."""
        prepared = self._document(agg)
        if prepared is None:
            return
        doc, changes = prepared
        try:
            self._scope().exec_driver_sql(_APPLY, (doc,))
        except sa_exc.DBAPIError as wrapped:
            exc = wrapped.orig
            if not isinstance(exc, psycopg.DatabaseError) or self._raw().broken:
                raise
            self._raise((exc.sqlstate or "", str(exc)), changes)

    def _document(
        self,
        agg: RunAggregate,
        release_budget_at: datetime | None = None,
        answer: StoredAnswer | None = None,
    ) -> tuple[str, Any] | None:
        """The ``runcontrol_apply`` document (JSON) for what the aggregate recorded since the
        last save, or None when it recorded nothing."""
        changes = agg.take_changes()
        if changes.empty:
            return None
        run_row = rows.run_to_row(changes.run)
        run_row["next_due_at"] = agg.next_due(self.options)
        doc: dict[str, Any] = {"tenant": self.tenant_id, "run": run_row}
        if changes.expected_version is None:
            doc["mode"] = "insert"
        elif changes.run_dirty:
            doc["mode"] = "update"
            doc["expected_version"] = changes.expected_version
        if changes.steps:
            doc["steps"] = [rows.step_to_row(x) for x in changes.steps.values()]
        if changes.attempts:
            agent = {s.step_id: s.agent_id for s in agg.steps}
            doc["attempts"] = [
                rows.attempt_to_row(a, agent[a.step_id]) for a in changes.attempts.values()
            ]
        if changes.leases:
            doc["leases"] = [rows.lease_to_row(x) for x in changes.leases.values()]
        if changes.approvals:
            doc["approvals"] = [rows.approval_to_row(a) for a in changes.approvals.values()]
        if changes.decisions:
            doc["decisions"] = [rows.decision_to_row(d) for d in changes.decisions]
        if changes.intents:
            doc["intents"] = [rows.intent_to_row(i) for i in changes.intents]
        if changes.events:
            doc["outbox"] = [rows.event_to_row(e) for e in changes.events]
            # Wake event watchers, and long-polling claimers of a dispatched agent; NOTIFY is
            # delivered only on commit.
            doc["notify_run"] = str(changes.run.run_id)
            agents = {
                e.payload["agentId"] for e in changes.events if e.event_type == "AttemptDispatched"
            }
            if agents:
                doc["notify_agents"] = sorted(agents)
        if changes.journal:
            doc["journal"] = [rows.journal_to_row(j) for j in changes.journal]
        if changes.audits:
            doc["audits"] = [rows.audit_to_row(a) for a in changes.audits]
        if release_budget_at is not None:
            doc["release_budget"] = release_budget_at.isoformat()
        if answer is not None:
            doc["answer"] = {
                "tenant_id": self.tenant_id,
                "run_id": str(changes.run.run_id),
                "command_id": answer.command_id,
                "command": answer.command,
                "answer": answers.encode(answer.value),
                "created_at": answer.at.isoformat(),
            }
        text = orjson.dumps(doc, default=_json_default).decode()
        if "\\u0000" in text and _NUL.search(text):
            # PostgreSQL text cannot hold NUL. Refused here, the command fails alone; sent, it
            # would fail every document of its group.
            raise errors.ValidationFailed("text may not contain NUL characters")
        return text, changes

    def add_audits(self, audits: Iterable[AuditRecord]) -> None:
        doc = {"tenant": self.tenant_id, "audits": [rows.audit_to_row(a) for a in audits]}
        if doc["audits"]:
            self._scope().exec_driver_sql(
                _APPLY, (orjson.dumps(doc, default=_json_default).decode(),)
            )
