"""A run host's side of the worker sessions (docs/sessions.md): the exchanges.

``HostSessions`` answers each exchange (``RunHost.exchange_packed`` hands it over), keeps what the
sessions need beyond the book: the newest ``seq`` and the number of exchanges seen per session
(a late exchange, a superseded one), the events of the exchanges waiting now, the leases being
made for matches (a grant task, or a fused grant's commit) per attempt and per session, and
the sweep for the attempts no commit of this host gave its book. The matching is the book's
(``runcontrol.workers.book``, pure), what a grant carries is ``runcontrol.workers.grants``'s;
this waits and leases, through the host's run mailboxes (``Mailboxes``).

No Ray: it runs on the host's event loop, and is usable (and tested) without one.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any, Protocol, TypeVar
from uuid import UUID

from ..clock import Clock
from ..commands import AcquireLease, Command, HandBackAttempt
from ..domain import Event, LeaseGrant, Options, RunAggregate, errors
from ..drain import Drain
from ..store import queries as q
from ..store.database import Database
from . import grants
from .book import CreditBook, Match, Offer, view
from .claims import Read, claimed
from .protocol import MAX_WAIT_S, Answer, Credit, Grant, SessionDown, SessionUp

log = logging.getLogger(__name__)
T = TypeVar("T")

# A session that has not exchanged for this long is gone (its worker died): its credits are
# withdrawn and the grants it never acknowledged handed back (``HostSessions.end``).
SESSION_TTL_S = MAX_WAIT_S + 30.0
# A live worker keeps an exchange in flight with every host (the SDK sends the next one as soon
# as an answer comes down): a session with none for this long after its last answer is gone
# (issue 34: a killed worker's slots were granted work for SESSION_TTL_S, each grant then
# waiting out a whole lease).
EXCHANGE_DEADLINE_S = 5.0
# The session sweep takes attempts of runs placed on other hosts only once they have waited
# this long (their own host serves them sooner; this is for a host restarted or drained).
FOREIGN_AFTER_S = 5.0
# ... and its own runs' attempts once they are this old (younger ones its book already has).
OWN_AFTER_S = 0.5
# An exchange answers once the leases it started are made (one commit each), at most this long.
GRANT_WAIT_S = 0.5
# An exchange waits at most this long for the lease of a credit it withdrew.
WITHDRAWN_WAIT_S = 10.0


class Mailboxes(Protocol):
    """The host's runs, each command in its run's mailbox (``actors.run_host.RunHost``)."""

    async def command(self, command: Command[T]) -> T:
        """A command as if sent alone (refused while the host drains)."""
        ...

    async def command_batch(self, commands: list[Command[Any]]) -> list[tuple[bool, Any]]:
        """Each command's ``(ok, answer or error)`` as if sent alone; the host decides several
        of one run in one turn and commits them as one document (``RunHost.command_batch``).
        By default each alone, all at once."""

        async def one(command: Command[Any]) -> tuple[bool, Any]:
            try:
                return True, await self.command(command)
            except Exception as exc:  # noqa: BLE001 - the command's answer
                return False, exc

        return list(await asyncio.gather(*map(one, commands)))

    async def lease(self, command: AcquireLease) -> tuple[LeaseGrant, RunAggregate]:
        """The lease made in the run's mailbox, and the run as committed then."""
        ...

    async def committed(self, tenant_id: str, run_id: UUID) -> RunAggregate:
        """The run as committed, read in its mailbox (its cached rows)."""
        ...


class HostSessions:
    def __init__(
        self,
        *,
        book: CreditBook,
        runs: Mailboxes,
        drain: Drain,
        db: Database,
        read: Read,
        clock: Clock,
        options: Options,
        hosts: int,
        sweep_interval: float,
        own: Callable[[UUID], bool],
    ) -> None:
        """``hosts``: the run hosts there are; ``own(run_id)``: the run is placed on this
        host (the sweep takes other hosts' attempts later)."""
        self.book = book
        self._runs = runs
        self._drain = drain
        self._db = db
        self._read = read
        self._clock = clock
        self._options = options
        self._hosts = hosts
        self._sweep_interval = sweep_interval
        self._own = own
        self.exchanges = 0
        self.late_exchanges = 0  # arrived after a newer one of their session: credits ignored
        # session -> the events of its exchanges waiting now, one each: a newer exchange's
        # wait must not clear the wake-up meant for the one it supersedes
        self._wakes: dict[str, set[asyncio.Event]] = {}
        self._generations: dict[str, int] = {}  # session -> exchanges seen (a newer supersedes)
        self._seqs: dict[str, int] = {}  # session -> the newest ``SessionUp.seq`` seen
        # attempt -> its lease being made (a grant task, or a fused grant's commit)
        self._granting: dict[UUID, asyncio.Future[None]] = {}
        self._session_granting: dict[str, set[asyncio.Future[None]]] = {}  # the same, by session
        self._sweep_now = asyncio.Event()
        self._open: dict[str, int] = {}  # session -> its exchanges being answered now
        self._answered: dict[str, float] = {}  # session -> when its last exchange was answered
        self.ended = 0  # sessions ended (their worker gone)

    # ------------------------------------------------------------------ exchanges

    async def exchange(self, up: SessionUp) -> SessionDown:
        """``_exchange``, counted open while it runs: a session with none open past
        ``EXCHANGE_DEADLINE_S`` after its last answer is ended (``expire``)."""
        sid = up.session_id
        self._open[sid] = self._open.get(sid, 0) + 1
        try:
            return await self._exchange(up)
        finally:
            self._open[sid] = self._open.get(sid, 1) - 1
            self._answered[sid] = time.monotonic()

    async def _exchange(self, up: SessionUp) -> SessionDown:
        """One exchange of a worker session (``runcontrol.workers.protocol``): its commands
        answered each as if sent alone, its credits offered (replacing the last set), its acks
        taken; then, with nothing to say yet, a wait of up to ``up.wait_s`` (at most
        ``MAX_WAIT_S``) for a grant or a cancel. A newer exchange of the session answers this
        one at once.

        An exchange older (``seq``) than the newest this host saw of its session arrived late
        (exchanges are not delivered in order): its commands and acks count, its credits do not
        (the newer one's replaced them, and may have withdrawn one it still carries), and it
        is answered at once without superseding the newer one."""
        sid = up.session_id
        self.exchanges += 1
        if up.seq < self._seqs.get(sid, 0):
            return await self._late_exchange(up)
        self._seqs[sid] = up.seq
        generation = self._generations.get(sid, 0) + 1
        self._generations[sid] = generation
        self.wake({sid})  # the exchange still waiting, if any, answers now
        self.book.ack(sid, up.acks)
        if self._drain.draining:
            return await self._drained_exchange(up)
        with self._drain.track():
            credits = await self._recover(sid, up.credits)
            matches, withdrawn = self.book.offer(sid, credits, time.monotonic())
            self._lease(matches)
            if self.book.waiting_credits():
                self._sweep_now.set()
            answers = await self._answers(up.commands)
            # A credit left out while its lease was being made: its grant comes down now. And
            # the leases this exchange's own credits and commands started (a report whose next
            # step went to the slot it freed) come down in this answer, not in the next.
            await self._granted(withdrawn)
            started = self._session_granting.get(sid)
            if started:
                await asyncio.wait(set(started), timeout=GRANT_WAIT_S)
        if not answers and not self.book.has_news(sid):
            await self._wait(sid, generation, min(max(up.wait_s, 0.0), MAX_WAIT_S))
        # a drain that began while it waited ends the wait: the worker moves its credits now
        return self._down(sid, answers, draining=self._drain.draining)

    def _down(self, sid: str, answers: list[Answer], *, draining: bool = False) -> SessionDown:
        self.book.take_backlog_news(sid)
        return SessionDown(
            answers=answers,
            grants=self.book.grants(sid),
            cancels=self.book.take_cancels(sid),
            backlog=self.book.backlog(),
            hosts=self._hosts,
            draining=draining,
        )

    async def _late_exchange(self, up: SessionUp) -> SessionDown:
        sid = up.session_id
        self.late_exchanges += 1
        self.book.ack(sid, up.acks)
        if self._drain.draining:
            return self._down(sid, self._refused(up), draining=True)
        with self._drain.track():
            answers = await self._answers(up.commands)
        return self._down(sid, answers)

    async def _drained_exchange(self, up: SessionUp) -> SessionDown:
        """A draining host takes no credit and refuses every command (the worker offers them
        to another host); the grants and cancels it still has come down."""
        sid = up.session_id
        _, withdrawn = self.book.offer(sid, (), time.monotonic())
        await self._granted(withdrawn)
        return self._down(sid, self._refused(up), draining=True)

    def _refused(self, up: SessionUp) -> list[Answer]:
        refuse = self._drain.refuse
        return [Answer(c.command_id, False, refuse(type(c).__name__)) for c in up.commands]

    async def _answers(self, commands: Sequence[Command[Any]]) -> list[Answer]:
        """The exchange's commands, each answered as if sent alone (a refusal answers that
        command, not the exchange); a run's several in one turn (``Mailboxes.command_batch``)."""
        if not commands:
            return []
        outcomes = await self._runs.command_batch(list(commands))
        return [
            Answer(command.command_id, ok, value)
            for command, (ok, value) in zip(commands, outcomes, strict=True)
        ]

    async def _recover(self, sid: str, credits: Sequence[Credit]) -> list[Credit]:
        """A credit resent after a lost exchange finds the lease it was granted by its claim id:
        in the book, or (this host restarted since) once in the store. Answers the credits
        still free."""
        free: list[Credit] = []
        for credit in credits:
            if not credit.resent or self.book.knows(sid, credit.claim_id):
                free.append(credit)
                continue
            try:
                found = await self._read(
                    claimed, self._db, credit.claim_id, credit.holder, credit.tenant_id
                )
            except errors.IdempotencyConflict:
                log.warning("a resent credit's claim id belongs to another holder: dropped")
                continue
            if found is None:
                free.append(credit)
            else:
                lease: LeaseGrant = found["grant"]
                agg = await self._runs.committed(found["tenant_id"], lease.run_id)
                # no deadline: the grant found again (docs/sessions.md, what the SDK relies on)
                self.book.recovered(sid, grants.grant(credit.claim_id, agg, lease, None))
        return free

    # ------------------------------------------------------------------ waiting

    async def _wait(self, sid: str, generation: int, wait_s: float) -> None:
        """Until news for the session, a newer exchange of it, a drain or ``wait_s``. The event
        is this exchange's own. One shared per session lost wake-ups: an exchange superseded
        before its wait had begun (``wait_for`` not yet waiting) saw the newer exchange's wait
        clear the event its wake-up had set, and sat out its whole wait (a worker's stop, or a
        credit's move, held for 20 s: one stop in two in tests/actors/test_session_waits.py)."""
        deadline = time.monotonic() + wait_s
        event = asyncio.Event()
        waiting = self._wakes.setdefault(sid, set())
        waiting.add(event)
        try:
            while self._generations.get(sid) == generation and not self._drain.draining:
                event.clear()
                remaining = deadline - time.monotonic()
                if self.book.has_news(sid) or remaining <= 0:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining)
        finally:
            waiting.discard(event)
            if not waiting and self._wakes.get(sid) is waiting:
                del self._wakes[sid]

    def wake(self, sessions: set[str]) -> None:
        for sid in sessions:
            for event in self._wakes.get(sid, ()):
                event.set()

    def wake_all(self) -> None:
        """Every waiting exchange answers now (the host drains)."""
        self.wake(set(self._wakes))

    def expire(self, now: float) -> None:
        """End the sessions gone: no exchange for ``SESSION_TTL_S``, or none in flight for
        ``EXCHANGE_DEADLINE_S`` after the last was answered."""
        missed = [
            sid
            for sid, at in self._answered.items()
            if not self._open.get(sid) and now - at > EXCHANGE_DEADLINE_S
        ]
        for session_id in {*self.book.expire(now - SESSION_TTL_S), *missed}:
            self.end(session_id)

    def end(self, session_id: str) -> None:
        """The session's worker is gone: nothing more is granted to its slots, and the leases
        it was granted but never acknowledged are handed back now (their attempts retried
        under their policy) instead of expiring unworked a lease later."""
        unacked = self.book.end(session_id)
        for state in (self._wakes, self._generations, self._seqs, self._open, self._answered):
            state.pop(session_id, None)
        self.ended += 1
        if unacked:
            log.warning("session %s ended: handing back %d grant(s)", session_id, len(unacked))
            asyncio.get_running_loop().create_task(self._hand_back(unacked))

    async def _hand_back(self, unacked: list[Grant]) -> None:
        async def one(grant: Grant) -> None:
            command = HandBackAttempt(**grant.fenced(), reason="the worker's session ended")
            try:
                await self._runs.command(command)
            except errors.RunControlError:
                pass  # settled meanwhile (its report came after all, or the lease expired)
            except Exception as exc:  # noqa: BLE001 - its lease expires as before
                log.warning("handing back a dead session's grant failed: %r", exc)

        await asyncio.gather(*map(one, unacked))

    # ------------------------------------------------------------------ leases

    def observe(self, agg: RunAggregate, events: Sequence[Event]) -> None:
        """Every commit of this host (a grain observer): the run's leasable attempts to the
        book (matched to a waiting credit at once), its cancels to the holders' sessions."""
        matches, woken = self.book.observe(view(agg, events))
        self._lease(matches)
        self.wake(woken)

    def _lease(self, matches: list[Match]) -> None:
        loop = asyncio.get_running_loop()
        for match in matches:
            self.track(match, loop.create_task(self._grant(match)))

    def track(self, match: Match, making: asyncio.Future[None]) -> None:
        """``making`` ends once the match's lease is made or refused (an exchange waits)."""
        attempt_id = match.offer.attempt_id
        self._granting[attempt_id] = making
        self._session_granting.setdefault(match.session_id, set()).add(making)
        making.add_done_callback(functools.partial(self._lease_done, attempt_id, match.session_id))

    def _lease_done(self, attempt_id: UUID, sid: str, task: asyncio.Future[None]) -> None:
        if self._granting.get(attempt_id) is task:
            del self._granting[attempt_id]
        tasks = self._session_granting.get(sid)
        if tasks is not None:
            tasks.discard(task)
            if not tasks:
                del self._session_granting[sid]

    async def _grant(self, match: Match) -> None:
        """Lease the match's attempt to its credit, through the run's mailbox, the lease's
        command id the credit's claim id (a lost answer is found again by it)."""
        try:
            if self._drain.draining:
                raise self._drain.refuse("a grant")
            with self._drain.track():
                lease, agg = await self._runs.lease(grants.lease_command(match))
                grant = grants.grant(match.credit.claim_id, agg, lease, self._options)
        except Exception as exc:  # noqa: BLE001 - refused or failed: the credit waits again
            if not isinstance(exc, errors.RunControlError):
                log.warning("a grant to a session failed: %r", exc)
            matches, woken = self.book.refused(match)
        else:
            _, matches, woken = self.book.granted(match, grant)
        self._lease(matches)
        self.wake(woken)

    def settled(self, matches: list[Match], woken: set[str]) -> None:
        """A fused grant went to its session or its credit back: what that matched, leased."""
        self._lease(matches)
        self.wake(woken)

    async def _granted(self, matches: list[Match]) -> None:
        tasks = [t for m in matches if (t := self._granting.get(m.offer.attempt_id)) is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=WITHDRAWN_WAIT_S)

    # ------------------------------------------------------------------ the sweep

    async def sweep(self) -> None:
        """The attempts no commit of this host gave its book (dispatched before it started, or
        by a host that no longer serves them): one read per sweep while credits wait, at the
        dispatch sweep's rate (and at once when credits first wait), never a read per claim."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sweep_now.wait(), self._sweep_interval)
            self._sweep_now.clear()
            if self._drain.draining or not self.book.waiting_credits():
                continue
            try:
                found = await self._read(self._leasable)
            except Exception:  # noqa: BLE001 - the next sweep tries again
                log.exception("the session sweep failed")
                continue
            matches, woken = self.book.found(found)
            self._lease(matches)
            self.wake(woken)
            await asyncio.sleep(self._sweep_interval)  # at most one sweep per interval

    def _leasable(self) -> list[Offer]:
        now = self._clock.now()
        foreign = now - timedelta(seconds=FOREIGN_AFTER_S)
        rows = []
        for each in self._db.databases():  # every shard's
            with each.system_tx() as conn:
                rows += q.leasable(conn, now - timedelta(seconds=OWN_AFTER_S))
        return [
            Offer(tenant, run_id, attempt_id, agent, at, priority)
            for tenant, run_id, attempt_id, agent, at, _input, priority in rows
            if at < foreign or self._own(run_id)
        ]


class FusedGrants:
    """The grains' ``Credits`` port on a run host (``runcontrol.workers.grants``): a dispatch
    takes a waiting credit from the book and leases its attempt in the same commit. The
    matching is the book's; this only wakes the sessions and lets an exchange wait for the
    commit (a credit withdrawn meanwhile is answered its grant, never offered twice)."""

    def __init__(self, sessions: HostSessions, drain: Drain) -> None:
        self._sessions = sessions
        self._drain = drain
        self._making: dict[UUID, asyncio.Future[None]] = {}

    def reserve(self, offer: Offer) -> Match | None:
        if self._drain.draining:
            return None
        match = self._sessions.book.reserve(offer)
        if match is not None:
            making: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._making[offer.attempt_id] = making
            self._sessions.track(match, making)
        return match

    def granted(self, match: Match, grant: Grant) -> None:
        _, matches, woken = self._sessions.book.granted(match, grant)
        self._settled(match, matches, woken)

    def refused(self, match: Match) -> None:
        matches, woken = self._sessions.book.refused(match)
        self._settled(match, matches, woken)

    def _settled(self, match: Match, matches: list[Match], woken: set[str]) -> None:
        making = self._making.pop(match.offer.attempt_id, None)
        if making is not None and not making.done():
            making.set_result(None)
        self._sessions.settled(matches, woken)
