"""The API replica's reads: the GetRun read model on one event loop, two ways, same run.

``to_thread``: each read on a thread of the default executor over the sync engine (what
``runcontrol.api.context.Services.read`` does). ``async``: psycopg on the loop through
SQLAlchemy's async engine, the same query functions run by ``run_sync`` (the greenlet bridge).
Both with the same concurrency against the same database, without Ray or HTTP, so the figure
is what the read path itself costs. The async variant lives here, not in ``runcontrol``: it
was measured as no faster (docs/benchmarks.md), so the product keeps one I/O model for reads.
"""

from __future__ import annotations

import asyncio
import resource
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from runcontrol.config import Settings
from runcontrol.grain import RunGrain
from runcontrol.store import queries as q

from .common import percentile
from .inprocess import _submit
from .transitions import _tenant_with_workflow

Read = Callable[[uuid.UUID], Awaitable[Any]]
SET_TENANT = text("SELECT set_config('runcontrol.tenant_id', :tenant, true)")


async def _load(
    read: Read, run_ids: list[uuid.UUID], total: int, concurrency: int
) -> dict[str, float]:
    latencies: list[float] = []
    counter = iter(range(total))

    async def worker() -> None:
        for i in counter:
            started = time.perf_counter()
            view = await read(run_ids[i % len(run_ids)])
            latencies.append((time.perf_counter() - started) * 1000)
            assert view is not None

    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {
        "reads_per_s": total / elapsed,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "cpu_ms_per_read": 1000 * cpu / total,
    }


def run(
    owner_url: str, *, runs: int = 50, total: int = 4000, concurrency: int = 32
) -> dict[str, Any]:
    settings = Settings()  # pool_size 10, as a replica has
    container, tenant, principal = _tenant_with_workflow(settings, owner_url)
    db = container.db
    figures: dict[str, Any] = {"concurrency": concurrency, "reads": total}
    try:
        grains = [RunGrain(container.env, tenant, uuid.uuid4()) for _ in range(runs)]
        run_ids = [g.run_id for g in grains]

        def sync_read(run_id: uuid.UUID) -> Any:
            with db.tenant(tenant) as conn:
                return q.get_run(conn, run_id)

        async def threaded(run_id: uuid.UUID) -> Any:
            return await asyncio.to_thread(sync_read, run_id)

        async def both() -> None:
            for grain in grains:  # the grain's store is async: on this loop
                await _submit(grain, principal)
            url = make_url(db.app_url).set(drivername="postgresql+psycopg")
            engine = create_async_engine(
                url.render_as_string(hide_password=False),
                pool_size=settings.pool_size,
                max_overflow=settings.pool_size,
            )

            async def on_loop(run_id: uuid.UUID) -> Any:
                def query(conn: Connection) -> Any:
                    return q.get_run(conn, run_id)

                async with engine.begin() as conn:
                    await conn.execute(SET_TENANT, {"tenant": tenant})
                    return await conn.run_sync(query)

            try:
                for label, read in (("to_thread", threaded), ("async", on_loop)) * 2:
                    # each twice, alternating; the second of each is kept (warm pools)
                    figures[label] = await _load(read, run_ids, total, concurrency)
            finally:
                await engine.dispose()

        asyncio.run(both())
    finally:
        db.dispose()
    print()
    print(f"GetRun read model, {concurrency} concurrent readers on one event loop, {total} reads")
    print(f"{'path':<14}{'reads/s':>10}{'p50 ms':>10}{'p99 ms':>10}{'CPU ms/read':>14}")
    for label in ("to_thread", "async"):
        f = figures[label]
        print(
            f"{label:<14}{f['reads_per_s']:>10.0f}{f['p50_ms']:>10.1f}{f['p99_ms']:>10.1f}"
            f"{f['cpu_ms_per_read']:>14.2f}"
        )
    return figures
