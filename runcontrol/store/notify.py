"""LISTEN/NOTIFY fan-in: one listening connection per process wakes any number of waiters."""

from __future__ import annotations

import asyncio
import logging
import random
from collections import defaultdict

import psycopg
from sqlalchemy.engine import make_url

from ..domain.retry import backoff_delay

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

    def __init__(
        self,
        url: str,
        channels: tuple[str, ...],
        *,
        reconnect_base_s: float = 0.2,
        reconnect_cap_s: float = 10.0,
    ) -> None:
        self._url = libpq_url(url)
        self._channels = channels
        self._cond: asyncio.Condition | None = None
        self._generation: dict[tuple[str, str], int] = defaultdict(int)
        # Bumped on every reconnection: what was sent while no connection listened is lost,
        # so every waiter wakes and re-queries instead of sleeping out its timeout.
        self._epoch = 0
        self._task: asyncio.Task[None] | None = None
        self._reconnect_base_s = reconnect_base_s
        self._reconnect_cap_s = reconnect_cap_s
        # True while a connection listens: only then does an unchanged generation prove that
        # nothing was notified (a cache keyed on it may be trusted).
        self.listening = False

    def start(self) -> None:
        """Start listening now (otherwise the first ``wait`` starts it); call on the loop."""
        self._ensure()

    def _ensure(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        return self._cond

    async def _run(self) -> None:
        """Listen for ever: after a lost connection (the database restarted, a backend was
        terminated), reconnect with exponential backoff and full jitter."""
        failures = 0
        listened = False
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._url,
                    autocommit=True,
                    # TCP keepalives notice a peer that vanished without closing (a lost
                    # host, not a restart); libpq ignores them on a Unix socket.
                    keepalives=1,
                    keepalives_idle=30,
                    keepalives_interval=10,
                    keepalives_count=3,
                ) as conn:
                    for channel in self._channels:
                        await conn.execute(f"LISTEN {channel}")
                    if listened:
                        log.warning("notification listener reconnected")
                        await self._wake_all()
                    listened, failures = True, 0
                    self.listening = True
                    async for note in conn.notifies():
                        self._generation[(note.channel, note.payload)] += 1
                        self._generation[(note.channel, "*")] += 1
                        await self._notify()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # waiters fall back to their timeouts meanwhile
                self.listening = False
                self._epoch += 1  # whatever was cached on a generation is no longer proven
                failures += 1
                delay = backoff_delay(
                    failures,
                    base_seconds=self._reconnect_base_s,
                    cap_seconds=self._reconnect_cap_s,
                    uniform=random.uniform,
                )
                log.warning(
                    "notification listener lost its connection (%r); reconnecting in %.2fs",
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)

    async def _notify(self) -> None:
        assert self._cond is not None
        async with self._cond:
            self._cond.notify_all()

    async def _wake_all(self) -> None:
        self._epoch += 1
        await self._notify()

    def generation(self, channel: str, payloads: tuple[str, ...]) -> int:
        keys = payloads or ("*",)
        return self._epoch + sum(self._generation[(channel, p)] for p in keys)

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
