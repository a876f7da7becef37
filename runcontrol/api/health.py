"""Liveness and readiness.

Ready means this replica can serve: the database answers ``SELECT 1`` and every run host
answers a ping, each within ``api.readiness_timeout_seconds``; and work is being taken: no
agent's dispatched attempts have waited over ``api.dispatch_stall_seconds`` while none of that
agent's attempts was claimed (after a database restart that dropped every worker, this is what
says so; the process itself looks healthy). A draining replica is not ready (``checks.drain``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from schemas.api import Health

from ..store import queries as q
from .context import Services, Svc
from .problems import problem, responses

log = logging.getLogger(__name__)

router = APIRouter(prefix="/health", tags=["health"])

# Probes get their own threads: a database that hangs must not starve the threads reads use.
_probe_threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="readiness")


@router.get("/live", operation_id="Live", response_model=Health, summary="Process liveness.")
async def live() -> dict[str, Any]:
    return {"status": "live"}


Probe = Callable[[], Awaitable[Any]]


async def _check(name: str, probe: Probe, timeout: float) -> str:
    """ "ok", or why not: a probe fails by raising, or by answering a reason (a string)."""
    try:
        found = await asyncio.wait_for(probe(), timeout)
    except TimeoutError:
        return f"no answer within {timeout:g}s"
    except Exception as exc:  # any failure means not ready; say which
        log.warning("readiness check %s failed: %s", name, exc)
        return f"failed: {type(exc).__name__}"
    if isinstance(found, str):
        log.warning("readiness check %s: %s", name, found)
        return found
    return "ok"


def _stalled(svc: Services, wait_seconds: float) -> str | None:
    with svc.db.system_tx() as conn:
        stalled = q.stalled_agents(conn, datetime.now(UTC), wait_seconds)
    if not stalled:
        return None
    agents = "; ".join(
        f"{agent}: {n} waiting since {oldest.isoformat(timespec='seconds')}"
        for agent, n, oldest in stalled
    )
    return f"stalled: dispatched attempts unclaimed for over {wait_seconds:g}s ({agents})"


@router.get(
    "/ready",
    operation_id="Ready",
    response_model=Health,
    responses=responses(503),
    summary="Readiness: the database and every run host answer, and workers take the work.",
)
async def ready(svc: Svc) -> Any:
    def select_one() -> None:
        with svc.db.app.connect() as conn:
            conn.scalar(text("SELECT 1"))

    async def database() -> None:
        await asyncio.get_running_loop().run_in_executor(_probe_threads, select_one)

    async def draining() -> str:
        return "draining: this replica takes no new work"

    probes: dict[str, Probe] = {"database": database}
    if svc.drain.draining:  # a load balancer should send new work elsewhere
        probes["drain"] = draining
    if svc.host_probe is not None:
        probes["runHosts"] = svc.host_probe
    stall = svc.settings.api.dispatch_stall_seconds
    if stall is not None:

        async def workers() -> str | None:
            return await asyncio.get_running_loop().run_in_executor(
                _probe_threads, _stalled, svc, stall
            )

        probes["workers"] = workers
    timeout = svc.settings.api.readiness_timeout_seconds
    results = await asyncio.gather(*(_check(n, p, timeout) for n, p in probes.items()))
    checks = dict(zip(probes, results, strict=True))
    if all(r == "ok" for r in checks.values()):
        return {"status": "ready", "checks": checks}
    failing = ", ".join(n for n, r in checks.items() if r != "ok")
    response: JSONResponse = problem(
        503, "not-ready", f"not ready: {failing}", title="Not ready", extensions={"checks": checks}
    )
    return response
