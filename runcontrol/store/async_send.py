"""``Database.send_documents`` for an event loop (a run host's group commits).

The host's group of commands is one statement; awaiting it, instead of blocking a thread on it,
lets the host's loop run the next batch's rules while the database commits this one, and saves
the thread hand-offs (measured: docs/benchmarks.md). Its own small pool of autocommit
connections for the app role, so row-level security applies as on every other path.
"""

from __future__ import annotations

import psycopg
from psycopg_pool import AsyncConnectionPool

from .database import Database, answers, apply_statement
from .group import Answer
from .notify import libpq_url

APPLICATION_NAME = "runcontrol-group-commit"  # how its sessions show in pg_stat_activity


class AsyncDocumentSender:
    def __init__(self, db: Database, *, size: int = 4) -> None:
        self._db = db
        self._pool = AsyncConnectionPool(
            libpq_url(db.app_url),
            min_size=1,
            max_size=size,
            kwargs={"autocommit": True, "application_name": APPLICATION_NAME},
            open=False,
        )
        self._opened = False

    async def send(self, docs: list[str]) -> list[Answer]:
        """As ``Database.send_documents``: answers per document; raises only when the
        connection failed (a broken connection is discarded by the pool)."""
        await self.open()
        self._db.count_sent(docs)
        async with self._pool.connection() as conn, conn.cursor() as cur:
            try:
                await cur.execute(*apply_statement(docs))
            except psycopg.DatabaseError as exc:
                if conn.broken or len(docs) > 1:  # the connection failed, or all did
                    raise
                return [(exc.sqlstate or "", str(exc))]
            return answers(docs, await cur.fetchone())

    async def open(self) -> None:
        if not self._opened:
            await self._pool.open()
            self._opened = True

    async def close(self) -> None:
        if self._opened:
            await self._pool.close()
            self._opened = False
