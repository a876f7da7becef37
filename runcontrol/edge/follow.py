"""Following a stream of stored rows live: the one loop behind every resumable stream of the
edges (a run's events and its output over SSE, the tenant feed, gRPC ``WatchRun``).

A stream reads a page after its cursor; a full page is followed by the next at once; a short
one by a wait on the process's LISTEN connection (``store.notify.Listener``) for a NOTIFY of
the stream's key on one of its channels, at most ``heartbeat_s``. The generation is taken
before each read, so a commit after the read wakes the wait at once; a lost notification costs
at most one heartbeat. Nothing polls the database in a loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from ..store.notify import Listener

T = TypeVar("T")
C = TypeVar("C")


@dataclass(frozen=True, slots=True)
class Page(Generic[T, C]):
    """What one read found after the cursor: its ``items``, the cursor after them, whether
    more are stored already (a full page: read again without waiting) and whether nothing
    will ever follow (the stream ends after these)."""

    items: Sequence[T]
    cursor: C
    full: bool = False
    done: bool = False


@dataclass(frozen=True, slots=True)
class Notified:
    """Where a stream's wake-ups come from: ``channels`` of ``listener``, NOTIFYed with the
    stream's ``key`` (a run id, a tenant)."""

    listener: Listener
    channels: tuple[str, ...]
    key: tuple[str, ...]

    def generation(self) -> int:
        return sum(self.listener.generation(c, self.key) for c in self.channels)

    async def wait(self, since: int, timeout: float) -> bool:
        """True once a NOTIFY newer than ``since`` came, False after ``timeout`` without."""
        listener, key = self.listener, self.key
        marks = [listener.generation(c, key) for c in self.channels]
        if sum(marks) != since:
            return True
        waits = [
            asyncio.ensure_future(listener.wait(c, key, m, timeout))
            for c, m in zip(self.channels, marks, strict=True)
        ]
        try:
            done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            return any(w.result() for w in done)
        finally:
            for w in waits:
                w.cancel()


Read = Callable[[C, int], Awaitable[Page[T, C]]]


async def follow(
    notified: Notified,
    read: Read[C, T],
    cursor: C,
    heartbeat_s: float,
    *,
    first: Page[T, C] | None = None,
    since: int | None = None,
) -> AsyncIterator[T | None]:
    """The items after ``cursor`` as they are stored, and None for each ``heartbeat_s`` that
    passed without any. ``read(cursor, generation)`` reads a page (``generation``: the
    notifications' count taken before it, so streams woken together may share the read).
    ``first``: a page read already, ``since`` the generation taken before it."""
    since = notified.generation() if since is None else since
    page = first if first is not None else await read(cursor, since)
    while True:
        for item in page.items:
            yield item
        cursor = page.cursor
        if page.done:
            return
        if not page.full:
            if not await notified.wait(since, heartbeat_s):
                yield None
        since = notified.generation()
        page = await read(cursor, since)
