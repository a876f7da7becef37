"""Flow control's reads (0017): the concurrency keys with holders or waiters, and the
scheduler's backlog gauges."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, text

from ...domain.flow import CAPACITY_NAME

_QUEUES = """
WITH k AS (SELECT tenant_id, name, key, kind FROM flow_slots
           UNION SELECT tenant_id, name, key, kind FROM flow_waiters)
SELECT k.tenant_id, k.name, k.key, k.kind,
       coalesce(s.holders, 0) AS holders,
       coalesce(s.max_holders, w.max_holders) AS max_holders,
       coalesce(w.waiting, 0) AS waiting,
       coalesce(w.promoted, 0) AS promoted,
       w.oldest
FROM k
LEFT JOIN LATERAL (SELECT count(*) AS holders, max(max_holders) AS max_holders FROM flow_slots
                   WHERE tenant_id = k.tenant_id AND name = k.name AND key = k.key) s ON true
LEFT JOIN LATERAL (SELECT count(*) FILTER (WHERE NOT promoted) AS waiting,
                          count(*) FILTER (WHERE promoted) AS promoted,
                          max(max_holders) AS max_holders,
                          min(enqueued_at) FILTER (WHERE NOT promoted) AS oldest
                   FROM flow_waiters
                   WHERE tenant_id = k.tenant_id AND name = k.name AND key = k.key) w ON true
ORDER BY waiting DESC, k.name, k.key
LIMIT :limit
"""


def flow_queues(conn: Connection, now: datetime, limit: int = 500) -> list[dict[str, Any]]:
    """Per concurrency key with holders or waiters (and the tenant's cap): its limit, holders,
    promoted and waiting runs, and the oldest waiter's age (s). Tenant-scoped by row-level
    security; the busiest keys first."""
    found = []
    for r in conn.execute(text(_QUEUES), {"limit": limit}).mappings():
        oldest = r["oldest"]
        found.append(
            {
                "tenantId": r["tenant_id"],
                "kind": r["kind"],
                "name": r["name"] if r["name"] != CAPACITY_NAME else None,
                "key": r["key"],
                "limit": int(r["max_holders"]),
                "holders": int(r["holders"]),
                "promoted": int(r["promoted"]),
                "waiting": int(r["waiting"]),
                "oldestWaitingSeconds": (
                    None if oldest is None else max(0.0, (now - oldest).total_seconds())
                ),
            }
        )
    return found


def flow_backlog(conn: Connection, now: datetime) -> dict[tuple[str, str, str], tuple[int, float]]:
    """The scheduler's gauges: per (tenant, kind, name) over all its keys, how many runs wait
    for a slot and the oldest one's age (s)."""
    rows = conn.execute(
        text(
            "SELECT tenant_id, kind, name, count(*), min(enqueued_at) FROM flow_waiters"
            " WHERE NOT promoted GROUP BY tenant_id, kind, name"
        )
    )
    return {(r[0], r[1], r[2]): (int(r[3]), max(0.0, (now - r[4]).total_seconds())) for r in rows}
