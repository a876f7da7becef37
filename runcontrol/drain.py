"""Graceful drain of one process: refuse new work, let the work in flight finish.

A ``Drain`` is owned by each process that takes commands: an API replica (HTTP and gRPC) and a
run host. Once ``begin()`` is called, new work (a submission, a claim: ``NEW_WORK``) is refused
with ``errors.Draining`` (retryable, answered before anything ran), while the commands already
in flight, and at the edge the commands of work already accepted (a lease holder's report,
renewal or approval request, a decision, a cancel), go on: refusing a holder's report would
lose the attempt it ran. ``wait(grace_s)`` then waits until nothing is in flight, at most
``grace_s`` seconds. No I/O and no Ray: the hosts around it decide when to begin.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from .commands import AcquireLease, Command, SubmitRun
from .domain import errors

# Commands that start work rather than finish it: refused at a draining edge. ``AcquireLease``
# is a new lease (a claim, or a named attempt taken without a fencing token); a renewal is
# ``RenewLease`` and goes on.
NEW_WORK: tuple[type[Command[Any]], ...] = (SubmitRun, AcquireLease)


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What a drain waited for: ``idle`` False when the grace ran out with work in flight."""

    idle: bool
    in_flight: int
    waited_s: float


class Drain:
    def __init__(self, retry_after_s: int = 5) -> None:
        self.retry_after_s = retry_after_s
        self._draining = False
        self._in_flight = 0
        # Made on the first wait, on the waiter's loop. A run host's drain waits on its control
        # concurrency group's loop while its commands run on another loop, in another thread:
        # the event is set through the waiter's loop (an ``Event.set`` from the other thread
        # woke nobody, and every drain with work in flight waited out its whole grace).
        self._idle: asyncio.Event | None = None
        self._idle_loop: asyncio.AbstractEventLoop | None = None

    @property
    def draining(self) -> bool:
        return self._draining

    @property
    def in_flight(self) -> int:
        return self._in_flight

    def begin(self) -> None:
        """Refuse new work from now on (idempotent)."""
        self._draining = True

    def resume(self) -> None:
        """Take new work again (a drain begun by mistake, or one called off)."""
        self._draining = False

    def refuse(self, what: str) -> errors.Draining:
        return errors.Draining(
            f"{what}: draining (shutting down or being replaced); retry in {self.retry_after_s} s",
            retry_after=self.retry_after_s,
        )

    def check(self, what: str = "this process takes no new work") -> None:
        """Raise ``errors.Draining`` while draining."""
        if self._draining:
            raise self.refuse(what)

    def admit(self, command: Command[Any]) -> None:
        """Refuse ``command`` while draining if it starts new work (``NEW_WORK``)."""
        if self._draining and isinstance(command, NEW_WORK):
            raise self.refuse(type(command).__name__)

    @contextlib.contextmanager
    def track(self) -> Iterator[None]:
        """Count the work inside as in flight: ``wait`` waits for it."""
        self._in_flight += 1
        try:
            yield
        finally:
            self._in_flight -= 1
            if self._in_flight == 0 and self._idle is not None and self._idle_loop is not None:
                with contextlib.suppress(RuntimeError):  # the waiter's loop is closed: no one waits
                    self._idle_loop.call_soon_threadsafe(self._idle.set)

    async def wait(self, grace_s: float) -> DrainReport:
        """Wait until nothing is in flight, at most ``grace_s`` seconds (begins the drain)."""
        self.begin()
        started = time.monotonic()
        if self._in_flight:
            if self._idle is None:  # one event for every waiter (a drain may be awaited twice)
                self._idle = asyncio.Event()
                self._idle_loop = asyncio.get_running_loop()
            idle = self._idle
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(grace_s, 0.0)):
                    while self._in_flight:
                        idle.clear()
                        await idle.wait()
        return DrainReport(
            self._in_flight == 0, self._in_flight, round(time.monotonic() - started, 3)
        )
