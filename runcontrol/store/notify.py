"""LISTEN/NOTIFY fan-in: one listening connection per process (per shard database it serves)
wakes any number of waiters."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import defaultdict
from collections.abc import Sequence

import psycopg
from sqlalchemy.engine import make_url

from ..domain.backoff import backoff_delay

log = logging.getLogger(__name__)


def libpq_url(sqlalchemy_url: str) -> str:
    return (
        make_url(sqlalchemy_url).set(drivername="postgresql").render_as_string(hide_password=False)
    )


_REGISTER = "SELECT runcontrol_listen(%s::text[])"
_UNREGISTER = "SELECT runcontrol_unlisten()"
_UNREGISTER_TIMEOUT_S = 2.0


async def _unregister(conn: psycopg.AsyncConnection[object]) -> None:
    """Stop the write path NOTIFYing for this connection (it closes next). Best effort: if it
    fails, the row of the closed backend is swept by the next registration, and costs only
    NOTIFYs meanwhile."""
    with contextlib.suppress(Exception):
        await asyncio.wait_for(conn.execute(_UNREGISTER), _UNREGISTER_TIMEOUT_S)


class Listener:
    """Listens on channels and bumps a per-(channel, payload) generation counter.

    Waiters call ``wait(channel, payloads, since, timeout)``; a missed notification is never
    fatal because every waiter re-queries the store after waking or timing out. A
    notification wakes only the waiters of its payload (and those of every payload, ``*``):
    one connection can feed thousands of waiters, each woken by its own run's commits only.

    ``idle_s``: listen only while someone waits. The connection is opened by the first
    ``wait`` and closed once nobody has waited for ``idle_s`` seconds, so a process that
    nobody watches through it is not sent every commit's NOTIFY (issue 24: the run hosts'
    claimers and event watchers). Each (re)start bumps the generation, so a waiter that took
    ``since`` while nothing listened wakes once and re-queries instead of missing a commit.

    The connection registers its channels after it LISTENs (``runcontrol_listen``, migration
    0026: the write path NOTIFYs only channels somebody registered) and before it wakes the
    waiters to re-query; the registration waits for every commit that found no listener, so
    the re-query sees those and every later commit NOTIFYs. It unregisters when it stops.
    """

    def __init__(
        self,
        url: str | Sequence[str],
        channels: tuple[str, ...],
        *,
        application_name: str = "runcontrol-listener",
        reconnect_base_s: float = 0.2,
        reconnect_cap_s: float = 10.0,
        idle_s: float | None = None,
    ) -> None:
        # one connection per database (a process serving several shards listens on each)
        self._urls = tuple(libpq_url(u) for u in ((url,) if isinstance(url, str) else url))
        self._channels = channels
        self._application_name = application_name
        self._generation: dict[tuple[str, str], int] = defaultdict(int)
        self._waiters: dict[tuple[str, str], set[asyncio.Future[None]]] = defaultdict(set)
        # Bumped each time the connection (re)starts listening: what was sent while none
        # listened is lost, so every waiter wakes and re-queries instead of sleeping out its
        # timeout.
        self._epoch = 0
        self._tasks: list[asyncio.Task[None]] = []
        self._reconnect_base_s = reconnect_base_s
        self._reconnect_cap_s = reconnect_cap_s
        # The databases whose connection listens: only while every one does, an unchanged
        # generation proves that nothing was notified (``listening``).
        self._listening: set[int] = set()
        self._idle_s = idle_s
        self._idle_timer: asyncio.TimerHandle | None = None

    @property
    def listening(self) -> bool:
        """Whether every connection listens: only then does an unchanged generation prove that
        nothing was notified (a cache keyed on it may be trusted: runcontrol/ports/cache.py)."""
        return len(self._listening) == len(self._urls)

    def start(self) -> None:
        """Listen from now on (on the running loop); ``wait`` starts it too."""
        if not self._tasks or any(t.done() for t in self._tasks):
            for task in self._tasks:
                task.cancel()
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._run(i)) for i in range(len(self._urls))]

    def _stop_when_idle(self) -> None:
        if self._idle_s is None or self._waiters:
            return
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._idle_timer = asyncio.get_running_loop().call_later(self._idle_s, self._stop_if_idle)

    def _stop_if_idle(self) -> None:
        self._idle_timer = None
        if self._waiters or not self._tasks:
            return
        for task in self._tasks:
            task.cancel()  # its connection closes: no more NOTIFYs for this process
        self._tasks = []
        self._listening.clear()
        self._epoch += 1  # nothing sent from now on is seen

    async def close(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self, database: int) -> None:
        """Listen on the ``database``-th URL for ever: after a lost connection (the database
        restarted, a backend was terminated), reconnect with exponential backoff and full
        jitter."""
        failures = 0
        listened = False
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(
                    self._urls[database],
                    autocommit=True,
                    application_name=self._application_name,
                    # TCP keepalives notice a peer that vanished without closing (a lost
                    # host, not a restart); libpq ignores them on a Unix socket.
                    keepalives=1,
                    keepalives_idle=30,
                    keepalives_interval=10,
                    keepalives_count=3,
                ) as conn:
                    for channel in self._channels:
                        await conn.execute(f"LISTEN {channel}")
                    await conn.execute(_REGISTER, (list(self._channels),))
                    if listened:
                        log.warning("notification listener reconnected")
                    listened, failures = True, 0
                    self._listening.add(database)
                    self._wake_all()
                    try:
                        async for note in conn.notifies():
                            self._generation[(note.channel, note.payload)] += 1
                            self._generation[(note.channel, "*")] += 1
                            self._wake((note.channel, note.payload))
                            self._wake((note.channel, "*"))
                    except asyncio.CancelledError:
                        await _unregister(conn)
                        raise
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # waiters fall back to their timeouts meanwhile
                self._listening.discard(database)
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

    def _wake(self, key: tuple[str, str]) -> None:
        for waiter in self._waiters.pop(key, ()):
            if not waiter.done():
                waiter.set_result(None)

    def _wake_all(self) -> None:
        self._epoch += 1
        for key in list(self._waiters):
            self._wake(key)

    def generation(self, channel: str, payloads: tuple[str, ...]) -> int:
        keys = payloads or ("*",)
        return self._epoch + sum(self._generation[(channel, p)] for p in keys)

    async def wait(
        self, channel: str, payloads: tuple[str, ...], since: int, timeout: float
    ) -> bool:
        """Return True when a notification newer than ``since`` arrives (or came already),
        False after ``timeout`` without one."""
        self.start()
        try:
            if self.generation(channel, payloads) != since:
                return True
            waiter = asyncio.get_running_loop().create_future()
            keys = [(channel, p) for p in payloads or ("*",)]
            for key in keys:
                self._waiters[key].add(waiter)
            try:
                await asyncio.wait({waiter}, timeout=timeout)
            finally:
                waiter.cancel()  # a no-op once woken
                for key in keys:
                    waiting = self._waiters.get(key)
                    if waiting is not None:
                        waiting.discard(waiter)
                        if not waiting:
                            del self._waiters[key]
            return self.generation(channel, payloads) != since
        finally:
            self._stop_when_idle()
