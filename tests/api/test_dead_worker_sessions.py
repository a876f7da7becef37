"""A killed worker stops receiving work within seconds (issue 34), over both transports.

A worker with 4 free slots dies (its task is cancelled mid long poll: no more exchanges, no
close, its in-flight call dropped, as a SIGKILL leaves it); runs are then submitted while a
live worker serves too. Before, the dead slots kept their credits for ``SESSION_TTL_S`` (50 s):
every attempt granted to them waited out its lease and its step ran out of attempts. Now the
host ends a session whose exchange deadline passes (``EXCHANGE_DEADLINE_S``): nothing is
granted to the dead slots after that, the grants they never acknowledged are handed back at
once, and every run completes."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from api_harness import TenantView
from grpc_harness import GrpcTenant
from sqlalchemy import func, select

from runcontrol.domain import StepSpec, WorkflowDefinition
from runcontrol.rpc.exchange import GrpcSessionTransport
from runcontrol.sdk import Backoff, Step, Worker, token_identity
from runcontrol.store.tables import leases
from runcontrol.workers.sessions import EXCHANGE_DEADLINE_S

RUNS = 4


def last_grant_to(t: TenantView, holder_prefix: str) -> datetime | None:
    with t.runtime.container.db.tenant(t.tenant) as conn:
        return conn.execute(
            select(func.max(leases.c.granted_at)).where(leases.c.holder.like(f"{holder_prefix}%"))
        ).scalar()


@pytest.mark.parametrize("transport", ["ray", "grpc"])
def test_a_killed_worker_is_granted_nothing_seconds_after_its_death(
    g: GrpcTenant, grpc_port: int, transport: str
) -> None:
    t = g.view
    definition = WorkflowDefinition(t.workflow, (StepSpec("only", t.agent, max_attempts=5),))
    t.runtime.container.releases.publish(
        t.tenant, definition, "publisher", datetime.now(UTC), ("latest",)
    )

    def worker(name: str) -> Worker:
        w = Worker(name, concurrency=4, wait_s=15.0, backoff=Backoff(0.05, 0.5))

        @w.agent(t.agent)
        async def only(step: Step) -> Any:
            return {"by": name}

        return w

    def session(name: str) -> tuple[Any, Any]:
        if transport == "ray":
            return t.runtime.client, f"{name}-holder"
        token = g.worker_token(subject=name)
        return GrpcSessionTransport(f"127.0.0.1:{grpc_port}", token), token_identity(token, name)

    async def scenario() -> tuple[datetime, list[str]]:
        doomed, doomed_who = session("doomed")
        dying = asyncio.create_task(worker("doomed").run(doomed, doomed_who))
        await asyncio.sleep(3)  # its credits wait on the hosts, in a long poll
        dying.cancel()  # killed: no close, no more exchanges
        died = datetime.now(UTC)
        alive, alive_who = session("alive")
        live = worker("alive")
        serving = asyncio.create_task(live.run(alive, alive_who))
        try:
            run_ids = [await asyncio.to_thread(t.submit) for _ in range(RUNS)]
            for run_id in run_ids:
                view = await asyncio.to_thread(
                    lambda r=run_id: t.wait_state(r, "Completed", "Failed", timeout=45)
                )
                assert view["state"] == "Completed", view
        finally:
            live.stop()
            await asyncio.wait_for(serving, 30)
            for closing in (doomed, alive):
                if closing is not t.runtime.client:
                    await closing.close()
        return died, run_ids

    started = time.monotonic()
    died, _ = asyncio.run(scenario())
    last = last_grant_to(t, "doomed")
    # The dead slots may take what came at once (their long poll still waited); nothing after
    # their session's deadline (plus the host's once-a-second look).
    bound = timedelta(seconds=EXCHANGE_DEADLINE_S + 3)
    assert last is None or last < died + bound, (last, died)
    assert time.monotonic() - started < 60
