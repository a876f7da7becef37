"""Worker sessions over gRPC: ``Exchange`` through Serve's gRPC ingress (``rpc.exchange``).

The same messages as in the cluster: credits whose tenant and holder come from the worker's
token, commands answered each as its own RPC would answer it (a refusal as its typed error),
grants with the run's input, cancels pushed down the holder's session."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from typing import Any
from uuid import UUID

from grpc_harness import WORKER_SUB, GrpcTenant

from actors.placement import host_index
from runcontrol.commands import CancelRun, ReportOutcome
from runcontrol.domain import AttemptOutcome, canonical_hash, errors
from runcontrol.rpc.exchange import GrpcSessionTransport
from runcontrol.workers.protocol import MAX_WAIT_S, Credit, Grant, SessionUp

HOLDER = f"{WORKER_SUB}/inst-s"


def report(grant: Grant, **overrides: Any) -> ReportOutcome:
    command = ReportOutcome(
        **grant.fenced(),
        outcome=AttemptOutcome.SUCCEEDED,
        outcome_hash=canonical_hash({"done": str(grant.lease.attempt_id)}),
    )
    return dataclasses.replace(command, **overrides)


def run(coro: Any, timeout: float = 60.0) -> Any:
    async def bounded() -> Any:
        async with asyncio.timeout(timeout):
            return await coro

    return asyncio.run(bounded())


def test_a_session_over_grpc_is_granted_reports_and_is_refused_typed(
    g: GrpcTenant, grpc_port: int
) -> None:
    g.view.publish()
    run_id = UUID(g.view.submit())
    k = host_index(run_id, 2)
    token = g.worker_token()

    async def main() -> None:
        t = GrpcSessionTransport(f"127.0.0.1:{grpc_port}", token)
        try:
            assert await t.hosts() == 2
            sid = f"s-{uuid.uuid4().hex[:8]}"
            # the holder's subject is the token's, whatever the credit names
            credit = Credit(str(uuid.uuid4()), "someone-else/inst-s", (g.view.agent,))
            down = await t.exchange(k, SessionUp(sid, credits=(credit,), wait_s=10))
            (grant,) = down.grants
            assert grant.claim_id == credit.claim_id and grant.tenant_id == g.tenant
            assert grant.lease.run_id == run_id and grant.lease.holder == HOLDER
            assert grant.input == g.view.body()["input"]
            assert grant.deadline_at is not None
            stale = report(grant, fencing_token=grant.lease.fencing_token + 5)
            good = report(grant)
            down = await t.exchange(
                k, SessionUp(sid, commands=(stale, good), acks=(credit.claim_id,))
            )
            answers = {a.command_id: a for a in down.answers}
            assert not answers[stale.command_id].ok
            assert isinstance(answers[stale.command_id].value, errors.StaleFencingToken)
            assert answers[good.command_id].ok
            assert answers[good.command_id].value.state.value == "Succeeded"
            assert not down.grants
        finally:
            await t.close()

    run(main())
    assert g.view.wait_state(str(run_id), "Completed")["state"] == "Completed"


def test_a_cancel_reaches_the_holders_grpc_session_within_a_bound(
    g: GrpcTenant, grpc_port: int
) -> None:
    g.view.publish()
    run_id = UUID(g.view.submit())
    k = host_index(run_id, 2)
    token = g.worker_token()
    bound_s = 2.0

    async def main() -> None:
        t = GrpcSessionTransport(f"127.0.0.1:{grpc_port}", token)
        try:
            sid = f"s-{uuid.uuid4().hex[:8]}"
            credit = Credit(str(uuid.uuid4()), HOLDER, (g.view.agent,))
            (grant,) = (await t.exchange(k, SessionUp(sid, credits=(credit,), wait_s=10))).grants
            waiting = asyncio.create_task(
                t.exchange(k, SessionUp(sid, acks=(credit.claim_id,), wait_s=MAX_WAIT_S))
            )
            await asyncio.sleep(0.3)
            assert not waiting.done()
            sent = time.monotonic()
            await g.view.runtime.client.send(
                CancelRun(tenant_id=g.tenant, run_id=run_id, requested_by="alice", reason="stop")
            )
            down = await asyncio.wait_for(waiting, bound_s)
            assert time.monotonic() - sent < bound_s
            assert list(down.cancels) == [grant.lease.attempt_id]
            stop = report(grant, outcome=AttemptOutcome.CANCELLED)
            done = await t.exchange(k, SessionUp(sid, commands=(stop,)))
            assert [a.ok for a in done.answers] == [True], done.answers
        finally:
            await t.close()

    run(main())
    assert g.view.wait_state(str(run_id), "Cancelled")["state"] == "Cancelled"
