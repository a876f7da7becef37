"""LISTEN/NOTIFY fan-in: one listening connection per process wakes any number of waiters."""

from __future__ import annotations

import asyncio
import logging
from collections import defaultdict

import psycopg
from sqlalchemy.engine import make_url

log = logging.getLogger(__name__)


def libpq_url(sqlalchemy_url: str) -> str:
    return (
        make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(hide_password=False)
    )


class Listener:
    """Listens on channels and bumps a per-(channel, payload) generation counter.

    Waiters call ``wait(channel, payloads, timeout)``; a missed notification is never fatal
    because every waiter re-queries the store after waking or timing out.
    """

    def __init__(self, url: str, channels: tuple[str, ...]) -> None:
        self._url = libpq_url(url)
        self._channels = channels
        self._cond: asyncio.Condition | None = None
        self._generation: dict[tuple[str, str], int] = defaultdict(int)
        self._task: asyncio.Task[None] | None = None

    def _ensure(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return self._cond

    async def _run(self) -> None:
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._url, autocommit=True
                ) as conn:
                    for channel in self._channels:
                        await conn.execute(f"LISTEN {channel}")
                    async for note in conn.notifies():
                        self._generation[(note.channel, note.payload)] += 1
                        self._generation[(note.channel, "*")] += 1
                        assert self._cond is not None
                        async with self._cond:
                            self._cond.notify_all()
            except asyncio.CancelledError:
                raise
            except Exception:  # connection lost: waiters fall back to their timeouts
                log.warning("notification listener lost its connection; reconnecting")
                await asyncio.sleep(1.0)

    def generation(self, channel: str, payloads: tuple[str, ...]) -> int:
        keys = payloads or ("*",)
        return sum(self._generation[(channel, p)] for p in keys)

    async def wait(
        self, channel: str, payloads: tuple[str, ...], since: int, timeout: float
    ) -> None:
        """Return when a notification newer than ``since`` arrives, or after ``timeout``."""
        cond = self._ensure()

        async def changed() -> None:
            async with cond:
                await cond.wait_for(lambda: self.generation(channel, payloads) != since)

        try:
            await asyncio.wait_for(changed(), timeout)
        except TimeoutError:
            pass
