"""RunControlClient: what drivers and workers use to send typed commands to runs.

It sends each command (``runcontrol.commands``) through a ``Router``, the port that reaches the
grain hosting the run: in the cluster that is ``actors.placement.HostRouter`` (actor handles,
built by ``actors.client.connect``). Results are the domain's dataclasses; failures are the
domain's typed errors (a stale fencing token arrives as ``StaleFencingToken``, not as a Ray
error). A command keeps its ``command_id`` across the router's resends, so a resend after a
lost answer gets the stored answer, never a second effect.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from uuid import UUID

from .commands import Command, new_command_id
from .domain import LeaseGrant, WorkerIdentity, errors
from .domain.events import TERMINAL_EVENTS as TERMINAL_EVENTS  # the streams end there
from .workers.protocol import SessionDown, SessionUp, fenced_fields

R = TypeVar("R")


class Router(Protocol):
    async def send(self, command: Command[R]) -> R: ...

    async def call(self, run_id: UUID, method: str, *args: Any, **kwargs: Any) -> Any: ...

    async def call_any(self, method: str, *args: Any, **kwargs: Any) -> Any: ...

    async def hosts(self) -> int: ...

    async def exchange(self, host: int, up: SessionUp) -> SessionDown: ...

    async def exchange_targets(self) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class Claim:
    """A leased attempt handed to a worker: the lease, the run's tenant, its input and the
    results of the steps it depends on (by step name; empty for a first step)."""

    grant: LeaseGrant
    tenant_id: str
    input: dict[str, Any] | None
    results: Mapping[str, Any] = field(default_factory=dict)

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

    def fenced(self) -> dict[str, Any]:
        """The fields a fenced command takes from this lease:
        ``ReportOutcome(**claim.fenced(), outcome=...)``."""
        return fenced_fields(self.tenant_id, self.grant)


class RunControlClient:
    def __init__(self, router: Router) -> None:
        self._router = router

    async def send(self, command: Command[R]) -> R:
        """Send one command to its run's grain and answer what the grain answered."""
        return await self._router.send(command)

    # ------------------------------------------------------------------ worker sessions

    async def hosts(self) -> int:
        """How many run hosts there are (a worker keeps one session with each)."""
        return await self._router.hosts()

    async def exchange(self, host: int, up: SessionUp) -> SessionDown:
        """One exchange of a worker session with run host ``host``
        (``runcontrol.workers.protocol``): the client is a ``SessionTransport``. A draining host
        answers ``draining=True``."""
        return await self._router.exchange(host, up)

    async def exchange_targets(self) -> list[str]:
        """Where each run host serves the gRPC ``Exchange`` itself (by index; "": it does not)."""
        return await self._router.exchange_targets()

    # ------------------------------------------------------------------ reads

    async def get(self, tenant_id: str, run_id: UUID) -> dict[str, Any]:
        view = await self._router.call(run_id, "get_run", tenant_id, run_id)
        if view is None:
            raise errors.RunNotFound(f"run {run_id} not found", run_id=str(run_id))
        return dict(view)

    async def watch(
        self, tenant_id: str, run_id: UUID, after_seq: int = 0, *, wait_s: float = 20.0
    ) -> AsyncIterator[dict[str, Any]]:
        """Yield the run's events in seq order from ``after_seq``; ends after a terminal event.

        For in-cluster workers and drivers: long-polls the run's host (which waits on its own
        LISTEN connection). The HTTP API's streams do not come here: each Serve replica feeds
        them from its one LISTEN connection (``runcontrol.api.events``)."""
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
        self,
        agent_ids: list[str],
        holder: str | WorkerIdentity,
        timeout_s: float = 30.0,
        *,
        claim_id: str | None = None,
    ) -> Claim | None:
        """Long-poll for the next dispatched attempt of these agents and lease it.

        A ``WorkerIdentity`` claims only its tenant's attempts and holds the lease as
        ``subject/instance`` (what the gRPC surface does for a worker's token); a plain
        ``holder`` string is the trusted in-cluster form, across tenants. ``claim_id``: the
        claim's request id; a claim resent with it after a lost answer gets the lease the
        first send was granted (made here when not given, so the router's resends are alike)."""
        claim_id = claim_id or new_command_id()
        if isinstance(holder, WorkerIdentity):
            found = await self._router.call_any(
                "claim",
                list(agent_ids),
                holder.holder,
                timeout_s,
                tenant_id=holder.tenant_id,
                claim_id=claim_id,
            )
        else:
            found = await self._router.call_any(
                "claim", list(agent_ids), holder, timeout_s, claim_id=claim_id
            )
        if found is None:
            return None
        return Claim(found["grant"], found["tenant_id"], found["input"], found.get("results", {}))
