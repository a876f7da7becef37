"""Liveness, readiness, and the workers' health of the caller's tenant.

Ready means this replica can serve: the database answers, with a schema this release may run
on (its own, or a newer one that keeps it working: ``store/schema.py``; otherwise the check
names the refusal, and a rolling upgrade replaces the replica), and every run host answers a
ping, each within ``api.readiness_timeout_seconds``; a draining replica is not ready
(``checks.drain``). Nothing else: readiness takes a replica out of the load balancer for every
tenant, so it must not depend on what one tenant does. A tenant with a published workflow and no
worker made every replica unready for all tenants, and a restart never became ready (issue 23).

Work nobody takes is the tenant's to see: ``GET /health/workers`` (scope ``factory.runs.read``,
the caller's tenant only) lists its agents whose dispatched attempts have waited over
``api.dispatch_stall_seconds`` with none claimed; the scheduler exports the same per tenant and
agent as ``runcontrol_dispatch_stalled_attempts`` (``actors/metrics.py``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any

from fastapi.responses import JSONResponse

from schemas.api import Health, WorkersHealth

from ..store import queries as q
from ..store.schema import SchemaMismatch
from . import routes
from .auth import RunsReader
from .context import Svc
from .problems import problem, responses

log = logging.getLogger(__name__)

router = routes.router("/health", "health")

# Probes get their own threads: a database that hangs must not starve the threads reads use.
_probe_threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="readiness")


@router.get("/live", response_model=Health)
async def live() -> dict[str, Any]:
    """Process liveness."""
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


@router.get("/ready", response_model=Health, responses=responses(503))
async def ready(svc: Svc) -> Any:
    """Readiness: the database and every run host answer, and the replica is not draining."""

    def schema_refusal() -> str | None:
        try:
            svc.db.require_compatible_schema(svc.db.app)
        except SchemaMismatch as exc:
            return f"schema: {exc}"
        return None

    async def database() -> str | None:
        return await asyncio.get_running_loop().run_in_executor(_probe_threads, schema_refusal)

    async def draining() -> str:
        return "draining: this replica takes no new work"

    probes: dict[str, Probe] = {"database": database}
    if svc.drain.draining:  # a load balancer should send new work elsewhere
        probes["drain"] = draining
    if svc.host_probe is not None:
        probes["runHosts"] = svc.host_probe
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


@router.get("/workers", response_model=WorkersHealth)
async def workers_health(caller: RunsReader, svc: Svc) -> dict[str, Any]:
    """The caller's tenant: agents whose dispatched attempts no worker takes.

    Scope `factory.runs.read`; the caller's tenant (and project) only. 200 with `status` `stalled`
    and the agents, or `ok`; for alerting, not for load balancing.
    """
    stall = svc.settings.api.dispatch_stall_seconds
    if stall is None:
        return {"status": "ok", "stall_seconds": None, "stalled": []}
    now = datetime.now(UTC)
    found = await svc.read_in_scope(caller, lambda conn: q.stalled_attempts(conn, now, stall))
    stalled = [
        {"agent_id": agent, "waiting": n, "oldest_dispatched_at": oldest}
        for tenant, agent, n, oldest in found
        if tenant == caller.tenant_id  # row-level security already; never another's anyway
    ]
    return {"status": "stalled" if stalled else "ok", "stall_seconds": stall, "stalled": stalled}
