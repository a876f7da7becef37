"""The demo of ``runcontrol up``: tenant ``demo``'s workflow, the echo workers that take its
attempts in the service's process, and a hint for the work no worker takes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from ..config import Settings
from ..domain import WorkerIdentity
from ..store import queries as q
from .output import say

if TYPE_CHECKING:
    from ..sdk import Worker
    from ..workers.protocol import SessionTransport

log = logging.getLogger(__name__)

DEMO_TENANT = "demo"
DEMO_PROJECT = "demo"

DEMO_WORKFLOW: dict[str, Any] = {
    "workflowId": "demo-review",
    "steps": [
        {"name": "plan", "agentId": "planner", "sideEffectClass": "read"},
        {"name": "apply", "agentId": "applier", "sideEffectClass": "shared-write"},
        {"name": "report", "agentId": "reporter", "sideEffectClass": "read"},
    ],
    # Exposed as an A2A agent (docs/a2a.md): /a2a/demo-review/.well-known/agent-card.json
    "agent": {
        "name": "Demo review",
        "description": "Plans, applies (after a reviewer approves) and reports on a change to "
        "a repository.",
        "skills": [
            {
                "id": "review-change",
                "name": "Review a change",
                "description": "Plan, apply with a reviewer's approval, and report.",
                "tags": ["review", "demo"],
                "examples": ['{"repository": "example/repo", "revision": "a1b2c3d"}'],
            }
        ],
        "input": {"text": "request", "data": "merge", "required": []},
        "modelProfileId": "code-agent",
    },
}


# A demo worker: an app of the SDK, the transport it runs over and its identity.
DemoWorker = tuple["Worker", "SessionTransport", WorkerIdentity]


def demo_workers(
    transport: SessionTransport, holders: list[WorkerIdentity], settings: Settings
) -> list[DemoWorker]:
    """The demo workers of ``runcontrol up``: the SDK's echo app (``runcontrol.sdk.echo``,
    what ``runcontrol worker`` runs without ``--app``), one per holder, in this process."""
    from ..sdk.echo import echo_worker

    agents = [s["agentId"] for s in DEMO_WORKFLOW["steps"]]
    renew = max(settings.leases.duration_seconds / 3, 0.5)
    grace = settings.leases.renewal_grace_seconds + 5.0
    return [
        (
            echo_worker(agents, 0.5, renew_every_s=renew, lease_grace_s=grace),
            transport,
            who,
        )
        for who in holders
    ]


def start_workers(workers: list[DemoWorker]) -> list[asyncio.Task[None]]:
    """Each worker's supervised loop as a task of this event loop."""
    return [
        asyncio.create_task(app.run_supervised(transport, who), name=f"worker {who.holder}")
        for app, transport, who in workers
    ]


async def stop_workers(
    workers: list[DemoWorker], tasks: list[asyncio.Task[None]], grace_s: float
) -> None:
    """Stop offering slots; wait up to ``grace_s`` for the attempts in hand to finish and
    report (a stopping SDK worker withdraws its credits at once: no long poll to sit out)."""
    for app, _, _ in workers:
        app.stop()
    if not tasks:
        return
    done, pending = await asyncio.wait(tasks, timeout=grace_s)
    for task in pending:
        log.warning("%s did not drain within %.0f s; cancelling it", task.get_name(), grace_s)
        task.cancel()
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s ended with an error", task.get_name(), exc_info=task.exception())


def stall_hint(tenant: str, agent: str, n: int, stall_s: float) -> str:
    """How to serve work nobody takes: the user's own app (``--app``: the echo agents
    ``--agents`` starts would take it and do nothing of the user's)."""
    return (
        f"tenant {tenant!r}: {n} attempt(s) of agent {agent!r} waiting over {stall_s:g} s "
        f"with no worker; serve it with your app: runcontrol worker --tenant {tenant} --sub "
        f"worker --app PACKAGE.MODULE:WORKER (a runcontrol.sdk.Worker with an agent {agent!r}: "
        f"docs/workers.md; or over gRPC: --transport grpc --token <a Worker token of tenant "
        f"{tenant}>)"
    )


async def hint_workers(db: Any, stall_s: float | None, stop: asyncio.Event) -> None:
    """Say once per (tenant, agent) how to start a worker for work nobody takes (a tenant
    that published a workflow but runs no worker: the demo workers take tenant demo's only)."""
    if stall_s is None:
        return
    said: set[tuple[str, str]] = set()

    def stalled() -> list[tuple[str, str, int, datetime]]:
        found: list[tuple[str, str, int, datetime]] = []
        for each in db.databases():  # every shard's
            with each.system_tx() as conn:
                found += q.stalled_attempts(conn, datetime.now(UTC), stall_s)
        return found

    while not stop.is_set():
        try:
            found = await asyncio.to_thread(stalled)
        except Exception as exc:  # noqa: BLE001 - a hint; the next look may work
            log.warning("could not look for work nobody takes: %r", exc)
            found = []
        for tenant, agent, n, _ in found:
            if (tenant, agent) not in said:
                said.add((tenant, agent))
                say(stall_hint(tenant, agent, n, stall_s))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), min(stall_s, 30.0))
