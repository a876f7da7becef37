"""The read model, queried on a thread: the one way both edges read the database.

Measured against async psycopg on the loop (SQLAlchemy's async engine over the same queries),
a thread was as fast or faster: ``python -m bench --only reads``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Connection
from sqlalchemy import exc as sa_exc

from ..domain import errors
from ..store import Database

T = TypeVar("T")


async def read(
    db: Database, tenant_id: str, query: Callable[[Connection], T], *, project_id: str | None
) -> T:
    """``query`` in the tenant and, unless None, the project (row-level security on both)."""

    def run() -> T:
        with db.tenant(tenant_id, project_id=project_id) as conn:
            return query(conn)

    try:
        return await asyncio.to_thread(run)
    except (sa_exc.OperationalError, sa_exc.InterfaceError) as exc:
        # The database is down or restarting: Unavailable and retry, not an internal error
        # (the chaos suite's PostgreSQL crash met HTTP 500s here).
        raise errors.Unavailable(f"the database did not answer: {type(exc.orig).__name__}") from exc
