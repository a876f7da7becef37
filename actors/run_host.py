"""RunHost: a named async Ray actor hosting many RunGrain activations (virtual actors).

Thin by design: it owns mailboxes (one asyncio.Lock per run, so one run's commands run strictly
in order while other runs interleave), activation and idle deactivation, and long-poll waiting.
Every rule lives in ``runcontrol``. Grains run on the host's event loop: their loads, port reads
and commits are awaited (``runcontrol.store.commit``), and the commits made at the same moment
share one statement (``GroupCommit``). The host's few remaining reads (claims, run views,
event pages) are synchronous queries run off the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, TypeVar
from uuid import UUID

import psycopg
import ray
from sqlalchemy import exc as sa_exc

from runcontrol.bootstrap import DATABASE_WAIT_S, build, build_database
from runcontrol.commands import AcquireLease, CancelRun, Command, new_command_id
from runcontrol.config import Settings
from runcontrol.domain import Event, LeaseGrant, RunAggregate, errors
from runcontrol.domain.run import RUN_CONTROL
from runcontrol.drain import Drain
from runcontrol.fairness import FairShare
from runcontrol.grain import RunGrain
from runcontrol.session import MAX_WAIT_S, Answer, Credit, Grant, SessionDown, SessionUp
from runcontrol.sessions import Match, Offer, SessionBook, view
from runcontrol.store import answers
from runcontrol.store import queries as q
from runcontrol.store.commit import CONFIG_CHANNEL, DISPATCH_CHANNEL, EVENTS_CHANNEL
from runcontrol.store.notify import Listener
from runcontrol.telemetry import Carrier, configure

from .metrics import HostMetrics, command_span
from .placement import HostRouter, get_or_create, host_index, host_name, pack_answers, unpack

log = logging.getLogger(__name__)
T = TypeVar("T")

HOST_OPTIONS: dict[str, Any] = {
    "num_cpus": 0,
    "max_restarts": -1,
    "max_task_retries": 0,  # the router retries, with idempotent or fenced commands
    "max_concurrency": 1000,
    "concurrency_groups": {"control": 8},
    "enable_task_events": False,  # Serve turns them off for its actors; ours cost per call
}

# A session that has not exchanged for this long is gone (its worker died): its credits are
# withdrawn (its grants' leases expire unworked, as any lease of a dead worker).
SESSION_TTL_S = MAX_WAIT_S + 30.0
# The session sweep takes attempts of runs placed on other hosts only once they have waited
# this long (their own host serves them sooner; this is for a host restarted or drained).
FOREIGN_AFTER_S = 5.0
# ... and its own runs' attempts once they are this old (younger ones its book already has).
OWN_AFTER_S = 0.5
# An exchange answers once the leases it started are made (one commit each), at most this long.
GRANT_WAIT_S = 0.5
# The claimers' and watchers' LISTEN connection closes once nobody waited on it for this long.
WATCH_IDLE_S = 30.0


def host_config(settings: Settings, owner_url: str) -> dict[str, Any]:
    return {"owner_url": owner_url, "settings": settings.model_dump(mode="json")}


def make_router(config: dict[str, Any]) -> HostRouter:
    settings = Settings.model_validate(config["settings"])
    return HostRouter(
        settings.grains.host_count,
        placement=settings.grains.placement,
        dedicated_factory=lambda name: get_or_create(
            name, RunHost, config, lifetime="detached", **HOST_OPTIONS
        ),
    )


@dataclass
class Activation:
    """One run's grain and its mailbox: ``lock`` is held by the command running, ``queued``
    counts the commands holding or waiting for it (``lock.locked()`` alone misses a waiter
    already woken but not yet running)."""

    grain: RunGrain
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    queued: int = 0

    @property
    def idle(self) -> bool:
        return self.queued == 0 and not self.lock.locked()

    @contextlib.asynccontextmanager
    async def mailbox(self) -> AsyncIterator[None]:
        """Hold the run's mailbox: its commands run one at a time, in arrival order."""
        self.queued += 1
        try:
            async with self.lock:
                self.last_used = time.monotonic()
                yield
        finally:
            self.queued -= 1
            self.last_used = time.monotonic()


class FusedGrants:
    """The grains' ``Credits`` port on a run host (``runcontrol.grain.env``): a dispatch takes
    a waiting credit from the session book and leases its attempt in the same commit. The
    matching is the book's; this only wakes the sessions and lets an exchange wait for the
    commit (a credit withdrawn meanwhile is answered its grant, never offered twice)."""

    def __init__(self, host: RunHost) -> None:
        self._host = host
        self._making: dict[UUID, asyncio.Future[None]] = {}

    def reserve(self, offer: Offer) -> Match | None:
        host = self._host
        if host._drain.draining:
            return None
        match = host._book.reserve(offer)
        if match is not None:
            making: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._making[offer.attempt_id] = making
            host._track(match, making)
        return match

    def granted(self, match: Match, lease: LeaseGrant, results: Mapping[str, Any]) -> None:
        _, matches, woken = self._host._book.granted(match, lease, results)
        self._settled(match, matches, woken)

    def refused(self, match: Match) -> None:
        matches, woken = self._host._book.refused(match)
        self._settled(match, matches, woken)

    def _settled(self, match: Match, matches: list[Match], woken: set[str]) -> None:
        making = self._making.pop(match.offer.attempt_id, None)
        if making is not None and not making.done():
            making.set_result(None)
        self._host._lease(matches)
        self._host._wake(woken)


class RunHost:
    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config
        self.settings = Settings.model_validate(config["settings"])
        configure(self.settings.telemetry, "host")
        db = build_database(
            self.settings,
            owner_url=config["owner_url"],
            migrate=False,
            require_compatible_schema=True,
            wait_s=DATABASE_WAIT_S,
        )
        # The policy/alias cache's LISTEN connection, always on (a change must evict at once).
        self._listener = Listener(db.system_url, (CONFIG_CHANNEL,))
        self._listener.start()
        # Unary long-poll claimers' and event watchers' own, open only while one waits:
        # sessions need neither, and every commit NOTIFYs both channels (issue 24).
        self._watch = Listener(
            db.system_url,
            (DISPATCH_CHANNEL, EVENTS_CHANNEL),
            application_name="runcontrol-watch",
            idle_s=WATCH_IDLE_S,
        )
        container = build(self.settings, db=db, migrate=False, listener=self._listener)
        self._db = db
        self._env = container.env
        self._store = container.store
        self._metrics = HostMetrics()
        self._env.observers.append(self._metrics.observe)
        self._activations: dict[UUID, Activation] = {}
        self._router = make_router(config)
        self._started = time.monotonic()
        self._commands = 0
        # Once draining, every new command and claim is refused (``errors.Draining``: the
        # router re-routes it to another host at once); those in flight finish (``drain``).
        self._drain = Drain(self.settings.drain.retry_after_seconds)
        self._reads = 0  # claims, run views, event pages: host calls that are not commands
        self._calls = 0  # actor calls served on the data path (batches, claims, reads, exchanges)
        self._exchanges = 0
        self._late_exchanges = 0  # arrived after a newer one of their session: credits ignored
        # attempt -> holder, while a claim on this host is leasing it
        self._acquiring: dict[UUID, str] = {}
        # The worker sessions (DESIGN 10): credits, the attempts this host's commits dispatch,
        # grants and cancels (``runcontrol.sessions``); the host waits and leases.
        # One fair share of this host's untenanted slots (its book's grants and its claims).
        flow = self.settings.flow
        self._fair = FairShare(flow.tenant_weights, flow.default_tenant_weight)
        self._book = SessionBook(self._fair)
        # session -> the events of its exchanges waiting now, one each: a newer exchange's
        # wait must not clear the wake-up meant for the one it supersedes
        self._wakes: dict[str, set[asyncio.Event]] = {}
        self._generations: dict[str, int] = {}  # session -> exchanges seen (a newer supersedes)
        self._seqs: dict[str, int] = {}  # session -> the newest ``SessionUp.seq`` seen
        # attempt -> its lease being made (a grant task, or a fused grant's commit)
        self._granting: dict[UUID, asyncio.Future[None]] = {}
        self._session_granting: dict[str, set[asyncio.Future[None]]] = {}  # the same, by session
        self._sweep_now = asyncio.Event()
        self._index = _own_index(self.settings.grains.host_count)
        self._env.observers.append(self._observe_sessions)
        self._env.credits = FusedGrants(self)
        self._env.cancel_runs = self._cancel_run
        self._cancels: set[asyncio.Future[Any]] = set()  # cancel-oldest's CancelRuns in flight
        loop = asyncio.get_running_loop()
        self._loop = loop  # the commands' and exchanges' loop (the control group has its own)
        self._reaper = loop.create_task(self._reap())
        self._sweeper = loop.create_task(self._sweep_sessions())

    def _cancel_run(self, tenant_id: str, run_id: UUID, reason: str, wanted_by: UUID) -> None:
        """A holder displaced by a ``cancel-oldest`` limit (docs/flow-control.md): a CancelRun
        by the system principal through the router (the run may live on another host). Its id
        names the run asking, so a repeat is answered once."""
        command = CancelRun(
            tenant_id=tenant_id,
            run_id=run_id,
            command_id=f"flow-cancel:{wanted_by}:{run_id}",
            requested_by=RUN_CONTROL,
            reason=reason,
        )
        task = asyncio.get_running_loop().create_task(self._router.send(command))
        self._cancels.add(task)

        def done(t: asyncio.Future[Any]) -> None:
            self._cancels.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("cancel-oldest: CancelRun %s failed: %r", run_id, t.exception())

        task.add_done_callback(done)

    # ------------------------------------------------------------------ activations

    def _activation(self, tenant_id: str, run_id: UUID) -> Activation:
        act = self._activations.get(run_id)
        if act is None or act.grain.tenant_id != tenant_id:
            act = Activation(RunGrain(self._env, tenant_id, run_id))
            self._activations[run_id] = act
        return act

    async def _reap(self) -> None:
        idle = self.settings.grains.idle_seconds
        while True:
            await asyncio.sleep(max(idle / 4, 0.05))
            cutoff = time.monotonic() - idle
            for run_id, act in list(self._activations.items()):
                if act.last_used < cutoff and act.idle:
                    del self._activations[run_id]
            gone = self._book.expire(time.monotonic() - SESSION_TTL_S)
            for session_id in gone:
                self._wakes.pop(session_id, None)
                self._generations.pop(session_id, None)
                self._seqs.pop(session_id, None)

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """A synchronous read (claims, run views, event pages) off the loop. A read that met a
        pooled connection the database dropped (a restart) is retried once on a fresh one
        (the pool replaces the connections opened before the loss); then ``Unavailable``."""
        for retry in (True, False):
            try:
                return await asyncio.to_thread(fn, *args)
            except (sa_exc.OperationalError, psycopg.OperationalError) as exc:
                if not retry:
                    raise errors.Unavailable("the database connection was lost") from exc
                log.warning("a read met a lost database connection (%r); retrying", exc)
        raise AssertionError("unreachable")

    async def command(self, command: Command[T], carrier: Carrier | None = None) -> T:
        """Run one grain command in the run's mailbox (strictly in order per run); its span
        is the child of the span that sent it when ``carrier`` holds that span's context."""
        self._drain.check(f"{type(command).__name__} for run {command.run_id}")
        run_id = command.run_id
        act = self._activation(command.tenant_id, run_id)
        with self._drain.track():
            return await self._in_mailbox(act, command, carrier)

    async def _in_mailbox(
        self, act: Activation, command: Command[T], carrier: Carrier | None = None
    ) -> T:
        run_id = command.run_id
        async with act.mailbox():
            self._commands += 1
            try:
                with command_span(command, carrier) as span:
                    result = await act.grain.execute(command)
                    step_id = getattr(result, "step_id", None)
                    if step_id is not None:
                        span.set_attribute("step.id", str(step_id))
                return result
            finally:
                if not act.grain.active and self._activations.get(run_id) is act:
                    del self._activations[run_id]  # terminal: nothing left to serialise

    async def command_batch(
        self, items: list[Command[Any]], carriers: list[Carrier | None] | None = None
    ) -> list[tuple[bool, Any]]:
        """Several commands in one actor call (``HostRouter.send`` batches them), each
        answered ``(ok, result or error)`` as if sent alone: one run's commands in the order
        listed (across batches, no order: DESIGN 9.6). They all start in this turn of the
        loop, each in its run's mailbox, so the commits they reach together share one
        statement (``GroupCommit``). ``carriers`` (tracing on): each item's trace context."""

        async def one(item: Command[Any], carrier: Carrier | None) -> tuple[bool, Any]:
            try:
                return True, await self.command(item, carrier)
            except Exception as exc:  # noqa: BLE001 - answered to its caller, not raised here
                return False, exc

        contexts = carriers or [None] * len(items)
        return list(await asyncio.gather(*map(one, items, contexts)))

    async def command_batch_packed(
        self, payload: bytes, carriers: list[Carrier | None] | None = None
    ) -> bytes:
        """``command_batch`` as the router sends it: items and answers each one pickle."""
        self._calls += 1
        return pack_answers(await self.command_batch(unpack(payload), carriers))

    # ------------------------------------------------------------------ worker sessions

    async def exchange(self, up: SessionUp) -> SessionDown:
        """One exchange of a worker session (``runcontrol.session``): its commands answered
        each as if sent alone, its credits offered (replacing the last set), its acks taken;
        then, with nothing to say yet, a wait of up to ``up.wait_s`` (at most ``MAX_WAIT_S``)
        for a grant or a cancel. A newer exchange of the session answers this one at once.

        An exchange older (``seq``) than the newest this host saw of its session arrived late
        (exchanges are not delivered in order): its commands and acks count, its credits do not
        (the newer one's replaced them, and may have withdrawn one it still carries), and it
        is answered at once without superseding the newer one."""
        sid = up.session_id
        self._calls += 1
        self._exchanges += 1
        if up.seq < self._seqs.get(sid, 0):
            return await self._late_exchange(up)
        self._seqs[sid] = up.seq
        generation = self._generations.get(sid, 0) + 1
        self._generations[sid] = generation
        self._wake({sid})  # the exchange still waiting, if any, answers now
        self._book.ack(sid, up.acks)
        if self._drain.draining:
            return await self._drained_exchange(up)
        with self._drain.track():
            credits = await self._recover(sid, up.credits)
            matches, withdrawn = self._book.offer(sid, credits, time.monotonic())
            self._lease(matches)
            if self._book.waiting_credits():
                self._sweep_now.set()
            answers = await asyncio.gather(*map(self._answer, up.commands))
            # A credit left out while its lease was being made: its grant comes down now. And
            # the leases this exchange's own credits and commands started (a report whose next
            # step went to the slot it freed) come down in this answer, not in the next.
            await self._granted(withdrawn)
            started = self._session_granting.get(sid)
            if started:
                await asyncio.wait(set(started), timeout=GRANT_WAIT_S)
        if not answers and not self._book.has_news(sid):
            await self._wait(sid, generation, min(max(up.wait_s, 0.0), MAX_WAIT_S))
        # a drain that began while it waited ends the wait: the worker moves its credits now
        return self._down(sid, answers, draining=self._drain.draining)

    def _down(self, sid: str, answers: list[Answer], *, draining: bool = False) -> SessionDown:
        self._book.take_backlog_news(sid)
        return SessionDown(
            answers=answers,
            grants=self._book.grants(sid),
            cancels=self._book.take_cancels(sid),
            backlog=self._book.backlog(),
            hosts=self.settings.grains.host_count,
            draining=draining,
        )

    async def _late_exchange(self, up: SessionUp) -> SessionDown:
        sid = up.session_id
        self._late_exchanges += 1
        self._book.ack(sid, up.acks)
        if self._drain.draining:
            answers = [
                Answer(c.command_id, False, self._drain.refuse(type(c).__name__))
                for c in up.commands
            ]
            return self._down(sid, answers, draining=True)
        with self._drain.track():
            answers = await asyncio.gather(*map(self._answer, up.commands))
        return self._down(sid, answers)

    async def _drained_exchange(self, up: SessionUp) -> SessionDown:
        """A draining host takes no credit and refuses every command (the worker offers them
        to another host); the grants and cancels it still has come down."""
        sid = up.session_id
        _, withdrawn = self._book.offer(sid, (), time.monotonic())
        await self._granted(withdrawn)
        answers = [
            Answer(c.command_id, False, self._drain.refuse(type(c).__name__)) for c in up.commands
        ]
        return self._down(sid, answers, draining=True)

    async def _answer(self, command: Command[Any]) -> Answer:
        try:
            return Answer(command.command_id, True, await self.command(command))
        except Exception as exc:  # noqa: BLE001 - the command's answer, not the exchange's
            return Answer(command.command_id, False, exc)

    async def _recover(self, sid: str, credits: Sequence[Credit]) -> list[Credit]:
        """A credit resent after a lost exchange finds the lease it was granted by its claim id:
        in the book, or (this host restarted since) once in the store. Answers the credits
        still free."""
        free: list[Credit] = []
        for credit in credits:
            if not credit.resent or self._book.knows(sid, credit.claim_id):
                free.append(credit)
                continue
            try:
                grant = await self._in_thread(self._claimed_grant, credit)
            except errors.IdempotencyConflict:
                log.warning("a resent credit's claim id belongs to another holder: dropped")
                continue
            if grant is None:
                free.append(credit)
            else:
                act = self._activation(grant.tenant_id, grant.lease.run_id)
                results = await self._grant_results(act, grant.lease.attempt_id)
                grant = dataclasses.replace(grant, results=results)
                self._book.recovered(sid, credit.claim_id, grant)
        return free

    def _claimed_grant(self, credit: Credit) -> Grant | None:
        found = self._claimed(credit.claim_id, credit.holder, credit.tenant_id)
        if found is None:
            return None
        return Grant(credit.claim_id, found["tenant_id"], found["grant"], found["input"])

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
                if self._book.has_news(sid) or remaining <= 0:
                    return
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(event.wait(), remaining)
        finally:
            waiting.discard(event)
            if not waiting and self._wakes.get(sid) is waiting:
                del self._wakes[sid]

    def _wake(self, sessions: set[str]) -> None:
        for sid in sessions:
            for event in self._wakes.get(sid, ()):
                event.set()

    def _observe_sessions(self, agg: RunAggregate, events: Sequence[Event]) -> None:
        """Every commit of this host: the run's leasable attempts to the book (matched to a
        waiting credit at once), its cancels to the holders' sessions."""
        matches, woken = self._book.observe(view(agg, events, self._env.options))
        self._lease(matches)
        self._wake(woken)

    def _lease(self, matches: list[Match]) -> None:
        loop = asyncio.get_running_loop()
        for match in matches:
            self._track(match, loop.create_task(self._grant(match)))

    def _track(self, match: Match, making: asyncio.Future[None]) -> None:
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
        offer, credit = match.offer, match.credit
        command = AcquireLease(
            tenant_id=offer.tenant_id,
            run_id=offer.run_id,
            attempt_id=offer.attempt_id,
            holder=credit.holder,
            command_id=credit.claim_id,
        )
        try:
            if self._drain.draining:
                raise self._drain.refuse("a grant")
            with self._drain.track():
                act = self._activation(offer.tenant_id, offer.run_id)
                lease = await self._in_mailbox(act, command)
                results = await self._grant_results(act, lease.attempt_id)
        except Exception as exc:  # noqa: BLE001 - refused or failed: the credit waits again
            if not isinstance(exc, errors.RunControlError):
                log.warning("a grant to a session failed: %r", exc)
            matches, woken = self._book.refused(match)
        else:
            _, matches, woken = self._book.granted(match, lease, results)
        self._lease(matches)
        self._wake(woken)

    async def _grant_results(self, act: Activation, attempt_id: UUID) -> dict[str, Any]:
        """What the attempt's grant carries of its dependencies' results: from the run's cached
        rows, read in its mailbox (no read of the store while the activation holds them)."""
        async with act.mailbox():
            return (await act.grain.load_cached()).grant_results(attempt_id)

    async def grant_results(self, tenant_id: str, run_id: UUID, attempt_id: UUID) -> dict[str, Any]:
        """The dependencies' results a unary claim's lease of ``attempt_id`` carries, asked
        of the run's own host (a claim may be served by another): from the run's cached rows,
        as a session's grant carries them."""
        self._calls += 1
        return await self._grant_results(self._activation(tenant_id, run_id), attempt_id)

    async def _granted(self, matches: list[Match]) -> None:
        tasks = [t for m in matches if (t := self._granting.get(m.offer.attempt_id)) is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=10.0)

    async def _sweep_sessions(self) -> None:
        """The attempts no commit of this host gave its book (dispatched before it started, or
        by a host that no longer serves them): one read per sweep while credits wait, at the
        dispatch sweep's rate (and at once when credits first wait), never a read per claim."""
        interval = self.settings.scheduler.dispatch_sweep_interval
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sweep_now.wait(), interval)
            self._sweep_now.clear()
            if self._drain.draining or not self._book.waiting_credits():
                continue
            try:
                found = await self._in_thread(self._leasable)
            except Exception:  # noqa: BLE001 - the next sweep tries again
                log.exception("the session sweep failed")
                continue
            matches, woken = self._book.found(found)
            self._lease(matches)
            self._wake(woken)
            await asyncio.sleep(interval)  # at most one sweep per interval

    def _leasable(self) -> list[Offer]:
        now = self._env.clock.now()
        foreign = now - timedelta(seconds=FOREIGN_AFTER_S)
        with self._db.system_tx() as conn:
            rows = q.leasable(conn, now - timedelta(seconds=OWN_AFTER_S))
        count = self.settings.grains.host_count
        return [
            Offer(tenant, run_id, attempt_id, agent, at, input, priority)
            for tenant, run_id, attempt_id, agent, at, input, priority in rows
            if at < foreign or self._index is None or host_index(run_id, count) == self._index
        ]

    # ------------------------------------------------------------------ claims

    async def claim(
        self,
        agent_ids: list[str],
        holder: str,
        timeout_s: float = 30.0,
        tenant_id: str | None = None,
        claim_id: str | None = None,
    ) -> dict[str, Any] | None:
        """Pull the oldest dispatched attempt for these agents and lease it (long-poll);
        with ``tenant_id``, only that tenant's (read under its row-level security).

        ``claim_id`` is the claim's request id, made once by the worker and resent until
        answered; it is the command id of the claim's ``AcquireLease``. A resend whose first
        send was granted a lease (its answer lost: this host died after the commit) gets that
        lease back, while it is current, instead of leaving it to expire unworked. The run's
        input is read before the grant, so no failing read can strand a granted lease.

        A draining host refuses a new claim and ends a long poll with None (at its next
        wake-up, within 2 s); a claim granting a lease finishes first (the drain waits for it:
        a grant whose answer is lost leaves an attempt nobody works until its lease expires)."""
        self._drain.check("a claim")
        self._reads += 1
        self._calls += 1
        with self._drain.track():
            return await self._claim(
                agent_ids, holder, timeout_s, tenant_id, claim_id or new_command_id()
            )

    async def _claim(
        self,
        agent_ids: list[str],
        holder: str,
        timeout_s: float,
        tenant_id: str | None,
        claim_id: str,
    ) -> dict[str, Any] | None:
        deadline = time.monotonic() + max(timeout_s, 0.0)
        payloads = tuple(agent_ids)
        held = await self._in_thread(self._claimed, claim_id, holder, tenant_id)
        if held is not None:
            held["results"] = await self._claim_results(held["tenant_id"], held["grant"])
            return held
        while not self._drain.draining:
            since = self._watch.generation(DISPATCH_CHANNEL, payloads)
            candidates = await self._in_thread(self._claimable, agent_ids, tenant_id)
            for run_tenant, run_id, attempt_id in candidates:
                if self._acquiring.get(attempt_id, holder) != holder:
                    # Another holder's claim on this host is leasing it (one NOTIFY wakes them
                    # all): it would only be refused, and each refusal reloads the run. The
                    # same holder's claim (a retry) goes on: it is answered the same lease.
                    continue
                self._acquiring[attempt_id] = holder
                try:
                    input = await self._in_thread(self._run_input, run_tenant, run_id)
                    grant: LeaseGrant = await self._router.send(
                        AcquireLease(
                            tenant_id=run_tenant,
                            run_id=run_id,
                            attempt_id=attempt_id,
                            holder=holder,
                            command_id=claim_id,
                        )
                    )
                except (errors.LeaseHeld, errors.LeaseRejected, errors.IdempotencyConflict):
                    # Another worker won it, or the run moved on (nothing stored); or this
                    # claim was granted a lease of this run before, since gone: a claim with
                    # a new id takes the attempt.
                    continue
                finally:
                    if self._acquiring.get(attempt_id) == holder:
                        del self._acquiring[attempt_id]
                if tenant_id is None:
                    self._fair.charge(run_tenant)
                results = await self._claim_results(run_tenant, grant)
                return {"grant": grant, "tenant_id": run_tenant, "input": input, "results": results}
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await self._watch.wait(DISPATCH_CHANNEL, payloads, since, min(remaining, 2.0))
        return None

    async def _claim_results(self, tenant_id: str, grant: LeaseGrant) -> dict[str, Any]:
        """The claimed attempt's dependencies' results, from the run's host. Its failure fails
        the claim (a step never runs without its inputs); the lease stands, and the worker's
        resend of the claim (same claim id) is answered that lease and asks again."""
        found: dict[str, Any] = await self._router.call(
            grant.run_id, "grant_results", tenant_id, grant.run_id, grant.attempt_id
        )
        return found

    def _claimable(
        self, agent_ids: list[str], tenant_id: str | None
    ) -> list[tuple[str, UUID, UUID]]:
        """The attempts a claim tries, in turn: a tenant's claim its 8 oldest; an untenanted
        one each tenant's 8 oldest, the tenant whose fair-share turn it is first (ties by the
        oldest head), so a deep backlog of one tenant does not hide another's."""
        if tenant_id:
            with self._db.tenant(tenant_id) as conn:
                return q.claimable(conn, agent_ids, limit=8)
        with self._db.system_tx() as conn:
            found = q.claimable(conn, agent_ids, limit=32, per_tenant=8)
        heads: dict[str, int] = {}
        for position, (tenant, _, _) in enumerate(found):
            heads.setdefault(tenant, position)
        ranked = sorted(
            enumerate(found), key=lambda c: (self._fair.tag(c[1][0]), heads[c[1][0]], c[0])
        )
        return [candidate for _, candidate in ranked]

    def _claimed(self, claim_id: str, holder: str, tenant_id: str | None) -> dict[str, Any] | None:
        """The current lease claim ``claim_id`` was granted, as ``claim`` answers it."""
        scope = self._db.tenant(tenant_id) if tenant_id else self._db.system_tx()
        with scope as conn:
            found = q.claimed(conn, claim_id)
        if found is None:
            return None
        run_tenant, _, stored, input = found
        grant = answers.decode(stored)
        if not isinstance(grant, LeaseGrant) or grant.holder != holder:
            # Another holder's claim id: its lease is not this caller's to take.
            raise errors.IdempotencyConflict("this claim id was already used by another holder")
        return {"grant": grant, "tenant_id": run_tenant, "input": input}

    def _run_input(self, tenant_id: str, run_id: UUID) -> dict[str, Any] | None:
        with self._db.tenant(tenant_id) as conn:
            return q.run_input(conn, run_id)

    # ------------------------------------------------------------------ reads

    def _run_view(self, tenant_id: str, run_id: UUID) -> dict[str, Any] | None:
        with self._db.tenant(tenant_id) as conn:
            return q.get_run(conn, run_id)

    async def get_run(self, tenant_id: str, run_id: UUID) -> dict[str, Any] | None:
        self._reads += 1
        self._calls += 1
        return await self._in_thread(self._run_view, tenant_id, run_id)

    async def events(
        self, tenant_id: str, run_id: UUID, after_seq: int, wait_s: float = 0.0
    ) -> list[dict[str, Any]]:
        """Committed events after ``after_seq``; waits up to ``wait_s`` for new ones (a
        draining host refuses, and ends a wait at once: the caller asks another host)."""
        self._drain.check("a watch")
        self._reads += 1
        self._calls += 1
        deadline = time.monotonic() + max(wait_s, 0.0)
        key = (str(run_id),)
        while True:
            since = self._watch.generation(EVENTS_CHANNEL, key)

            def read() -> list[dict[str, Any]]:
                with self._db.tenant(tenant_id) as conn:
                    return q.events_after(conn, run_id, after_seq)

            found = await self._in_thread(read)
            remaining = deadline - time.monotonic()
            if found or remaining <= 0 or self._drain.draining:
                return found
            await self._watch.wait(EVENTS_CHANNEL, key, since, min(remaining, 2.0))

    # ------------------------------------------------------------------ health

    @ray.method(concurrency_group="control")
    async def ping(self) -> str:
        return "ok"

    @ray.method(concurrency_group="control")
    async def stats(self) -> dict[str, Any]:
        rss_kb = 0
        try:
            with open(f"/proc/{os.getpid()}/status", encoding="ascii") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        rss_kb = int(line.split()[1])
        except OSError:
            pass
        return {
            "pid": os.getpid(),
            "activations": len(self._activations),
            "commands": self._commands,
            "reads": self._reads,  # claim, get_run and events calls
            "calls": self._calls,  # command batches, claims, reads and exchanges served
            "exchanges": self._exchanges,
            "late_exchanges": self._late_exchanges,
            # commit statements sent (each a group: store/commit.py) and the documents in them
            "commit_groups": self._store.statements_sent,
            "commit_documents": self._store.documents_sent,
            "rss_bytes": rss_kb * 1024,
            "uptime_s": time.monotonic() - self._started,
            "in_flight": self._drain.in_flight,
            "draining": self._drain.draining,
        }

    @ray.method(concurrency_group="control")
    async def drain(self, grace_s: float | None = None) -> dict[str, Any]:
        """Stop taking commands and claims (each refused with ``errors.Draining``, which the
        router re-routes to another host at once), wait for those in flight to commit, at most
        ``grace_s`` (default ``drain.grace_seconds``), then release every grain. The runs'
        truth is in the database (leases included), so another host serves their next
        commands at once, with no wait for a lease to expire. The host stays up, refusing,
        until it is stopped or replaced (``resume`` calls the drain off)."""
        grace = self.settings.drain.grace_seconds if grace_s is None else grace_s
        self._drain.begin()
        # Waiting exchanges answer now, as draining. They wait on the command loop, in another
        # thread than this control group's: woken through that loop (an event set from here
        # woke none of them; they answered when their wait ran out).
        self._loop.call_soon_threadsafe(lambda: self._wake(set(self._wakes)))
        report = await self._drain.wait(grace)
        released = len(self._activations)
        self._activations.clear()
        if not report.idle:
            log.warning("drain: %d commands still in flight after %.1fs", report.in_flight, grace)
        return {**dataclasses.asdict(report), "released": released}

    @ray.method(concurrency_group="control")
    async def resume(self) -> None:
        self._drain.resume()

    @ray.method(concurrency_group="control")
    async def activation_bytes(self) -> dict[str, float]:
        """Deep size of the cached activations (Python objects reachable from them), so the
        memory per idle activation is measured directly instead of from noisy RSS deltas."""
        seen: set[int] = set()
        total = sum(_deep_size(act.grain, seen) for act in list(self._activations.values()))
        return {"activations": len(self._activations), "bytes": float(total)}

    @ray.method(concurrency_group="control")
    async def deactivate_all(self) -> int:
        n = len(self._activations)
        self._activations.clear()
        return n


_SHARED = (str, int, float, bool, type(None))


def _deep_size(obj: Any, seen: set[int]) -> int:
    """sys.getsizeof over everything an activation owns (not the shared environment)."""
    import sys

    if id(obj) in seen or isinstance(obj, type):
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, _SHARED):
        return size
    if isinstance(obj, dict):
        return size + sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in obj.items())
    if isinstance(obj, list | tuple | set | frozenset):
        return size + sum(_deep_size(item, seen) for item in obj)
    if isinstance(obj, RunGrain):
        return size + _deep_size(obj.agg, seen)  # the cached aggregate, not the shared env
    fields = getattr(obj, "__dict__", None)
    if fields is not None:
        size += _deep_size(fields, seen)
    for slot in getattr(type(obj), "__slots__", ()):
        size += _deep_size(getattr(obj, slot, None), seen)
    return size


def _own_index(host_count: int) -> int | None:
    """This host's index, from its actor name (None: a dedicated host, or outside Ray)."""
    try:
        name = ray.get_runtime_context().get_actor_name() or ""
    except Exception:  # noqa: BLE001 - not in an actor
        return None
    prefix = host_name(0)[:-1]
    if not name.startswith(prefix) or not name[len(prefix) :].isdigit():
        return None
    index = int(name[len(prefix) :])
    return index if index < host_count else None


def ensure_hosts(
    settings: Settings,
    owner_url: str,
    *,
    detached: bool = False,
    host_options: Callable[[int], dict[str, Any]] | None = None,
) -> list[Any]:
    """Create (or find) the configured host actors and wait until each answers.

    ``host_options(k)`` may add Ray options for host ``k`` (``resources``,
    ``scheduling_strategy``, ...), e.g. to place hosts on particular nodes; it may not
    repeat one of ``HOST_OPTIONS``.
    """
    config = host_config(settings, owner_url)
    options = dict(HOST_OPTIONS)
    if detached:
        options["lifetime"] = "detached"
    handles = [
        get_or_create(
            host_name(k), RunHost, config, **options, **(host_options(k) if host_options else {})
        )
        for k in range(settings.grains.host_count)
    ]
    ray.get([h.ping.remote() for h in handles])
    return handles
