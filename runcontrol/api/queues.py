"""Flow control, seen (issue 21, docs/flow-control.md): ``GET /factory/queues`` lists the
tenant's concurrency keys (and its cap on open attempts) that have holders or waiters, each
with its limit, holders, waiting runs and the oldest waiter's age. Each held step says why
on ``GET /factory/runs/{runId}`` (``held``, ``heldReason``)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from schemas.api import QueuesView

from ..store import queries as q
from . import routes
from .auth import RunsReader
from .context import Svc
from .problems import responses

router = routes.router("/factory/queues", "flow control")


@router.get("", response_model=QueuesView, responses=responses(503))
async def list_queues(caller: RunsReader, svc: Svc) -> dict[str, Any]:
    """The tenant's concurrency keys with holders or waiters, busiest first.

    Scope `factory.runs.read`. A key spans the tenant's projects: every caller who reads runs sees
    the tenant's queues (counts and ages, no run of another project).
    """
    now = datetime.now(UTC)
    items = await svc.read_in_tenant(caller, lambda conn: q.flow_queues(conn, now))
    return {"items": items, "asOf": now}
