"""Tenant-scoped reads on an event loop: the read models of ``queries`` over an async engine.

A Serve replica answers its GET routes and feeds its event streams from here, on its own loop,
without a thread hop per read and never through a run host (measured: docs/benchmarks.md).
The query functions stay the synchronous ones in ``queries``: ``run_sync`` runs them on the
loop, each statement awaiting the driver (SQLAlchemy's greenlet bridge). The app role's own
small pool, so row-level security applies as on every other path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from .database import _SET_TENANT

T = TypeVar("T")

APPLICATION_NAME = "runcontrol-reads"  # how its sessions show in pg_stat_activity


class AsyncReads:
    def __init__(self, app_url: str, *, pool_size: int = 10) -> None:
        url = make_url(app_url).set(drivername="postgresql+psycopg")
        self._url = url.render_as_string(hide_password=False)
        self._pool_size = pool_size
        self._engine: AsyncEngine | None = None

    @property
    def engine(self) -> AsyncEngine:
        # Made on first use, on the loop that reads: its connections belong to that loop.
        if self._engine is None:
            self._engine = create_async_engine(
                self._url,
                pool_size=self._pool_size,
                max_overflow=self._pool_size,
                pool_recycle=1800,
                pool_pre_ping=False,  # a broken connection fails one read, then is replaced
                connect_args={"application_name": APPLICATION_NAME},
            )
        return self._engine

    async def read(self, tenant_id: str, query: Callable[[Connection], T]) -> T:
        """Run ``query`` in a transaction that row-level security limits to ``tenant_id``."""
        if not tenant_id:
            raise ValueError("a tenant-scoped read needs a tenant id")
        async with self.engine.begin() as conn:
            await conn.execute(_SET_TENANT, {"tenant": tenant_id})
            return await conn.run_sync(query)

    async def dispose(self) -> None:
        if self._engine is not None:
            await self._engine.dispose()
            self._engine = None
