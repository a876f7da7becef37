"""The scheduler's jobs once per shard database (issue 41; docs/sharding.md).

Each shard database has its own ``SchedulerLock`` (an advisory lock is its database's), so
the reminders, lease and approval expiry, retention, schedules, the outbox relay and webhook
delivery of a shard run in the one scheduler holding that shard's lock: two shards may be
swept by two schedulers, and a scheduler that dies (its lock connection ends) leaves its
shards to whichever other scheduler asks next, while the shards it did not hold go on as
before. A job runs on each held shard in a thread of its own (a shard whose database is slow
or down holds up only its own), and what the shards found is merged for the wakes and the
gauges: the all-tenant reads fan out here, each shard's tenants being its own.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable, MutableSet, Sequence
from dataclasses import dataclass
from typing import TypeVar

from .reconcilers import DueRuns, GaugeSample, RelayReport, SchedulerLock
from .store import Database

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class ShardSweep:
    """One shard database's share of a scheduler: its lock (its relay's floor is its
    database's ``relay_state``)."""

    index: int  # its position in RUNCONTROL_SHARDS__DATABASES
    db: Database
    lock: SchedulerLock

    @classmethod
    def of(cls, db: Database, *, verify_s: float = 1.0) -> list[ShardSweep]:
        """One per database behind ``db`` (``Database.databases``), each with its own lock."""
        return [
            cls(i, each, SchedulerLock(each.system_url, verify_s=verify_s))
            for i, each in enumerate(db.databases())
        ]


async def each_held(
    sweeps: Sequence[ShardSweep],
    job: str,
    fn: Callable[[ShardSweep], T],
    running: MutableSet[str],
) -> list[T]:
    """``fn`` on every shard whose lock this scheduler holds, each in a thread of its own and
    never while ``job`` still runs on that shard (``running``: ``job@index`` while it does).
    Answers what each run found; a shard whose run failed is logged and left out (it runs
    again at the job's next interval)."""

    async def one(sweep: ShardSweep) -> list[T]:
        key = f"{job}@{sweep.index}"
        if key in running:
            return []
        running.add(key)
        try:
            return await asyncio.to_thread(_if_held, sweep, fn)
        except Exception:
            log.exception("%s failed on shard %d; it runs at its next interval", job, sweep.index)
            return []
        finally:
            running.discard(key)

    found = await asyncio.gather(*(one(s) for s in sweeps))
    return [value for ran in found for value in ran]


def _if_held(sweep: ShardSweep, fn: Callable[[ShardSweep], T]) -> list[T]:
    return [fn(sweep)] if sweep.lock.held() else []


def held(sweeps: Iterable[ShardSweep]) -> list[int]:
    """The shards whose lock this scheduler holds."""
    return [s.index for s in sweeps if s.lock.held()]


def close(sweeps: Iterable[ShardSweep]) -> None:
    for sweep in sweeps:
        sweep.lock.close()


def due(found: Sequence[DueRuns]) -> DueRuns:
    """Every shard's due runs; the earliest reminder ahead of any."""
    ahead = [f.next_at for f in found if f.next_at is not None]
    return DueRuns([k for f in found for k in f.keys], min(ahead, default=None))


def relayed(found: Sequence[RelayReport]) -> RelayReport:
    lags = tuple(lag for f in found for lag in f.lags)
    return RelayReport(
        sum(f.published for f in found), max((f.max_lag_seconds for f in found), default=0.0), lags
    )


def gauges(found: Sequence[GaugeSample]) -> GaugeSample:
    """Every shard's gauges as one: counts added, ages the oldest (a tenant is in one shard,
    so its keys meet only when its rows are in two: its legacy runs in the first)."""
    merged = GaugeSample({}, {}, 0, 0.0)
    for f in found:
        _add(merged.runs_active, f.runs_active)
        _add(merged.stalled, f.stalled)
        _add(merged.held, f.held)
        _oldest(merged.approvals_pending, f.approvals_pending)
        _oldest(merged.flow_waiting, f.flow_waiting)
        merged.rate_tokens.update(f.rate_tokens)
    return GaugeSample(
        merged.runs_active,
        merged.approvals_pending,
        sum(f.outbox_unpublished for f in found),
        max((f.outbox_oldest_age for f in found), default=0.0),
        merged.stalled,
        merged.flow_waiting,
        merged.held,
        merged.rate_tokens,
    )


K = TypeVar("K")


def _add(into: dict[K, int], more: dict[K, int]) -> None:
    for key, n in more.items():
        into[key] = into.get(key, 0) + n


def _oldest(into: dict[K, tuple[int, float]], more: dict[K, tuple[int, float]]) -> None:
    for key, (n, age) in more.items():
        had, oldest = into.get(key, (0, 0.0))
        into[key] = (had + n, max(oldest, age))
