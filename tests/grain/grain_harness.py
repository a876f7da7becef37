"""The grain-layer test harness: publishes a workflow release, submits runs through RunGrain
and reads back what was committed.

Every read goes through the app role inside the test's tenant (row-level security applies),
so what a test sees is exactly what that tenant could see.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterable
from typing import Any
from uuid import UUID

from sqlalchemy import text
from support import WORKER, SyncGrain, acquire, drive, report, run_rows

from runcontrol.bootstrap import Container, build
from runcontrol.clock import ManualClock
from runcontrol.commands import (
    SubmitRequest,
    SubmitResult,
    SubmitRun,
    WakeResult,
    WakeRun,
)
from runcontrol.config import Settings
from runcontrol.domain import (
    Attempt,
    AttemptOutcome,
    LeaseGrant,
    Limits,
    Principal,
    Release,
    Role,
    RunAggregate,
    SideEffectClass,
    StepSpec,
    WorkflowDefinition,
    canonical_hash,
)
from runcontrol.domain.access import scopes_of
from runcontrol.edge import commands
from runcontrol.edge.auth import Caller
from runcontrol.grain import RunGrain
from runcontrol.ids import new_run_id
from runcontrol.store import Database
from runcontrol.store.shards import Shards
from runcontrol.store.tables import audit_log, outbox, recovery_journal

PROJECT = "proj-1"
REQUESTER = "alice"


class CeilingRandom(random.Random):
    """Jitter source that always picks the top of the range: backoff delays become exact."""

    def uniform(self, a: float, b: float) -> float:
        return b


def outcome_hash(n: int = 1) -> str:
    return canonical_hash({"outcome": n})


class Harness:
    """One tenant's view of the grain layer, driven synchronously and with a manual clock."""

    def __init__(self, container: Container, tenant: str, clock: ManualClock) -> None:
        self.c = container
        self.env = container.env
        self.db: Database = container.db
        self.tenant = tenant
        self.clock = clock

    # ------------------------------------------------------------------ principals

    def principal(self, subject: str = REQUESTER, *roles: Role) -> Principal:
        return Principal(
            subject=subject,
            tenant_id=self.tenant,
            project_id=PROJECT,
            roles=frozenset(roles or (Role.REQUESTER,)),
        )

    def reviewer(self, subject: str = "rita") -> Principal:
        return self.principal(subject, Role.REVIEWER)

    # ------------------------------------------------------------------ releases and runs

    def publish(
        self,
        *steps: StepSpec,
        workflow_id: str = "wf",
        aliases: Iterable[str] = ("latest",),
    ) -> Release:
        definition = WorkflowDefinition(
            workflow_id, steps or (StepSpec(name="only", agent_id="agent-a"),)
        )
        return self.c.releases.publish(
            self.tenant, definition, "publisher", self.clock.now(), aliases
        )

    def request(
        self,
        key: str | None = None,
        input: dict[str, Any] | None = None,
        *,
        workflow_id: str = "wf",
        limits: Limits | None = None,
        release_alias: str | None = "latest",
    ) -> SubmitRequest:
        return SubmitRequest(
            project_id=PROJECT,
            idempotency_key=key or f"key-{uuid.uuid4().hex[:8]}",
            workflow_id=workflow_id,
            model_profile_id="code-agent",
            input=input if input is not None else {"repo": "x"},
            release_alias=release_alias,
            limits=limits or Limits(),
        )

    def grain(self, run_id: UUID) -> SyncGrain:
        return SyncGrain(RunGrain(self.env, self.tenant, run_id))

    def submit(
        self, request: SubmitRequest | None = None, requester: str = REQUESTER
    ) -> tuple[SyncGrain, SubmitResult]:
        grain = self.grain(uuid.uuid4())
        result = grain.execute(
            SubmitRun(
                tenant_id=grain.tenant_id,
                run_id=grain.run_id,
                principal=self.principal(requester),
                request=request or self.request(),
            )
        )
        if result.run_id != grain.run_id:
            grain = self.grain(result.run_id)
        return grain, result

    def start_run(self, *steps: StepSpec) -> tuple[SyncGrain, LeaseGrant]:
        """Publish ``steps``, submit a run and lease its first attempt to WORKER."""
        self.publish(*steps)
        grain, _ = self.submit()
        return grain, self.lease(grain)

    def lease(self, grain: SyncGrain, holder: str = WORKER) -> LeaseGrant:
        return acquire(grain, self.open_attempt(grain.run_id).attempt_id, holder)

    def succeed(self, grain: SyncGrain, grant: LeaseGrant, n: int = 1) -> Attempt:
        attempt: Attempt = report(
            grain, grant, AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash(n)
        )
        return attempt

    def wake(self, grain: SyncGrain) -> WakeResult:
        """The reminder, as the scheduler sends it."""
        return grain.execute(WakeRun(tenant_id=grain.tenant_id, run_id=grain.run_id))

    # ------------------------------------------------------------------ reads

    def load(self, run_id: UUID) -> RunAggregate:
        agg, _ = drive(self.env.store.load(self.tenant, run_id, self.clock.now()))
        return agg

    def open_attempts(self, run_id: UUID) -> list[Attempt]:
        return self.load(run_id).open_attempts()

    def open_attempt(self, run_id: UUID) -> Attempt:
        (attempt,) = self.open_attempts(run_id)
        return attempt

    def rows(self, table: Any, run_id: UUID, order: Any = None) -> list[Any]:
        return run_rows(self.db, self.tenant, table, run_id, order)

    def outbox(self, run_id: UUID) -> list[Any]:
        return self.rows(outbox, run_id, outbox.c.seq)

    def event_types(self, run_id: UUID) -> list[str]:
        return [r.event_type for r in self.outbox(run_id)]

    def journal(self, run_id: UUID) -> list[Any]:
        return self.rows(recovery_journal, run_id, recovery_journal.c.sequence)

    def audits(self, run_id: UUID, kind: str | None = None) -> list[Any]:
        found = self.rows(audit_log, run_id, audit_log.c.id)
        return [a for a in found if kind is None or a.kind == kind]


SHARED = SideEffectClass.SHARED_WRITE
OPERATOR = "olga"


def operator(h: Harness) -> Principal:
    return Principal(OPERATOR, h.tenant, "ops-project", frozenset({Role.OPERATOR}))


def control(h: Harness, grain: SyncGrain, kind: type[Any], reason: str = "checking", **kw: Any):
    """An operator control (``kind``: SuspendRun, RetryStep, ...) with a reason."""
    return grain.execute(
        kind(
            tenant_id=grain.tenant_id,
            run_id=grain.run_id,
            principal=operator(h),
            reason=reason,
            **kw,
        )
    )


# ---------------------------------------------------------------------- shard databases


def placed(shards: Shards, vshard: int) -> Harness:
    """A harness serving every database of ``shards`` (issue 41), for a fresh tenant placed
    on virtual shard ``vshard``."""
    tenant = f"t-{uuid.uuid4().hex[:10]}"
    shards.directory.place(tenant, vshard)
    clock = ManualClock()
    return Harness(build(Settings(), db=shards.db, clock=clock, migrate=False), tenant, clock)


def submit_placed(h: Harness, *steps: StepSpec) -> SyncGrain:
    """Publish ``steps`` and submit a run whose id is minted as the edge mints it: in the
    tenant's placement."""
    h.publish(*steps)
    grain = h.grain(new_run_id(h.tenant, h.db.vshard_for))
    grain.execute(
        SubmitRun(
            tenant_id=h.tenant, run_id=grain.run_id, principal=h.principal(), request=h.request()
        )
    )
    return grain


def edge_submission(h: Harness, db: Database) -> SubmitRun:
    """``POST /factory/runs``' command for ``h``'s tenant, built as the edge builds it (both
    doors, a schedule's fire too) on ``db``."""
    principal = h.principal()
    return commands.submit_run(
        commands.Outside(Caller(principal, scopes_of(principal.roles)), db, "http"),
        "k",
        correlation_id=None,
        limits=Limits(),
        workflow_id="wf",
        model_profile_id="m",
        input={},
    )


def tenant_rows(db: Database, table: str, tenant: str) -> int:
    """How many rows of ``tenant`` ``table`` holds in ``db`` (read as the system)."""
    with db.system_tx() as conn:
        found = conn.execute(
            text(f"SELECT count(*) FROM {table} WHERE tenant_id = :t"), {"t": tenant}
        )
        return int(found.scalar_one())
