"""Liveness and readiness.

Ready means this replica can serve: the database answers ``SELECT 1`` and every run host
answers a ping, each within ``api.readiness_timeout_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text

from schemas.api import Health

from .context import Svc
from .problems import problem, responses

log = logging.getLogger(__name__)

router = APIRouter(prefix="/health", tags=["health"])

# Probes get their own threads: a database that hangs must not starve the threads reads use.
_probe_threads = ThreadPoolExecutor(max_workers=2, thread_name_prefix="readiness")


@router.get("/live", operation_id="Live", response_model=Health, summary="Process liveness.")
async def live() -> dict[str, Any]:
    return {"status": "live"}


async def _check(name: str, probe: Any, timeout: float) -> str:
    try:
        await asyncio.wait_for(probe(), timeout)
    except TimeoutError:
        return f"no answer within {timeout:g}s"
    except Exception as exc:  # any failure means not ready; say which
        log.warning("readiness check %s failed: %s", name, exc)
        return f"failed: {type(exc).__name__}"
    return "ok"


@router.get(
    "/ready",
    operation_id="Ready",
    response_model=Health,
    responses=responses(503),
    summary="Readiness: the database and every run host answer.",
)
async def ready(svc: Svc) -> Any:
    def select_one() -> None:
        with svc.db.app.connect() as conn:
            conn.scalar(text("SELECT 1"))

    async def database() -> None:
        await asyncio.get_running_loop().run_in_executor(_probe_threads, select_one)

    probes: dict[str, Any] = {"database": database}
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
