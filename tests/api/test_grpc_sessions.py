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

import grpc
import pytest
import ray
from api_harness import free_port
from grpc_harness import WORKER_SUB, GrpcTenant, GrpcWorker, auth

from actors.placement import host_index
from runcontrol.api.auth import RUNTIME
from runcontrol.commands import CancelRun, ReportOutcome
from runcontrol.domain import AttemptOutcome, Role, canonical_hash, errors
from runcontrol.rpc.exchange import GrpcSessionTransport
from runcontrol.workers.protocol import MAX_WAIT_S, Credit, Grant, SessionUp
from schemas import runcontrol_pb2 as pb
from schemas import runcontrol_pb2_grpc as pb_grpc

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


# ---------------------------------------------------------------------- a host's own Exchange


def host_targets(g: GrpcTenant) -> list[str]:
    """Where each host serves Exchange itself, as the ingress's reply names it."""
    reply = g.stub.Exchange(pb.ExchangeRequest(), metadata=auth(g.worker_token()))
    assert reply.hosts == 2 and len(reply.host_targets) == 2 and all(reply.host_targets)
    return list(reply.host_targets)


def submitted(g: GrpcTenant) -> tuple[UUID, int]:
    """A run of the tenant's workflow, and the index of its host."""
    g.view.publish()
    run_id = UUID(g.view.submit())
    return run_id, host_index(run_id, 2)


def host_counts(g: GrpcTenant, k: int) -> tuple[int, int]:
    """Host ``k``'s exchanges and actor calls served so far."""
    stats = ray.get(g.view.runtime.hosts[k].stats.remote())
    return stats["exchanges"], stats["calls"]


def test_a_session_exchanges_with_each_hosts_own_server_not_through_the_replica(
    g: GrpcTenant, grpc_port: int
) -> None:
    """Issue 42 point 5: once the ingress named the hosts' targets, a session's exchanges go
    to the host itself (no actor call: the replica relays none), with the same answers: the
    token's holder, the run's input, a stale fencing token refused typed."""
    run_id, k = submitted(g)

    async def main() -> None:
        t = GrpcSessionTransport(f"127.0.0.1:{grpc_port}", g.worker_token())
        try:
            assert await t.hosts() == 2  # through the ingress: the targets come with it
            exchanges, calls = host_counts(g, k)
            sid = f"s-{uuid.uuid4().hex[:8]}"
            credit = Credit(str(uuid.uuid4()), HOLDER, (g.view.agent,))
            (grant,) = (await t.exchange(k, SessionUp(sid, credits=(credit,), wait_s=10))).grants
            assert grant.lease.holder == HOLDER and grant.tenant_id == g.tenant
            assert grant.input == g.view.body()["input"]
            stale = report(grant, fencing_token=grant.lease.fencing_token + 5)
            down = await t.exchange(
                k, SessionUp(sid, commands=(stale, report(grant)), acks=(credit.claim_id,))
            )
            assert [a.ok for a in down.answers] == [False, True]
            assert isinstance(down.answers[0].value, errors.StaleFencingToken)
            assert t.direct_exchanges == 2
            after = host_counts(g, k)
            assert after[0] - exchanges >= 2 and after[1] == calls  # served, never relayed
        finally:
            await t.close()

    run(main())
    assert g.view.wait_state(str(run_id), "Completed")["state"] == "Completed"


def test_a_hosts_own_exchange_checks_the_token_the_tenant_and_the_host(g: GrpcTenant) -> None:
    run_id, k = submitted(g)
    target = host_targets(g)[k]
    agent = g.view.agent
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.RunControlStub(channel)  # type: ignore[no-untyped-call]

        def exchange(token: str | None, **fields: Any) -> Any:
            fields.setdefault("host", k)
            request = pb.ExchangeRequest(session_id=f"s-{uuid.uuid4().hex[:8]}", **fields)
            return stub.Exchange(request, metadata=auth(token) if token else (), timeout=20)

        def refused(token: str | None, code: grpc.StatusCode, **fields: Any) -> None:
            try:
                exchange(token, **fields)
            except grpc.RpcError as exc:
                assert exc.code() is code, exc.details()
            else:
                raise AssertionError(f"not refused: expected {code}")

        def credit() -> pb.SessionCredit:
            return pb.SessionCredit(
                claim_id=str(uuid.uuid4()), worker_instance_id="inst-h", agent_ids=[agent]
            )

        refused(None, grpc.StatusCode.UNAUTHENTICATED)
        refused("not-a-token", grpc.StatusCode.UNAUTHENTICATED)
        refused(g.view.token(), grpc.StatusCode.PERMISSION_DENIED)  # no Worker role
        refused(g.worker_token(), grpc.StatusCode.INVALID_ARGUMENT, host=1 - k)  # not this host
        # another tenant's worker is granted nothing of this tenant's runs
        other = g.api.token(f"other-{g.tenant}", WORKER_SUB, (Role.WORKER,), [RUNTIME])
        assert not exchange(other, credits=[credit()], wait_seconds=1).grants
        # this tenant's worker is, as the token's holder
        (grant,) = exchange(g.worker_token(), credits=[credit()], wait_seconds=10).grants
        assert grant.lease.holder == f"{WORKER_SUB}/inst-h"
        # the other tenant's report of it is refused: the run is not found in its tenant
        stolen = GrpcWorker(stub, other, "inst-h").report_request(grant.lease)
        command = pb.SessionCommand(report_attempt_outcome=stolen)
        (answer,) = exchange(other, commands=[command]).answers
        assert answer.WhichOneof("answer") == "error"
        assert answer.error.code == grpc.StatusCode.NOT_FOUND.value[0]


def test_a_draining_host_answers_its_own_exchanges_draining(g: GrpcTenant) -> None:
    """A draining host takes no credit and refuses the commands (the worker sends them to the
    next host), through its own server as through the ingress."""
    g.view.publish()
    k = 0
    target = host_targets(g)[k]
    host = g.view.runtime.hosts[k]
    ray.get(host.drain.remote(0.5))
    try:
        with grpc.insecure_channel(target) as channel:
            stub = pb_grpc.RunControlStub(channel)  # type: ignore[no-untyped-call]
            credit = pb.SessionCredit(
                claim_id=str(uuid.uuid4()), worker_instance_id="inst-d", agent_ids=[g.view.agent]
            )
            request = pb.ExchangeRequest(
                host=k, session_id="s-drain", credits=[credit], wait_seconds=5
            )
            reply = stub.Exchange(request, metadata=auth(g.worker_token()), timeout=20)
            assert reply.draining and not reply.grants
    finally:
        ray.get(host.resume.remote())


def test_a_host_whose_own_exchange_does_not_answer_is_reached_through_the_ingress(
    g: GrpcTenant, grpc_port: int
) -> None:
    """The exchange sent to a host's own target that does not answer is unknown (resent as
    any failed one: the credits ``resent``); the next goes through the ingress, whose reply
    names the host's target again."""
    run_id, k = submitted(g)

    async def main() -> None:
        t = GrpcSessionTransport(f"127.0.0.1:{grpc_port}", g.worker_token())
        try:
            await t.hosts()
            named = t._targets[k]
            t._targets[k] = f"127.0.0.1:{free_port()}"  # nothing serves there: a host gone
            sid = f"s-{uuid.uuid4().hex[:8]}"
            credit = Credit(str(uuid.uuid4()), HOLDER, (g.view.agent,))
            with pytest.raises(errors.Unavailable):
                await t.exchange(k, SessionUp(sid, credits=(credit,), wait_s=1, seq=1))
            again = SessionUp(sid, credits=(dataclasses.replace(credit, resent=True),), seq=2)
            (grant,) = (await t.exchange(k, dataclasses.replace(again, wait_s=10))).grants
            assert grant.lease.run_id == run_id and t.direct_exchanges == 0
            assert t._targets[k] == named
        finally:
            await t.close()

    run(main())


def test_a_worker_may_keep_every_exchange_on_the_ingress(g: GrpcTenant, grpc_port: int) -> None:
    """``direct=False`` (``runcontrol worker --via-ingress``): the replica relays each exchange
    as an actor call to the host, as before the hosts served their own."""
    run_id, k = submitted(g)

    async def main() -> None:
        t = GrpcSessionTransport(f"127.0.0.1:{grpc_port}", g.worker_token(), direct=False)
        try:
            await t.hosts()
            _, calls = host_counts(g, k)
            sid = f"s-{uuid.uuid4().hex[:8]}"
            credit = Credit(str(uuid.uuid4()), HOLDER, (g.view.agent,))
            (grant,) = (await t.exchange(k, SessionUp(sid, credits=(credit,), wait_s=10))).grants
            down = await t.exchange(
                k, SessionUp(sid, commands=(report(grant),), acks=(credit.claim_id,))
            )
            assert [a.ok for a in down.answers] == [True] and t.direct_exchanges == 0
            assert host_counts(g, k)[1] - calls >= 2  # each one an actor call
        finally:
            await t.close()

    run(main())
