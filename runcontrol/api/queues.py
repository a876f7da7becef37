"""Flow control, seen (issue 21, docs/flow-control.md): ``GET /factory/queues`` lists the
tenant's concurrency keys (and its cap on open attempts) that have holders or waiters, each
with its limit, holders, waiting runs and the oldest waiter's age. Each held step says why
on ``GET /factory/runs/{runId}`` (``held``, ``heldReason``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter

from schemas.api import QueuesView

from ..store import queries as q
from .auth import RunsReader
from .context import Svc
from .problems import responses

router = APIRouter(prefix="/factory/queues", tags=["flow control"])


@router.get(
    "",
    operation_id="ListQueues",
    response_model=QueuesView,
    responses=responses(401, 403, 503),
    summary="The tenant's concurrency keys with holders or waiters, busiest first.",
    description="Scope `factory.runs.read`. A key spans the tenant's projects: every caller "
    "who reads runs sees the tenant's queues (counts and ages, no run of another project).",
)
async def list_queues(caller: RunsReader, svc: Svc) -> dict[str, Any]:
    now = datetime.now(UTC)
    items = await svc.read_in_tenant(caller, lambda conn: q.flow_queues(conn, now))
    return {"items": items, "asOf": now}
