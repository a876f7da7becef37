"""A run host's mailboxes under ``command_batch``'s group: taken at once, always handed back.

``RunHost`` is a plain class (Ray makes it an actor where it is deployed), so these tests build
one in the test's own event loop, on the Ray tests' real database, and call ``command_batch``
directly: a batch can then be held inside its group's statement and cancelled at a known point,
which a call through Ray cannot do deterministically.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from uuid import UUID

from actors.run_host import RunHost, host_config
from runcontrol.commands import (
    AcquireLease,
    OpenAttempts,
    ReportOutcome,
    SubmitRequest,
    SubmitRun,
)
from runcontrol.config import Settings
from runcontrol.domain import (
    AttemptOutcome,
    LeaseGrant,
    Principal,
    Role,
    WorkflowDefinition,
    canonical_hash,
)
from runcontrol.store import Database

PROJECT = "proj-1"


async def with_host(owner_url: str, test: Callable[[RunHost, str], Awaitable[None]]) -> None:
    tenant = f"mailbox-{uuid.uuid4().hex[:8]}"
    settings = Settings.model_validate({"grains": {"host_count": 1, "idle_seconds": 600}})
    host = RunHost(host_config(settings, owner_url))
    host._env.releases.publish(
        tenant,
        WorkflowDefinition.from_dict({"workflowId": "wf", "steps": [{"agentId": "a"}]}),
        "tester",
        host._env.clock.now(),
    )
    try:
        await test(host, tenant)
    finally:
        await host._shards.close()
        host._reaper.cancel()
        host._shards.dispose()


async def leased_run(host: RunHost, tenant: str) -> tuple[UUID, LeaseGrant]:
    """A submitted run, cached in ``host``, with its attempt leased to ``w``."""
    run_id = uuid.uuid4()
    principal = Principal("alice", tenant, PROJECT, frozenset({Role.REQUESTER}))
    request = SubmitRequest(PROJECT, f"k-{run_id}", "wf", "m", {})
    await host.command(
        SubmitRun(tenant_id=tenant, run_id=run_id, principal=principal, request=request)
    )
    (attempt_id,) = await host.command(OpenAttempts(tenant_id=tenant, run_id=run_id))
    grant = await host.command(
        AcquireLease(tenant_id=tenant, run_id=run_id, attempt_id=attempt_id, holder="w")
    )
    return run_id, grant


def outcome(tenant: str, run_id: UUID, grant: LeaseGrant) -> ReportOutcome:
    return ReportOutcome(
        tenant_id=tenant,
        run_id=run_id,
        attempt_id=grant.attempt_id,
        holder="w",
        fencing_token=grant.fencing_token,
        outcome=AttemptOutcome.SUCCEEDED,
        outcome_hash=canonical_hash({"n": 1}),
    )


def test_a_batch_cancelled_inside_its_group_hands_every_mailbox_back(
    ray_db: Database,
) -> None:
    """The batch is cancelled while its group's statement is in flight (held by the test):
    every run's mailbox is free again, and the runs take commands as before."""

    async def test(host: RunHost, tenant: str) -> None:
        runs = [await leased_run(host, tenant) for _ in range(3)]
        sending, release = asyncio.Event(), asyncio.Event()
        # the one database's group (a group per shard database: store/group.GroupCommits)
        (commits,) = host._env.commits._groups.values()
        real_send = commits._send

        async def held_send(docs: list[str]) -> Any:
            sending.set()
            await release.wait()
            return await real_send(docs)

        commits._send = held_send
        batch = asyncio.ensure_future(
            host.command_batch([outcome(tenant, run_id, grant) for run_id, grant in runs])
        )
        await asyncio.wait_for(sending.wait(), 30)
        for run_id, _ in runs:
            assert not host._activations[run_id].idle  # the group holds them
        batch.cancel()
        await asyncio.gather(batch, return_exceptions=True)
        commits._send = real_send

        for run_id, grant in runs:
            act = host._activations.get(run_id)
            assert act is None or act.idle, "a mailbox stayed taken"
            # The same outcome, sent again, goes through (nothing of it committed).
            ((ok, attempt),) = await asyncio.wait_for(
                host.command_batch([outcome(tenant, run_id, grant)]), 30
            )
            assert ok and str(attempt.state) == "Succeeded", attempt

    asyncio.run(with_host(ray_db.owner_url, test))
