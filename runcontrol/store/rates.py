"""Rate-limit buckets (migration 0018): reserve a dispatch's units, consume units a worker
reports, and read the buckets' state. The bucket arithmetic (GCRA) is the SQL functions'; this
module only calls them, and reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from sqlalchemy import Connection, select

from ..domain.rates import Admission, Draw
from .commit import Store
from .tables import rate_buckets

_RESERVE = "SELECT admitted_at, decided_by FROM runcontrol_rate_reserve(%s, %s::jsonb, %s)"
_CONSUME = "SELECT runcontrol_rate_consume(%s, %s::jsonb, %s) AS tat"


async def reserve(store: Store, tenant_id: str, draws: Sequence[Draw], now: datetime) -> Admission:
    """Reserve one dispatch's draws, in one short transaction holding the buckets' row locks:
    when it is admitted (``now`` or later) and the bucket that decided a later instant."""
    doc = orjson.dumps([d.to_dict() for d in draws]).decode()
    (row,) = await store.for_tenant(tenant_id).call(_RESERVE, (tenant_id, doc, now))
    return Admission(row["admitted_at"], row["decided_by"])


async def consume(store: Store, tenant_id: str, draw: Draw, now: datetime) -> datetime:
    """Take ``draw.units`` from a bucket after the fact (a worker's report): never refused;
    answers the bucket's new theoretical arrival time (dispatches wait until it, less the
    burst)."""
    doc = orjson.dumps(draw.to_dict()).decode()
    (row,) = await store.for_tenant(tenant_id).call(_CONSUME, (tenant_id, doc, now))
    tat: datetime = row["tat"]
    return tat


@dataclass(frozen=True, slots=True)
class BucketState:
    """One bucket as the queues' view shows it."""

    tenant_id: str
    bucket: str
    per_second: float
    burst: float
    tokens: float  # units a dispatch could take now without waiting
    next_admission: datetime  # when a one-unit dispatch asked now would be admitted

    def to_dict(self) -> dict[str, Any]:
        return {
            "bucket": self.bucket,
            "perSecond": self.per_second,
            "burst": self.burst,
            "tokensAvailable": self.tokens,
            "nextAdmissionAt": self.next_admission.isoformat(),
        }


def bucket_states(conn: Connection, now: datetime | None = None) -> list[BucketState]:
    """Every bucket of the tenant ``conn`` is scoped to (row-level security), by name, as of
    ``now`` (default: this process's clock): what ``GET /factory/queues`` shows for rate
    limits (``svc.read(tenant, bucket_states)``). On the system path (the scheduler's gauge
    sample): every tenant's."""
    now = now or datetime.now(UTC)
    rows = conn.execute(
        select(rate_buckets).order_by(rate_buckets.c.tenant_id, rate_buckets.c.bucket)
    ).mappings()
    out = []
    for r in rows:
        rate, burst, tat = float(r["per_second"]), float(r["burst"]), r["tat"]
        ahead = max(0.0, (tat - now).total_seconds())  # queued work, in seconds of refill
        tokens = max(0.0, min(burst, burst - ahead * rate))
        admit = max(now, tat - timedelta(seconds=(burst - 1) / rate))
        out.append(BucketState(r["tenant_id"], r["bucket"], rate, burst, tokens, admit))
    return out
