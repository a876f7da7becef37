"""The Ray-layer test harness: one tenant's view of the deployed hosts, scheduler and client.

Every test gets a fresh tenant and agent ids derived from it: claims sweep all tenants, so
unique agent ids keep one test's workers from leasing another test's attempts. Reads of the
store go through the app role inside the tenant (row-level security applies).

Nothing here sleeps to synchronise: waits are on the run's event stream (``client.watch``) or
poll the store with a deadline.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from uuid import UUID

from ray.exceptions import RayError
from sqlalchemy import Connection, Engine, text
from support import run_rows

from actors.placement import host_index
from runcontrol.client import Claim, RunControlClient
from runcontrol.commands import DecideApproval, SubmitRequest, SubmitResult, SubmitRun
from runcontrol.domain import (
    ApprovalRequest,
    Decision,
    Principal,
    Release,
    Role,
    WorkflowDefinition,
    canonical_hash,
    errors,
)
from runcontrol.store import Database
from runcontrol.store import queries as q
from runcontrol.store.tables import attempts, audit_log, leases, outbox, recovery_journal, runs

PROJECT = "proj-1"
REQUESTER = "alice"
REVIEWER = "rita"
T = TypeVar("T")


def outcome_hash(n: Any = 1) -> str:
    return canonical_hash({"outcome": n})


def proposal_hash(n: Any = 1) -> str:
    return canonical_hash({"proposal": n})


def run_async(coro: Awaitable[T], timeout: float = 60.0) -> T:
    """Run a test's coroutine on a fresh loop, bounded so a hang fails instead of blocking."""

    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


def assert_typed(exc: BaseException, cls: type[BaseException]) -> None:
    """The error crossed the Ray boundary as exactly ``cls`` (not a Ray error wrapping it)."""
    assert type(exc) is cls, f"expected {cls.__name__}, got {type(exc).__mro__}"
    assert not isinstance(exc, RayError)


async def poll(
    check: Callable[[], Any], what: str, timeout: float = 15.0, interval: float = 0.05
) -> Any:
    """Call ``check`` (sync or async) until it returns something truthy, or fail at the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(interval)


_HOLD_NEXT_EVENT = text(
    "INSERT INTO outbox (event_id, tenant_id, project_id, run_id, seq, topic, event_type,"
    " producer, schema_version, payload, occurred_at)"
    " SELECT :event_id, :tenant, :project, :run_id,"
    " coalesce((SELECT event_seq FROM runs WHERE run_id = :run_id), 0) + 1,"
    " 'test.hold', 'Held', 'test', 1, '{}', now()"
)


def hold_next_event(conn: Connection, tenant: str, run_id: UUID) -> int:
    """In ``conn``'s open transaction (the owner's), insert run ``run_id``'s next outbox row:
    the statement that writes the run's next event then waits on this transaction's
    uncommitted ``(run_id, seq)`` (unique), and no other statement does. A rollback lets it
    go on and commit. Answers this backend's pid (``waiting_on``)."""
    conn.execute(text("SELECT set_config('runcontrol.tenant_id', :t, true)"), {"t": tenant})
    params = {"event_id": uuid.uuid4(), "tenant": tenant, "project": PROJECT, "run_id": run_id}
    conn.execute(_HOLD_NEXT_EVENT, params)
    pid: int = conn.execute(text("SELECT pg_backend_pid()")).scalar_one()
    return pid


def waiting_on(owner: Engine, pid: int) -> int:
    """How many statements wait for a lock the backend ``pid`` holds."""
    with owner.connect() as conn:
        query = text(
            "SELECT count(*) FROM pg_stat_activity WHERE :pid = ANY(pg_blocking_pids(pid))"
        )
        return int(conn.execute(query, {"pid": pid}).scalar_one())


class RayHarness:
    def __init__(self, runtime: Any, db: Database, tenant: str) -> None:
        self.rt = runtime
        self.client: RunControlClient = runtime.client
        self.db = db
        self.tenant = tenant

    # ------------------------------------------------------------------ identities

    def agent(self, name: str) -> str:
        return f"{name}-{self.tenant}"

    def principal(self, subject: str = REQUESTER, *roles: Role) -> Principal:
        return Principal(subject, self.tenant, PROJECT, frozenset(roles or (Role.REQUESTER,)))

    def reviewer(self, subject: str = REVIEWER) -> Principal:
        return self.principal(subject, Role.REVIEWER)

    # ------------------------------------------------------------------ releases and runs

    def publish(self, *steps: dict[str, Any], workflow_id: str = "wf") -> Release:
        """Publish ``steps`` (camelCase step dicts; agentId names are made tenant-unique)."""
        definition = WorkflowDefinition.from_dict(
            {
                "workflowId": workflow_id,
                "steps": [dict(s, agentId=self.agent(s["agentId"])) for s in steps],
            }
        )
        clock = self.rt.container.env.clock
        release: Release = self.rt.container.releases.publish(
            self.tenant, definition, "tester", clock.now()
        )
        return release

    def request(
        self, key: str | None = None, input: dict[str, Any] | None = None, workflow_id: str = "wf"
    ) -> SubmitRequest:
        return SubmitRequest(
            project_id=PROJECT,
            idempotency_key=key or f"key-{uuid.uuid4().hex[:8]}",
            workflow_id=workflow_id,
            model_profile_id="code-agent",
            input=input if input is not None else {"repo": "x"},
            release_alias="latest",
        )

    async def submit(
        self, request: SubmitRequest | None = None, client: RunControlClient | None = None
    ) -> SubmitResult:
        principal = self.principal()
        return await (client or self.client).send(
            SubmitRun(
                tenant_id=principal.tenant_id,
                run_id=uuid.uuid4(),
                principal=principal,
                request=request or self.request(),
            )
        )

    async def approve(
        self, approval: ApprovalRequest, principal: Principal | None = None
    ) -> ApprovalRequest:
        """An approval of ``approval`` as it was seen (its version and hash), by a Reviewer."""
        return await self.decide(
            principal or self.reviewer(),
            approval.approval_id,
            Decision.APPROVE,
            approval.version,
            approval.proposal_hash,
        )

    async def approve_requested(self, payload: dict[str, Any]) -> ApprovalRequest:
        """A Reviewer approves the request an ``ApprovalRequested`` event's ``payload`` announced
        (at its first version)."""
        return await self.decide(
            self.reviewer(),
            UUID(payload["approvalId"]),
            Decision.APPROVE,
            1,
            payload["proposalHash"],
        )

    async def decide(
        self,
        principal: Principal,
        approval_id: UUID,
        decision: Decision,
        version: int,
        proposal_hash: str,
        reason: str | None = None,
        client: RunControlClient | None = None,
    ) -> ApprovalRequest:
        """A decision as a command to the approval's run (located first with a read of the
        database, as the API does)."""
        client = client or self.client

        def locate() -> UUID | None:
            with self.db.tenant(principal.tenant_id) as conn:
                return q.approval_run(conn, approval_id)

        run_id = await asyncio.to_thread(locate)
        if run_id is None:
            raise errors.ApprovalNotFound(f"approval {approval_id} not found")
        return await client.send(
            DecideApproval(
                tenant_id=principal.tenant_id,
                run_id=run_id,
                approval_id=approval_id,
                principal=principal,
                decision=decision,
                version=version,
                proposal_hash=proposal_hash,
                reason=reason,
            )
        )

    async def claim(
        self,
        *agents: str,
        holder: str = "worker-1",
        timeout: float = 10.0,
        client: RunControlClient | None = None,
    ) -> Claim:
        found = await (client or self.client).claim(
            [self.agent(a) for a in agents], holder, timeout
        )
        assert found is not None, f"nothing to claim for {agents} within {timeout}s"
        assert found.tenant_id == self.tenant
        return found

    def host_of(self, run_id: UUID) -> int:
        return host_index(run_id, self.rt.settings.grains.host_count)

    # ------------------------------------------------------------------ events

    async def wait_event(
        self,
        run_id: UUID,
        predicate: Callable[[dict[str, Any]], bool],
        what: str,
        *,
        after: int = 0,
        timeout: float = 15.0,
        client: RunControlClient | None = None,
    ) -> dict[str, Any]:
        """The first event after ``after`` matching ``predicate`` (watch, bounded)."""
        try:
            async with asyncio.timeout(timeout):
                async for event in (client or self.client).watch(
                    self.tenant, run_id, after, wait_s=1.0
                ):
                    if predicate(event):
                        return event
        except TimeoutError:
            pass
        seen = [(e["seq"], e["type"]) for e in self.outbox_events(run_id)]
        raise AssertionError(f"no {what} for run {run_id} within {timeout}s; events: {seen}")

    async def wait_type(self, run_id: UUID, event_type: str, **kw: Any) -> dict[str, Any]:
        return await self.wait_event(run_id, lambda e: e["type"] == event_type, event_type, **kw)

    async def history(
        self, run_id: UUID, *, timeout: float = 20.0, client: RunControlClient | None = None
    ) -> list[dict[str, Any]]:
        """Every event of the run from seq 1 until its terminal event (watch, bounded)."""
        found: list[dict[str, Any]] = []
        try:
            async with asyncio.timeout(timeout):
                async for event in (client or self.client).watch(
                    self.tenant, run_id, 0, wait_s=1.0
                ):
                    found.append(event)
        except TimeoutError:
            raise AssertionError(
                f"run {run_id} not terminal within {timeout}s: "
                f"{[(e['seq'], e['type']) for e in found]}"
            ) from None
        return found

    # ------------------------------------------------------------------ store reads

    def rows(self, table: Any, run_id: UUID, order: Any = None) -> list[Any]:
        return run_rows(self.db, self.tenant, table, run_id, order)

    def run_row(self, run_id: UUID) -> Any:
        (row,) = self.rows(runs, run_id)
        return row

    def outbox(self, run_id: UUID) -> list[Any]:
        return self.rows(outbox, run_id, outbox.c.seq)

    def outbox_events(self, run_id: UUID) -> list[dict[str, Any]]:
        return [
            {"seq": r.seq, "type": r.event_type, "payload": r.payload, "attemptId": r.attempt_id}
            for r in self.outbox(run_id)
        ]

    def journal(self, run_id: UUID) -> list[Any]:
        return self.rows(recovery_journal, run_id, recovery_journal.c.sequence)

    def audits(self, run_id: UUID, kind: str | None = None) -> list[Any]:
        found = self.rows(audit_log, run_id, audit_log.c.id)
        return [a for a in found if kind is None or a.kind == kind]

    def attempts(self, run_id: UUID) -> list[Any]:
        return self.rows(attempts, run_id, attempts.c.dispatched_at)

    def leases(self, run_id: UUID) -> list[Any]:
        """In the order they were granted (not by token: then "increasing" proves "unique")."""
        return self.rows(leases, run_id, leases.c.granted_at)

    def assert_consistent(self, run_id: UUID) -> Any:
        """The store invariants one run must keep, whatever raced on it."""
        run = self.run_row(run_id)
        seqs = [r.seq for r in self.outbox(run_id)]
        assert seqs == list(range(1, run.event_seq + 1)), f"event seq not gap-free: {seqs}"
        journal = [j.sequence for j in self.journal(run_id)]
        assert journal == list(range(1, run.journal_seq + 1)), f"journal not gap-free: {journal}"
        all_leases = self.leases(run_id)
        tokens = [x.fencing_token for x in all_leases]
        assert len(tokens) == len(set(tokens)), f"fencing tokens repeat: {tokens}"
        by_attempt: dict[UUID, list[int]] = {}
        for lease in all_leases:  # granted later -> a larger token, per attempt
            by_attempt.setdefault(lease.attempt_id, []).append(lease.fencing_token)
        for granted in by_attempt.values():
            assert granted == sorted(granted), f"a later lease has a smaller token: {granted}"
        assert not tokens or max(tokens) <= run.fencing_seq
        current: dict[UUID, int] = {}
        for lease in all_leases:
            if lease.released_at is None:
                current[lease.attempt_id] = current.get(lease.attempt_id, 0) + 1
        assert all(n == 1 for n in current.values()), f"two current leases: {current}"
        by_step: dict[UUID, list[int]] = {}
        for a in self.attempts(run_id):
            by_step.setdefault(a.step_id, []).append(a.number)
            if a.state in ("Dispatched", "Leased"):
                assert a.attempt_id in current or a.state == "Dispatched"
        for numbers in by_step.values():
            assert sorted(numbers) == list(range(1, len(numbers) + 1)), numbers
        recorded = [
            r.attempt_id for r in self.outbox(run_id) if r.event_type == "AttemptOutcomeRecorded"
        ]
        assert len(recorded) == len(set(recorded)), "an attempt has two outcomes"
        return run
