"""RunControlClient: what drivers and workers inside the Ray cluster use.

It holds actor handles (through ``actors.placement.HostRouter``) and sends each command to the
host that owns the run. Results are the domain's dataclasses; failures are the domain's typed
errors (a stale fencing token arrives as ``StaleFencingToken``, not as a Ray error).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from .config import Settings
from .domain import (
    ApprovalRequest,
    Attempt,
    AttemptOutcome,
    Decision,
    FailureClass,
    LeaseGrant,
    Principal,
    SideEffectClass,
    errors,
)
from .grain import SubmitRequest, SubmitResult

TERMINAL_EVENTS = frozenset({"RunCompleted", "RunFailed", "RunCancelled"})


class Router(Protocol):
    async def command(
        self, tenant_id: str, run_id: UUID, name: str, *args: Any, **kwargs: Any
    ) -> Any: ...

    async def call(self, run_id: UUID, method: str, *args: Any, **kwargs: Any) -> Any: ...

    async def call_any(self, method: str, *args: Any, **kwargs: Any) -> Any: ...


@dataclass(frozen=True, slots=True)
class Claim:
    """A leased attempt handed to a worker: the lease, the run's tenant and its input."""

    grant: LeaseGrant
    tenant_id: str
    input: dict[str, Any] | None

    @property
    def run_id(self) -> UUID:
        return self.grant.run_id

    @property
    def attempt_id(self) -> UUID:
        return self.grant.attempt_id

    @property
    def fencing_token(self) -> int:
        return self.grant.fencing_token

    @property
    def holder(self) -> str:
        return self.grant.holder


class RunControlClient:
    def __init__(self, router: Router) -> None:
        self._router = router

    @classmethod
    def connect(cls, settings: Settings | None = None, owner_url: str = "") -> RunControlClient:
        """A client for a running cluster (``ray.init`` done; hosts deployed)."""
        from actors.run_host import host_config, make_router

        return cls(make_router(host_config(settings or Settings(), owner_url)))

    async def _run(self, tenant_id: str, run_id: UUID, command: str, *args: Any, **kw: Any) -> Any:
        return await self._router.command(tenant_id, run_id, command, *args, **kw)

    # ------------------------------------------------------------------ drivers

    async def submit(self, principal: Principal, request: SubmitRequest) -> SubmitResult:
        run_id = uuid.uuid4()
        result: SubmitResult = await self._run(
            principal.tenant_id, run_id, "submit", principal, request
        )
        return result

    async def get(self, tenant_id: str, run_id: UUID) -> dict[str, Any]:
        view = await self._router.call(run_id, "get_run", tenant_id, run_id)
        if view is None:
            raise errors.RunNotFound(f"run {run_id} not found", run_id=str(run_id))
        return dict(view)

    async def cancel(self, principal: Principal, run_id: UUID, reason: str) -> str:
        state: str = await self._run(
            principal.tenant_id, run_id, "cancel", principal.subject, reason
        )
        return state

    async def decide(
        self,
        principal: Principal,
        approval_id: UUID,
        decision: Decision,
        version: int,
        proposal_hash: str,
        reason: str | None = None,
    ) -> ApprovalRequest:
        run_id = await self._router.call_any("locate_approval", principal.tenant_id, approval_id)
        if run_id is None:
            raise errors.ApprovalNotFound(f"approval {approval_id} not found")
        result: ApprovalRequest = await self._run(
            principal.tenant_id,
            run_id,
            "decide",
            approval_id,
            principal,
            decision,
            version,
            proposal_hash,
            reason,
        )
        return result

    async def watch(
        self, tenant_id: str, run_id: UUID, after_seq: int = 0, *, wait_s: float = 20.0
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield the run's events in seq order from ``after_seq``; ends after a terminal event."""
        cursor = after_seq
        while True:
            batch = await self._router.call(run_id, "events", tenant_id, run_id, cursor, wait_s)
            for event in batch:
                cursor = event["seq"]
                yield event
                if event["type"] in TERMINAL_EVENTS:
                    return

    # ------------------------------------------------------------------ workers

    async def claim(
        self, agent_ids: list[str], holder: str, timeout_s: float = 30.0
    ) -> Claim | None:
        """Long-poll for the next dispatched attempt of these agents and lease it."""
        found = await self._router.call_any("claim", list(agent_ids), holder, timeout_s)
        if found is None:
            return None
        return Claim(found["grant"], found["tenant_id"], found["input"])

    async def renew(self, claim: Claim) -> LeaseGrant:
        grant: LeaseGrant = await self._run(
            claim.tenant_id,
            claim.run_id,
            "renew_lease",
            claim.attempt_id,
            claim.holder,
            claim.fencing_token,
        )
        return grant

    async def report_outcome(
        self,
        claim: Claim,
        outcome: AttemptOutcome,
        *,
        failure_class: FailureClass | None = None,
        outcome_hash: str | None = None,
    ) -> Attempt:
        attempt: Attempt = await self._run(
            claim.tenant_id,
            claim.run_id,
            "report_outcome",
            claim.attempt_id,
            claim.holder,
            claim.fencing_token,
            outcome,
            failure_class=failure_class,
            outcome_hash=outcome_hash,
        )
        return attempt

    async def request_approval(
        self,
        claim: Claim,
        proposal_hash: str,
        action_class: SideEffectClass | None = None,
    ) -> ApprovalRequest | None:
        result: ApprovalRequest | None = await self._run(
            claim.tenant_id,
            claim.run_id,
            "request_approval",
            claim.attempt_id,
            claim.holder,
            claim.fencing_token,
            proposal_hash,
            action_class=action_class,
        )
        return result
