"""The write path's machinery: a grain's change as one ``runcontrol_apply`` document, and the
asynchronous store a grain loads and commits through (the group commit that sends every
document ready at the same moment as one statement is ``store/group.py``).

One I/O model: everything here is awaited on the caller's event loop (psycopg async). A run
host runs its grains on its loop; nothing is handed to a thread. ``docs/write-path.md``
describes the path end to end.
"""

from __future__ import annotations

import asyncio
import re
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any
from uuid import UUID

import orjson
import psycopg
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool, PoolTimeout
from sqlalchemy import Table

from ..domain import AuditRecord, Options, RunAggregate, errors, model
from ..domain.events import AttemptDispatched, AttemptResumed
from ..domain.flow import lock_order
from ..json_dumps import dumps
from . import answers, lean, rows
from .database import MOVED as _MOVED  # a fence of a shard's move: route again
from .notify import libpq_url
from .tables import (
    approval_decisions,
    approval_requests,
    attempt_results,
    attempts,
    cancellation_intents,
    journaled_calls,
    leases,
    runs,
    steps,
    tool_calls,
)

DISPATCH_CHANNEL = "runcontrol_dispatch"
EVENTS_CHANNEL = "runcontrol_events"
CONFIG_CHANNEL = (
    "runcontrol_config"  # a policy revision or a release alias changed (payload: tenant)
)
APPLICATION_NAME = "runcontrol-grains"  # how a host's store sessions show in pg_stat_activity

# What the database answered for one document: None (committed) or (SQLSTATE, message).
Answer = tuple[str, str] | None
_APPLY = "SELECT runcontrol_apply(%s::jsonb)"
_APPLY_MANY = "SELECT runcontrol_apply_many(%s::jsonb)"
_SET_TENANT = "SELECT set_config('runcontrol.tenant_id', %s, true)"
# A lost race: the version guard (RC409), or the database breaking a deadlock between two
# activations' transactions.
_LOST_RACE = frozenset({"RC409", "40P01", "40001"})
_BUDGET_DENIED = "RC402"
_CAPACITY_DENIED = "RC429"
_FLOW_DENIED = "RC430"
_PRE_APPROVAL_USED_UP = "RC431"  # runcontrol_template_use: a template's use past its maxUses
# A JSON-escaped NUL (an even run of backslashes, then \u0000): not a literal "\u0000" in text.
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


class DuplicateSubmission(Exception):
    """The idempotency key already names a run (raised by ``conclude``, handled by the grain)."""


@dataclass(frozen=True, slots=True)
class StoredAnswer:
    """A command's answer, committed with its effect (``command_answers``): its resends get it."""

    command_id: str
    command: str
    value: Any
    at: datetime
    fingerprint: str  # what the command asked: a reused id with another content is refused


@dataclass(frozen=True, slots=True)
class Reservation:
    """A budget reservation made by the run's own statement (migration 0007): refused with
    ``BudgetReservationDenied`` when the tenant's open reservations would pass ``limit_usd``."""

    reservation_id: UUID
    amount_usd: float
    limit_usd: float | None
    at: datetime


@dataclass(frozen=True, slots=True)
class PendingCommit:
    """A prepared ``runcontrol_apply`` document and what its answer is checked against."""

    doc: str
    key: str  # the run: a group writes its runs in this order (no deadlock between groups)
    changes: Any
    agg: RunAggregate | None = None  # whose stored run ``run_row`` is once this commits
    run_row: dict[str, Any] | None = None
    children: dict[str, list[dict[str, Any]]] | None = None  # and its rows (``lean``)


# The run's row as the database holds it, per aggregate (as loaded, then as each commit wrote
# it): a document carries only the columns that differ from it (issue 33). Weak: an aggregate
# the grain drops takes its row with it. An aggregate not found here (made some other way)
# sends its whole row.
_STORED_RUN: weakref.WeakKeyDictionary[RunAggregate, dict[str, Any]] = weakref.WeakKeyDictionary()
# Written outside the run's version too (a flow-control promotion makes the run due, 0017):
# always sent, so the reminder is the aggregate's, as with whole rows.
_ALWAYS_SENT = ("run_id", "next_due_at")


def _changed_columns(agg: RunAggregate, row: dict[str, Any]) -> dict[str, Any]:
    """The columns of ``row`` that differ from the run as stored (all without a record)."""
    stored = _STORED_RUN.get(agg)
    if stored is None:
        return row
    # the same object is the same value (the run's input is not compared key by key)
    return {
        c: v
        for c, v in row.items()
        if c in _ALWAYS_SENT or ((s := stored.get(c, v)) is not v and s != v)
    }


# ---------------------------------------------------------------------- the document

# The command whose answer its result row carries (0041): an outcome report answers its attempt.
_ANSWERED_BY_RESULT = "ReportOutcome"


def _on_result_row(answer: StoredAnswer, results: Sequence[dict[str, Any]]) -> bool:
    """Whether ``answer`` is carried by the result row the same document writes (0041): an
    outcome report's, whose answer is its attempt as stored; the row then names the command
    and its fingerprint, and no ``command_answers`` row is written."""
    value = answer.value
    if answer.command != _ANSWERED_BY_RESULT or not isinstance(value, model.Attempt):
        return False
    for row in results:  # the row its own decision wrote: the same attempt, the same instant
        if (
            row["attempt_id"] == value.attempt_id
            and row["created_at"] == answer.at
            and row["command_id"] is None
        ):
            row["command_id"], row["fingerprint"] = answer.command_id, answer.fingerprint
            return True
    return False


def _json_default(value: Any) -> Any:
    if isinstance(value, Decimal):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def _dumps(doc: dict[str, Any]) -> str:
    text = dumps(doc, _json_default).decode()
    if "\\u0000" in text and _NUL.search(text):
        # PostgreSQL text cannot hold NUL. Refused here, the command fails alone; sent, it
        # would fail every document of its group.
        raise errors.ValidationFailed("text may not contain NUL characters")
    return text


def prepare(
    tenant_id: str,
    agg: RunAggregate,
    options: Options,
    *,
    release_budget_at: datetime | None = None,
    answer: StoredAnswer | None = None,
    also_answers: Sequence[StoredAnswer] = (),
    reserve: Reservation | None = None,
) -> PendingCommit | None:
    """The document committing what the aggregate recorded since its last commit, or None when
    it recorded nothing. ``release_budget_at``: the statement also releases the run's budget
    reservation (migration 0004); ``answer``: it stores the command's answer (0006), and
    ``also_answers`` those of the grants the command made (fused grants);
    ``reserve``: it makes the run's budget reservation (0007). The slots its dispatches need
    (concurrency keys, the tenant's cap) are taken or refused (``FlowDenied``) by the same
    statement, and its held steps queued (0017)."""
    changes = agg.take_changes()
    if changes.empty:
        return None
    run_id = str(changes.run.run_id)
    run_row = rows.to_row(changes.run, next_due_at=agg.next_due(options))
    doc: dict[str, Any] = {"tenant": tenant_id}
    if changes.expected_version is None:
        doc["mode"] = "insert"
        doc["run"] = run_row
    elif changes.run_dirty:
        # only what changed, guarded by the version (0026's runcontrol_patch_runs)
        doc["mode"] = "patch"
        doc["expected_version"] = changes.expected_version
        doc["run"] = _changed_columns(agg, run_row)
    else:
        doc["run"] = {"run_id": run_id}  # what the other clauses key on
    children: dict[str, list[dict[str, Any]]] = {}  # steps, attempts, leases: sent lean
    if changes.steps:
        children["steps"] = [rows.to_row(x) for x in changes.steps.values()]
    if changes.attempts:
        children["attempts"] = _attempt_rows(agg, changes.attempts.values())
    if changes.results:
        doc["results"] = [rows.to_row(r) for r in changes.results]
    if changes.calls:
        doc["calls"] = [rows.to_row(c) for c in changes.calls]
    if changes.leases:
        children["leases"] = [rows.to_row(x) for x in changes.leases.values()]
    for table, found in children.items():  # in the order the document's keys had
        doc[table], doc[f"{table}_patch"] = lean.split(agg, table, found)
        if not doc[table]:
            del doc[table]
        if not doc[f"{table}_patch"]:
            del doc[f"{table}_patch"]
    if changes.tool_calls:
        doc["tool_calls"] = [rows.to_row(t) for t in changes.tool_calls.values()]
    if changes.approvals:
        doc["approvals"] = [rows.to_row(a) for a in changes.approvals.values()]
    if changes.decisions:
        doc["decisions"] = [rows.to_row(d) for d in changes.decisions]
    if changes.intents:
        doc["intents"] = [rows.to_row(i) for i in changes.intents]
    if changes.events:
        doc["outbox"] = [rows.to_row(e) for e in changes.events]  # unpublished: NULL
        if changes.journal:  # on the document's last event (0033; invariant 3: it has one)
            doc["outbox"][-1]["journal"] = rows.journal_entries(changes.journal)
        # Wake event watchers, and long-polling claimers of a dispatched agent: NOTIFYed on
        # commit, to channels somebody listens on (migration 0026).
        doc["wake_run"] = run_id
        dispatched: set[str] = set()
        # A resumed attempt (after an approval decision) wakes claimers too, but is not a new
        # admission: the tenant's cap was checked when it was first dispatched.
        resumed: set[str] = set()
        for e in changes.events:
            if isinstance(e.body, AttemptDispatched):
                dispatched.add(e.body.agent_id)
            elif isinstance(e.body, AttemptResumed):
                resumed.add(e.body.agent_id)
        if dispatched | resumed:
            doc["wake_agents"] = sorted(dispatched | resumed)
    if changes.flow:
        # in one order across statements: two documents take the keys' locks alike
        doc["flow"] = sorted(changes.flow, key=lock_order)
    if changes.flow_wait:
        doc["flow_wait"] = sorted(changes.flow_wait, key=lock_order)
    if "mode" in doc and any(s.held is not None for s in agg.steps):
        doc["flow_held"] = True  # the statement keeps a promotion's reminder (0017)
    if changes.journal and not changes.events:  # refused (a transition without its event)
        doc["journal"] = [rows.to_row(j) for j in changes.journal]
    if changes.audits:
        doc["audits"] = [rows.to_row(a) for a in changes.audits]
    if release_budget_at is not None:
        doc["release_budget"] = release_budget_at.isoformat()
    if reserve is not None:
        doc["reserve"] = {
            "reservation_id": str(reserve.reservation_id),
            "amount_usd": reserve.amount_usd,
            "limit_usd": reserve.limit_usd,
            "created_at": reserve.at.isoformat(),
        }
    every = ([answer] if answer is not None else []) + list(also_answers)
    stored = [
        {
            "tenant_id": tenant_id,
            "run_id": run_id,
            "command_id": a.command_id,
            "command": a.command,
            "answer": answers.encode(a.value),
            "created_at": a.at.isoformat(),
            "fingerprint": a.fingerprint,
        }
        for a in every
        if not _on_result_row(a, doc.get("results", ()))
    ]
    if len(stored) == 1 and len(every) == 1:
        doc["answer"] = stored[0]
    elif stored:
        doc["answers"] = stored
    # the row the run has once this commits (a document that does not write it leaves the
    # record as it was: what it did not write is still to send)
    written = run_row if "mode" in doc else None
    return PendingCommit(_dumps(doc), run_id, changes, agg, written, children)


def _loaded_children(agg: RunAggregate) -> dict[str, list[dict[str, Any]]]:
    """The rows of a loaded aggregate's steps, attempts and leases, as ``prepare`` makes them."""
    return {
        "steps": [rows.to_row(x) for x in agg.steps],
        "attempts": _attempt_rows(agg, agg.attempts.values()),
        "leases": [rows.to_row(x) for x in agg.leases.values()],
    }


def _attempt_rows(agg: RunAggregate, attempts: Iterable[model.Attempt]) -> list[dict[str, Any]]:
    agent = {s.step_id: s.agent_id for s in agg.steps}  # the step's agent, for claims
    return [rows.to_row(a, agent_id=agent[a.step_id]) for a in attempts]


def audits_document(tenant_id: str, audits: Sequence[AuditRecord]) -> str:
    """A document that only appends audit records (a refused command's)."""
    return _dumps({"tenant": tenant_id, "audits": [rows.to_row(a) for a in audits]})


def conclude(pending: PendingCommit, answer: Answer) -> None:
    """Take the database's answer for a document: returns when it committed, else raises its
    typed error."""
    if answer is None:
        if pending.agg is not None and pending.run_row is not None:
            _STORED_RUN[pending.agg] = pending.run_row
        if pending.agg is not None and pending.children:
            lean.remember(pending.agg, pending.children)
        return
    sqlstate, message = answer
    changes = pending.changes
    run_id = str(changes.run.run_id)
    if sqlstate in _LOST_RACE:
        raise errors.ConcurrencyConflict("the run changed since it was loaded", run_id=run_id)
    if sqlstate == _MOVED:
        raise errors.ShardMoved(message.splitlines()[0], run_id=run_id)
    if sqlstate == "RC001":
        raise DuplicateSubmission(changes.run.idempotency_key)
    if sqlstate == _BUDGET_DENIED:
        raise errors.BudgetReservationDenied(message.splitlines()[0])
    if sqlstate == _CAPACITY_DENIED:
        raise errors.CapacityDenied(message.splitlines()[0])
    if sqlstate == _PRE_APPROVAL_USED_UP:
        raise errors.PreApprovalUsedUp(message.splitlines()[0])
    if sqlstate == _FLOW_DENIED:
        first = message.splitlines()[0]
        found = orjson.loads(first[first.index("{") :])
        raise errors.FlowDenied(first, **found)
    try:
        error_class: type[psycopg.Error] = psycopg.errors.lookup(sqlstate)
    except KeyError:  # a code psycopg does not know (e.g. a new RCxxx of ours)
        error_class = psycopg.DatabaseError
    raise error_class(message)


def apply_statement(docs: list[str]) -> tuple[str, tuple[str]]:
    """The statement committing these documents: one alone needs no subtransaction."""
    if len(docs) == 1:
        return _APPLY, (docs[0],)
    return _APPLY_MANY, ("[" + ",".join(docs) + "]",)


def group_answers(docs: list[str], row: Any) -> list[Answer]:
    """Per document, what the database answered: None (committed) or (SQLSTATE, message)."""
    if len(docs) == 1:
        return [None]
    assert row is not None
    return [None if a is None else (a[0], a[1]) for a in row[0]]


# ---------------------------------------------------------------------- the store


def _select(table: Table, where: str) -> str:
    columns = ", ".join(str(c.name) for c in table.columns)
    return f"SELECT {columns} FROM {table.name} WHERE {where}"  # noqa: S608 - our own metadata


# The run and its rows, as of one snapshot (REPEATABLE READ): one round trip, no torn reads.
LOAD = (
    (runs, _select(runs, "run_id = %s")),
    (steps, _select(steps, "run_id = %s")),
    (attempts, _select(attempts, "run_id = %s")),
    (leases, _select(leases, "run_id = %s AND released_at IS NULL")),
    (approval_requests, _select(approval_requests, "run_id = %s")),
    (approval_decisions, _select(approval_decisions, "run_id = %s")),
    (cancellation_intents, _select(cancellation_intents, "run_id = %s")),
    (tool_calls, _select(tool_calls, "run_id = %s")),
    (attempt_results, _select(attempt_results, "run_id = %s")),
    (journaled_calls, _select(journaled_calls, "run_id = %s")),
)


def aggregate(run_id: UUID, found: Sequence[list[dict[str, Any]]]) -> RunAggregate:
    """The run of ``LOAD``'s rows (in its order): ``RunNotFound`` without its row."""
    run, *others = found
    if not run:
        raise errors.RunNotFound(f"run {run_id} not found", run_id=str(run_id))
    kinds = (
        model.Step,
        model.Attempt,
        model.Lease,
        model.ApprovalRequest,
        model.ApprovalDecision,
        model.CancellationIntent,
        model.ToolCall,
        model.AttemptResult,
        model.JournaledCall,
    )
    held: list[list[Any]] = [
        [rows.from_row(kind, r) for r in rs] for kind, rs in zip(kinds, others, strict=True)
    ]
    return RunAggregate(rows.from_row(model.Run, run[0]), *held)


_ANSWERED = "SELECT command_id FROM command_answers WHERE run_id = %s AND created_at >= %s"
_STORED_ANSWER = (
    "SELECT answer, fingerprint FROM command_answers"
    " WHERE run_id = %s AND command_id = %s AND created_at >= %s"
)
# An outcome report's answer, carried by its result row (0041): its attempt as stored.
_RESULT_ANSWER = (
    f"SELECT {', '.join(f'a.{c.name}' for c in attempts.columns)}, r.fingerprint AS printed"
    " FROM attempt_results r JOIN attempts a ON a.attempt_id = r.attempt_id AND a.run_id = r.run_id"
    " WHERE r.run_id = %s AND r.command_id = %s AND r.created_at >= %s"
)
_VERSION = "SELECT version FROM runs WHERE run_id = %s"
_KEY = "SELECT run_id FROM runs WHERE tenant_id = %s AND project_id = %s AND idempotency_key = %s"


class Store:
    """The grains' asynchronous view of the database: a small pool of autocommit connections
    for the app role (row-level security applies, as everywhere), used from one event loop.

    Reads run in one pipelined transaction (``BEGIN``, the tenant scope, the reads and
    ``COMMIT`` in one round trip); commits are ``runcontrol_apply`` statements, each its own
    transaction. A lost connection surfaces as ``errors.Unavailable`` (retryable; whether a
    commit happened is unknown, and a resend of its command id is answered exactly once)."""

    def __init__(self, app_url: str, *, size: int = 8) -> None:
        self._pool = AsyncConnectionPool(
            libpq_url(app_url),
            min_size=1,
            max_size=size,
            kwargs={"autocommit": True, "application_name": APPLICATION_NAME},
            open=False,
            timeout=30.0,
        )
        self._opened: asyncio.Lock | None = None
        self._open = False
        # statements that committed documents, the documents in them and their size (JSON
        # characters: bytes but for non-ASCII text) (benchmarks, stats), and read transactions
        # (loads, port reads)
        self.statements_sent = 0
        self.documents_sent = 0
        self.document_bytes_sent = 0
        self.reads = 0
        # other autocommit statements (a rate limit's reservation or consumption)
        self.calls = 0

    def for_run(self, run_id: UUID) -> Store:
        """The store of the run ``run_id``'s shard: this one (``store/shards.RoutedStore``
        routes)."""
        return self

    def for_tenant(self, tenant_id: str) -> Store:
        """The store of the tenant's shard: this one (``store/shards.RoutedStore`` routes)."""
        return self

    async def rerouted(self, run_id: UUID, refused_by: Store) -> bool:
        """Whether a fresh directory routes ``run_id`` elsewhere than ``refused_by`` (after a
        move's fence refused its commit): with one database, never."""
        return False

    async def open(self) -> None:
        if self._open:
            return
        if self._opened is None:
            self._opened = asyncio.Lock()
        async with self._opened:
            if not self._open:
                await self._pool.open()
                self._open = True

    async def close(self) -> None:
        if self._open:
            await self._pool.close()
            self._open = False

    async def _conn(self) -> Any:
        await self.open()
        return self._pool.connection()

    async def read(
        self, tenant_id: str, queries: Sequence[tuple[str, Sequence[Any]]]
    ) -> list[list[dict[str, Any]]]:
        """Run ``queries`` in one transaction limited to ``tenant_id`` (one snapshot, one round
        trip): the rows of each, in order. A read that met a connection the database dropped
        (a restart) is tried once more, after the pool has discarded every broken one."""
        if not tenant_id:
            raise ValueError("a tenant-scoped read needs a tenant id")
        for retry in (True, False):
            try:
                return await self._read(tenant_id, queries)
            except errors.Unavailable:
                if not retry:
                    raise
        raise AssertionError("unreachable")

    async def _read(
        self, tenant_id: str, queries: Sequence[tuple[str, Sequence[Any]]]
    ) -> list[list[dict[str, Any]]]:
        self.reads += 1
        try:
            async with await self._conn() as conn:
                try:
                    async with conn.pipeline():
                        await conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                        await conn.execute(_SET_TENANT, (tenant_id,))
                        cursors = []
                        for sql, params in queries:
                            cur = conn.cursor(row_factory=dict_row)
                            await cur.execute(sql, params)
                            cursors.append(cur)
                        await conn.execute("COMMIT")
                    return [await cur.fetchall() for cur in cursors]
                except psycopg.DatabaseError:
                    if not conn.broken:
                        await conn.rollback()
                    raise
        except psycopg.OperationalError as exc:
            await self._lost()
            raise errors.Unavailable("the database connection was lost") from exc
        except PoolTimeout as exc:
            raise errors.Unavailable("no database connection is free") from exc

    async def _lost(self) -> None:
        """A connection was found broken: the others opened before it probably are too (the
        server restarted). Have the pool test and replace its idle ones now, so the next
        commands do not each meet one (no per-checkout ping: that costs every command a round
        trip)."""
        try:
            await self._pool.check()
        except Exception:  # noqa: BLE001 - the next checkout fails and retries in its turn
            pass

    async def rows(
        self, tenant_id: str, sql: str, params: Sequence[Any] = ()
    ) -> list[dict[str, Any]]:
        """One read in a transaction limited to ``tenant_id``."""
        (found,) = await self.read(tenant_id, [(sql, params)])
        return found

    async def load(
        self, tenant_id: str, run_id: UUID, answered_since: datetime
    ) -> tuple[RunAggregate, set[str]]:
        """The run and its rows as of one commit, and the ids of its commands answered since
        ``answered_since`` (their answers are stored)."""
        queries: list[tuple[str, Sequence[Any]]] = [(sql, (run_id,)) for _, sql in LOAD]
        queries.append((_ANSWERED, (run_id, answered_since)))
        *found, answered = await self.read(tenant_id, queries)
        agg = aggregate(run_id, found)
        _STORED_RUN[agg] = rows.to_row(agg.run, next_due_at=found[0][0]["next_due_at"])
        lean.remember(agg, _loaded_children(agg))
        # and the outcome reports its result rows answer (0041)
        reported = {
            r.command_id
            for r in agg.results.values()
            if r.command_id is not None and r.created_at >= answered_since
        }
        return agg, {r["command_id"] for r in answered} | reported

    async def stored_answer(
        self, tenant_id: str, run_id: UUID, command_id: str, since: datetime
    ) -> tuple[Any, str | None] | None:
        """``(answer, fingerprint)`` if the command committed since ``since``, else None."""
        asked = (run_id, command_id, since)
        found, derived = await self.read(
            tenant_id, [(_STORED_ANSWER, asked), (_RESULT_ANSWER, asked)]
        )
        if found:
            return answers.decode(found[0]["answer"]), found[0]["fingerprint"]
        if derived:  # an outcome report's, from its result row and its attempt (0041)
            return rows.from_row(model.Attempt, derived[0]), derived[0]["printed"]
        return None

    async def run_version(self, tenant_id: str, run_id: UUID) -> int | None:
        found = await self.rows(tenant_id, _VERSION, (run_id,))
        return None if not found else int(found[0]["version"])

    async def run_id_for_key(self, tenant_id: str, project_id: str, key: str) -> UUID | None:
        found = await self.rows(tenant_id, _KEY, (tenant_id, project_id, key))
        return None if not found else UUID(str(found[0]["run_id"]))

    async def call(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """One autocommit statement (its own short transaction: a function that sets the
        tenant itself, as ``runcontrol_apply`` does), answering its rows."""
        self.calls += 1
        try:
            async with await self._conn() as conn, conn.cursor(row_factory=dict_row) as cur:
                await cur.execute(sql, params)
                found: list[dict[str, Any]] = await cur.fetchall()
                return found
        except psycopg.OperationalError as exc:
            await self._lost()
            raise errors.Unavailable("the database connection was lost") from exc
        except psycopg.DatabaseError as exc:  # a rate bucket's fence (runcontrol_fenced_write)
            if exc.sqlstate == _MOVED:
                raise errors.ShardMoved(str(exc).splitlines()[0]) from exc
            raise
        except PoolTimeout as exc:
            raise errors.Unavailable("no database connection is free") from exc

    async def send(self, docs: list[str]) -> list[Answer]:
        """Commit ``runcontrol_apply`` documents as one autocommit statement, one
        subtransaction each (migration 0003): one round trip and one WAL flush for all of them.
        Answers per document; raises ``Unavailable`` only when the connection failed, and then
        nobody knows which of them committed."""
        self.statements_sent += 1
        self.documents_sent += len(docs)
        self.document_bytes_sent += sum(map(len, docs))
        try:
            async with await self._conn() as conn, conn.cursor() as cur:
                try:
                    await cur.execute(*apply_statement(docs))
                except psycopg.DatabaseError as exc:
                    if conn.broken or len(docs) > 1:  # the connection failed, or all did
                        raise
                    return [(exc.sqlstate or "", str(exc))]
                return group_answers(docs, await cur.fetchone())
        except psycopg.OperationalError as exc:
            await self._lost()
            raise errors.Unavailable("the database connection was lost") from exc
        except PoolTimeout as exc:
            raise errors.Unavailable("no database connection is free") from exc
