"""One worker process's session with one run host: the exchanges (``runcontrol.workers.protocol``).

A ``HostSession`` always keeps one exchange waiting on its host (a long poll with the slots
it offers there as credits); anything new to say (a command, a credit, an ack) starts a new
exchange at once, which supersedes the waiting one (the host answers that one with what it
has). A command travels in exactly one exchange at a time and its caller learns that try's
fate: answered, refused, or unknown (the exchange failed), in which case the caller resends
the same command (same ``command_id``) and the host answers the stored result.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ..commands import Command
from ..domain import errors
from ..workers.protocol import MAX_WAIT_S, Credit, Grant, SessionDown, SessionTransport, SessionUp
from ._backoff import Backoff

log = logging.getLogger(__name__)

# Exchanges of one session in flight at once: the waiting long poll and the one that
# supersedes it. A third would only supersede the second.
MAX_IN_FLIGHT = 2
MAX_COMMANDS = 64
# How long the acks of new grants wait for the new attempts' first commands.
ACK_LINGER_S = 0.002
# An exchange that fails this often while closing gives up (its leases, if any, expire).
CLOSE_FAILURES = 3


class SessionListener(Protocol):
    def granted(self, host: int, grant: Grant) -> None: ...

    def cancelled(self, host: int, attempt_ids: list[Any]) -> None: ...

    def answered(self, host: int, down: SessionDown) -> None: ...

    def withdrawn(self, host: int, credit: Credit) -> None: ...


@dataclass
class _Queued:
    command: Command[Any]
    future: asyncio.Future[Any]


@dataclass
class _Sent:
    seq: int
    up: SessionUp
    commands: list[_Queued]


class HostSession:
    def __init__(
        self,
        transport: SessionTransport,
        host: int,
        session_id: str,
        listener: SessionListener,
        *,
        wait_s: float,
        probe_s: float,
        backoff: Backoff,
        probing: Callable[[], bool],
    ) -> None:
        self.transport = transport
        self.host = host
        self.session_id = session_id
        self.listener = listener
        self.wait_s = min(wait_s, MAX_WAIT_S)
        self.probe_s = probe_s
        self.backoff = backoff
        self._probing = probing
        self.credits: dict[str, Credit] = {}  # offered here now, by claim id
        # Carried by an exchange whose answer was lost: sent again with resent=True (the host
        # may have granted it), and withdrawn only after an exchange carrying it is answered.
        self._uncertain: set[str] = set()
        self._withdrawing: dict[str, tuple[Credit, int]] = {}  # claim id -> (credit, seq)
        self._queue: list[_Queued] = []
        self._acks: set[str] = set()
        self._kick = asyncio.Event()
        self._seq = 0
        self._closing_seq: int | None = None
        self._closed = asyncio.Event()
        self._done = False
        self._delivered: set[str] = set()  # claim ids whose grant went to the listener
        self._withdraw_when_answered: set[str] = set()
        self.backlog: Mapping[str, int] = {}

    # ------------------------------------------------------------------ what the worker does

    def offer(self, credit: Credit) -> None:
        self.credits[credit.claim_id] = credit
        self._kick.set()

    def withdraw(self, claim_id: str) -> None:
        """Stop offering this credit: ``listener.withdrawn`` follows once the host certainly
        did not grant it, ``listener.granted`` if it did."""
        credit = self.credits.get(claim_id)
        if credit is None:
            return
        if claim_id in self._uncertain:
            # The host may have granted it (that answer lost): withdrawn once an exchange
            # carrying it, resent, is answered.
            self._withdraw_when_answered.add(claim_id)
            self._kick.set()
            return
        del self.credits[claim_id]
        self._withdrawing[claim_id] = (credit, self._seq)
        self._kick.set()

    async def send(self, command: Command[Any]) -> Any:
        """One try of ``command`` in the next exchange: its answer, its refusal, or the
        exchange's failure (then unknown whether it ran: resend the same command)."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(_Queued(command, future))
        self._kick.set()
        return await future

    def close(self) -> None:
        """Withdraw every credit and end the session after one more answered exchange."""
        for claim_id in list(self.credits):
            self.withdraw(claim_id)
        self._closing_seq = self._seq
        self._kick.set()

    async def closed(self) -> None:
        await self._closed.wait()

    @property
    def idle_credits(self) -> int:
        return len(self.credits)

    # ------------------------------------------------------------------ the exchanges

    async def run(self) -> None:
        failures = closing_failures = 0
        inflight: dict[asyncio.Task[SessionDown], _Sent] = {}
        try:
            while not self._finished(inflight):
                if not inflight or (self._kick.is_set() and len(inflight) < MAX_IN_FLIGHT):
                    self._kick.clear()
                    sent = self._take()
                    task = asyncio.create_task(self.transport.exchange(self.host, sent.up))
                    inflight[task] = sent
                waits: set[asyncio.Future[Any]] = set(inflight)
                kicked = None
                if len(inflight) < MAX_IN_FLIGHT:
                    kicked = asyncio.ensure_future(self._kick.wait())
                    waits.add(kicked)
                done, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                if kicked is not None:
                    kicked.cancel()
                for task in [t for t in inflight if t in done]:
                    sent = inflight.pop(task)
                    exc = task.exception()
                    if exc is None:
                        failures = 0
                        down = task.result()
                        self._answered(sent, down)
                        if down.grants:
                            # The acks wait a moment for what the new attempts say first (a
                            # quick function's report): one exchange carries both.
                            await asyncio.sleep(ACK_LINGER_S)
                        continue
                    failures += 1
                    self._failed(sent, exc)
                    if self._closing_seq is not None:
                        closing_failures += 1
                        if closing_failures >= CLOSE_FAILURES:
                            log.warning("host %d: closing the session failed: %r", self.host, exc)
                            return
                    delay = self.backoff.delay(failures)
                    log.warning(
                        "host %d: exchange failed: %r; again in %.2fs", self.host, exc, delay
                    )
                    await self.backoff.sleep(delay)
        finally:
            for task in inflight:
                task.cancel()
            for task in inflight:
                with contextlib.suppress(BaseException):
                    await task
            for queued in self._queue:
                if not queued.future.done():
                    queued.future.set_exception(errors.Unavailable("the session was closed"))
            self._closed.set()

    def _finished(self, inflight: Mapping[Any, _Sent]) -> bool:
        return self._closed.is_set() or (
            self._closing_seq is not None and not inflight and not self._queue and self._done
        )

    def _take(self) -> _Sent:
        self._seq += 1
        commands, self._queue = self._queue[:MAX_COMMANDS], self._queue[MAX_COMMANDS:]
        if self._queue:
            self._kick.set()
        credits = [
            replace(c, resent=True) if c.claim_id in self._uncertain else c
            for c in self.credits.values()
        ]
        if (
            self._closing_seq is not None
            or self._queue
            or self._withdrawing
            or self._withdraw_when_answered
        ):
            # The worker waits for this answer (a command's, or a withdrawal's, which is no
            # news to the host: as a long poll it would hold a credit's move or a stop for
            # the whole wait).
            wait = 0.0
        elif self.credits or not self._probing():
            wait = self.wait_s
        else:
            wait = self.probe_s
        up = SessionUp(
            session_id=self.session_id,
            credits=tuple(credits),
            commands=tuple(q.command for q in commands),
            acks=tuple(sorted(self._acks)),
            wait_s=wait,
            seq=self._seq,
        )
        return _Sent(self._seq, up, commands)

    def _failed(self, sent: _Sent, exc: BaseException) -> None:
        self._uncertain.update(c.claim_id for c in sent.up.credits)
        unknown = exc if isinstance(exc, Exception) else errors.Unavailable(repr(exc))
        for queued in sent.commands:
            if not queued.future.done():
                queued.future.set_exception(unknown)

    def _answered(self, sent: _Sent, down: SessionDown) -> None:
        answers = {a.command_id: a for a in down.answers}
        for queued in sent.commands:
            if queued.future.done():
                continue
            answer = answers.get(queued.command.command_id)
            if answer is None:
                queued.future.set_exception(
                    errors.Unavailable(f"no answer to {type(queued.command).__name__}")
                )
            elif answer.ok:
                queued.future.set_result(answer.value)
            elif isinstance(answer.value, BaseException):
                queued.future.set_exception(answer.value)
            else:
                queued.future.set_exception(errors.RunControlError(str(answer.value)))
        self._acks.difference_update(sent.up.acks)
        self._uncertain.difference_update(c.claim_id for c in sent.up.credits)
        for grant in down.grants:
            self._acks.add(grant.claim_id)
            if grant.claim_id in self._delivered:
                continue  # a grant is resent until acked: worked once
            self._delivered.add(grant.claim_id)
            self.credits.pop(grant.claim_id, None)
            self._withdrawing.pop(grant.claim_id, None)
            self._withdraw_when_answered.discard(grant.claim_id)
            self._uncertain.discard(grant.claim_id)
            # also a credit given up already: the worker decides (a late grant is worked)
            self.listener.granted(self.host, grant)
        if down.grants:
            self._kick.set()  # ack them
        for claim_id, (credit, seq) in list(self._withdrawing.items()):
            if sent.seq > seq:
                del self._withdrawing[claim_id]
                self.listener.withdrawn(self.host, credit)
        for claim_id in list(self._withdraw_when_answered):
            if claim_id not in self._uncertain:
                self._withdraw_when_answered.discard(claim_id)
                self.withdraw(claim_id)
        if self._closing_seq is not None:
            if sent.seq > self._closing_seq and not self.credits and not self._withdrawing:
                self._done = not self._acks
        if down.cancels:
            self.listener.cancelled(self.host, list(down.cancels))
        self.backlog = dict(down.backlog)
        self.listener.answered(self.host, down)
