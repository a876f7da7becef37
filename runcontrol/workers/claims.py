"""The unary claim path: a worker without a session asks a run host for one attempt
(``RunHost.claim``, ``RunControlClient.claim``), while it lives beside the sessions.

A claim reads the dispatched attempts of its agents (``queries.claimable``), tries them in
turn, each by an ``AcquireLease`` sent through the router to the run's own host (its command
id the claim's id), and long-polls the dispatch channel while none is there. Its input is read
before the lease, its dependencies' results asked of the run's host after it
(``RunHost.grant_results``). A claim resent with the same id after a lost answer gets the lease
its first send was granted (``claimed``, also how a session finds a resent credit's grant).

No Ray: the host hands in its router, its database, its LISTEN connection and its way of
running a synchronous read off the loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from uuid import UUID

from ..client import Router
from ..commands import AcquireLease
from ..domain import LeaseGrant, errors
from ..drain import Drain
from ..store import answers
from ..store import queries as q
from ..store.commit import DISPATCH_CHANNEL
from ..store.database import Database
from ..store.notify import Listener
from .fair_shares import FairShare

T = TypeVar("T")


class Read(Protocol):
    """A synchronous read run off the loop (``RunHost._in_thread``)."""

    async def __call__(self, fn: Callable[..., T], *args: Any) -> T: ...


@dataclass
class Claims:
    """The unary claims a run host serves (``claim``), over its router, database and LISTEN
    connection, sharing the host's fair shares with its book."""

    db: Database
    router: Router
    watch: Listener
    fair: FairShare
    drain: Drain
    read: Read
    # attempt -> holder, while a claim on this host is leasing it
    acquiring: dict[UUID, str] = field(default_factory=dict)

    async def claim(
        self,
        agent_ids: list[str],
        holder: str,
        timeout_s: float,
        tenant_id: str | None,
        claim_id: str,
    ) -> dict[str, Any] | None:
        """The lease of the oldest dispatched attempt for these agents (long-poll), as
        ``RunHost.claim`` answers it; None once ``timeout_s`` ran out or the host drains.

        ``claim_id`` is the claim's request id, made once by the worker and resent until
        answered; it is the command id of the claim's ``AcquireLease``. A resend whose first
        send was granted a lease (its answer lost: its host died after the commit) gets that
        lease back, while it is current, instead of leaving it to expire unworked. The run's
        input is read before the grant, so no failing read can strand a granted lease."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        payloads = tuple(agent_ids)
        held = await self.read(claimed, self.db, claim_id, holder, tenant_id)
        if held is not None:
            held["results"] = await self._results(held["tenant_id"], held["grant"])
            return held
        while not self.drain.draining:
            since = self.watch.generation(DISPATCH_CHANNEL, payloads)
            candidates = await self.read(self._claimable, agent_ids, tenant_id)
            for run_tenant, run_id, attempt_id in candidates:
                if self.acquiring.get(attempt_id, holder) != holder:
                    # Another holder's claim on this host is leasing it (one NOTIFY wakes them
                    # all): it would only be refused, and each refusal reloads the run. The
                    # same holder's claim (a retry) goes on: it is answered the same lease.
                    continue
                self.acquiring[attempt_id] = holder
                try:
                    input = await self.read(self._run_input, run_tenant, run_id)
                    grant: LeaseGrant = await self.router.send(
                        AcquireLease(
                            tenant_id=run_tenant,
                            run_id=run_id,
                            attempt_id=attempt_id,
                            holder=holder,
                            command_id=claim_id,
                        )
                    )
                except (errors.LeaseHeld, errors.LeaseRejected, errors.IdempotencyConflict):
                    # Another worker won it, or the run moved on (nothing stored); or this
                    # claim was granted a lease of this run before, since gone: a claim with
                    # a new id takes the attempt.
                    continue
                finally:
                    if self.acquiring.get(attempt_id) == holder:
                        del self.acquiring[attempt_id]
                if tenant_id is None:
                    self.fair.charge(run_tenant)
                results = await self._results(run_tenant, grant)
                return {"grant": grant, "tenant_id": run_tenant, "input": input, "results": results}
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await self.watch.wait(DISPATCH_CHANNEL, payloads, since, min(remaining, 2.0))
        return None

    async def _results(self, tenant_id: str, grant: LeaseGrant) -> dict[str, Any]:
        """The claimed attempt's dependencies' results, from the run's host. Its failure fails
        the claim (a step never runs without its inputs); the lease stands, and the worker's
        resend of the claim (same claim id) is answered that lease and asks again."""
        found: dict[str, Any] = await self.router.call(
            grant.run_id, "grant_results", tenant_id, grant.run_id, grant.attempt_id
        )
        return found

    def _claimable(
        self, agent_ids: list[str], tenant_id: str | None
    ) -> list[tuple[str, UUID, UUID]]:
        """The attempts a claim tries, in turn: a tenant's claim its 8 oldest; an untenanted
        one each tenant's 8 oldest, the tenant whose fair-share turn it is first (ties by the
        oldest head), so a deep backlog of one tenant does not hide another's."""
        if tenant_id:
            with self.db.tenant(tenant_id) as conn:
                return q.claimable(conn, agent_ids, limit=8)
        found = []
        for each in self.db.databases():  # every shard's, merged (a shard's tenants are its own)
            with each.system_tx() as conn:
                found += q.claimable(conn, agent_ids, limit=32, per_tenant=8)
        heads: dict[str, int] = {}
        for position, (tenant, _, _) in enumerate(found):
            heads.setdefault(tenant, position)
        ranked = sorted(
            enumerate(found), key=lambda c: (self.fair.tag(c[1][0]), heads[c[1][0]], c[0])
        )
        return [candidate for _, candidate in ranked]

    def _run_input(self, tenant_id: str, run_id: UUID) -> dict[str, Any] | None:
        with self.db.tenant(tenant_id) as conn:
            return q.run_input(conn, run_id)


def claimed(
    db: Database, claim_id: str, holder: str, tenant_id: str | None
) -> dict[str, Any] | None:
    """The current lease claim ``claim_id`` was granted, as ``Claims.claim`` answers it
    (without its results): a synchronous read of the stored ``AcquireLease`` answer."""
    if tenant_id:
        with db.tenant(tenant_id) as conn:
            found = q.claimed(conn, claim_id)
    else:
        found = None
        for each in db.databases():  # the claim's run is in one of them
            with each.system_tx() as conn:
                found = q.claimed(conn, claim_id)
            if found is not None:
                break
    if found is None:
        return None
    run_tenant, _, stored, input = found
    grant = answers.decode(stored)
    if not isinstance(grant, LeaseGrant) or grant.holder != holder:
        # Another holder's claim id: its lease is not this caller's to take.
        raise errors.IdempotencyConflict("this claim id was already used by another holder")
    return {"grant": grant, "tenant_id": run_tenant, "input": input}
