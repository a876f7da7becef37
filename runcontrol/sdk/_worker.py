"""``Worker``: agent functions by agent id, and the one loop that runs them.

One loop per worker process: a session with each run host (``_host_session.HostSession``), the
process's slots as credits (``_slots.SlotBook``), and one task per leased attempt that
calls the agent function, renews the lease, stops the function on a cancel and reports its
outcome once.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar
from uuid import UUID

from ..clock import Clock, SystemClock
from ..commands import Command, RenewLease, ReportOutcome
from ..domain import AttemptOutcome, FailureClass, WorkerIdentity, canonical_hash, errors
from ..workers.protocol import Credit, Grant, SessionDown, SessionTransport
from ._backoff import Backoff
from ._errors import outcome_of
from ._host_session import HostSession
from ._slots import EXTRA, Placement, Slot, SlotBook
from ._step import AttemptContext, LeaseGone, LeaseLost, Parked, Step, SyncStep

log = logging.getLogger("runcontrol.sdk")
F = TypeVar("F", bound=Callable[..., Any])

# What one attempt ends as: (outcome, failure class, outcome hash), or None (nothing to report:
# parked for a human, or the lease is no longer ours).
# (outcome, failure class, outcome hash, the function's return value: the outcome's result)
_Result = tuple[AttemptOutcome, FailureClass | None, str | None, Any] | None


@dataclass(frozen=True, slots=True)
class Agent:
    """One agent function: ``async def f(step: Step)`` or ``def f(step: SyncStep)``."""

    agent_id: str
    fn: Callable[..., Any]
    is_async: bool


def default_holder(name: str) -> str:
    return f"{name}-{socket.gethostname()}-{os.getpid()}"


class Worker:
    """Agent functions by agent id, and how to run them.

    ``concurrency``: attempts run at once (the slots offered to the hosts as credits).
    ``wait_s``: how long an exchange may wait on a host with nothing to say.
    ``stop_timeout_s``: how long a cancelled function has to stop; then its attempt is
    reported ``Uncertain`` (it may still be acting) and its slot is freed.
    ``renew_every_s``: None renews each lease at a third of its remaining time.
    ``lease_grace_s``: a command unanswered past the lease's expiry plus this is given up
    (the reconciler re-dispatches the attempt)."""

    def __init__(
        self,
        name: str = "worker",
        *,
        concurrency: int = 8,
        wait_s: float = 20.0,
        probe_s: float = 2.0,
        stop_timeout_s: float = 10.0,
        renew_every_s: float | None = None,
        lease_grace_s: float = 35.0,
        backoff: Backoff | None = None,
        restart_backoff: Backoff | None = None,
        clock: Clock | None = None,
    ) -> None:
        if concurrency < 1:
            raise ValueError("a worker runs at least one attempt at a time")
        self.name = name
        self.concurrency = concurrency
        self.wait_s = wait_s
        self.probe_s = probe_s
        self.stop_timeout_s = stop_timeout_s
        self.renew_every_s = renew_every_s
        self.lease_grace = timedelta(seconds=lease_grace_s)
        self.backoff = backoff or Backoff()
        self.restart_backoff = restart_backoff or Backoff(base_s=1.0, cap_s=30.0)
        self.clock = clock or SystemClock()
        self.completed = 0  # attempts this worker reported Succeeded
        self._agents: dict[str, Agent] = {}
        self._stop = asyncio.Event()

    # ------------------------------------------------------------------ declaring agents

    def agent(self, agent_id: str) -> Callable[[F], F]:
        """Register the decorated function as agent ``agent_id``'s: ``async def f(step)``
        runs on the worker's loop, a plain ``def f(step)`` in a thread of its own."""
        if not agent_id:
            raise ValueError("an agent needs an id")

        def register(fn: F) -> F:
            if agent_id in self._agents:
                raise ValueError(f"agent {agent_id!r} is registered twice")
            if not callable(fn):
                raise TypeError(f"agent {agent_id!r}: {fn!r} is not callable")
            self._agents[agent_id] = Agent(agent_id, fn, inspect.iscoroutinefunction(fn))
            return fn

        return register

    @property
    def agents(self) -> Mapping[str, Agent]:
        return dict(self._agents)

    def only(self, agent_ids: list[str]) -> Worker:
        """A copy of this worker serving only these of its agents (``--agents``)."""
        unknown = sorted(set(agent_ids) - set(self._agents))
        if unknown:
            raise ValueError(f"no agent {', '.join(map(repr, unknown))} in worker {self.name!r}")
        copy = Worker.__new__(Worker)
        copy.__dict__.update(self.__dict__)
        copy._agents = {a: self._agents[a] for a in agent_ids}
        copy._stop = asyncio.Event()
        copy.completed = 0
        return copy

    # ------------------------------------------------------------------ running

    def stop(self) -> None:
        """Stop taking attempts; ``run`` returns once those in hand have reported (for good:
        a stopped worker does not run again)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    async def run(
        self,
        transport: SessionTransport,
        holder: str | WorkerIdentity | None = None,
        *,
        concurrency: int | None = None,
    ) -> None:
        """Work until ``stop()``: one session with each run host, ``concurrency`` slots."""
        if not self._agents:
            raise ValueError(f"worker {self.name!r} has no agents")
        await _Loop(self, transport, holder or default_holder(self.name), concurrency).main()

    async def run_supervised(
        self,
        transport: SessionTransport,
        holder: str | WorkerIdentity | None = None,
        *,
        concurrency: int | None = None,
    ) -> None:
        """``run()`` until stopped, restarting it after a short backoff should it die."""
        failures = 0
        while not self._stop.is_set():
            try:
                await self.run(transport, holder, concurrency=concurrency)
            except Exception:
                failures += 1
                delay = self.restart_backoff.delay(failures)
                log.exception("worker %s died; restarting in %.1fs", self.name, delay)
            else:
                if self._stop.is_set():
                    return
                failures += 1
                delay = self.restart_backoff.delay(failures)
                log.error("worker %s left its loop unasked; restarting in %.1fs", self.name, delay)
            await self._pause(delay, self.restart_backoff)

    async def _pause(self, seconds: float, backoff: Backoff) -> None:
        """Sleep ``seconds`` (through the backoff's sleep), cut short by ``stop()``."""
        stopping = asyncio.ensure_future(self._stop.wait())
        sleeping = asyncio.ensure_future(backoff.sleep(seconds))
        try:
            await asyncio.wait({sleeping, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            sleeping.cancel()


def slot_holders(holder: str | WorkerIdentity, concurrency: int) -> list[str]:
    """Who each slot leases as: each slot holds its own leases, an authenticated worker's
    slots are instances of its identity (``subject/instance.k``)."""
    if concurrency == 1:
        return [holder.holder if isinstance(holder, WorkerIdentity) else holder]
    if isinstance(holder, WorkerIdentity):
        return [
            dataclasses.replace(holder, instance_id=f"{holder.instance_id}.{k}").holder
            for k in range(concurrency)
        ]
    return [f"{holder}/{k}" for k in range(concurrency)]


class _Loop:
    """One run of a worker: its sessions, its slots and its attempts in hand."""

    def __init__(
        self,
        worker: Worker,
        transport: SessionTransport,
        holder: str | WorkerIdentity,
        concurrency: int | None,
    ) -> None:
        self.worker = worker
        self.transport = transport
        self.holder = holder
        self.concurrency = concurrency or worker.concurrency
        self.session_id = str(uuid.uuid4())
        self.sessions: list[HostSession] = []
        self.session_tasks: list[asyncio.Task[None]] = []
        self.attempts: dict[UUID, AttemptContext] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.changed = asyncio.Event()
        self.book: SlotBook

    async def main(self) -> None:
        hosts = await self.transport.hosts()
        tenant = self.holder.tenant_id if isinstance(self.holder, WorkerIdentity) else None
        self.book = SlotBook(
            hosts,
            slot_holders(self.holder, self.concurrency),
            tuple(self.worker._agents),
            tenant,
        )
        try:
            self._grow(hosts)
            for slot in self.book.slots:
                self._offer(self.book.free(slot))
            stopping = asyncio.ensure_future(self.worker._stop.wait())
            try:
                await asyncio.wait(
                    {stopping, *self.session_tasks}, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                stopping.cancel()
            for task in self.session_tasks:
                if task.done():  # a session ends only when closed: this is a bug, restart
                    raise RuntimeError(f"{task.get_name()} ended") from task.exception()
            await self._drain()
        finally:
            for task in [*self.tasks, *self.session_tasks]:
                task.cancel()
            for task in [*self.tasks, *self.session_tasks]:
                with contextlib.suppress(BaseException):
                    await task

    async def _drain(self) -> None:
        """Stop offering slots; work what the hosts granted meanwhile (a credit in flight
        may be granted: its lease would expire unworked otherwise), then end the sessions."""
        for move in self.book.stop():
            self.sessions[move.source].withdraw(move.claim_id)
        while not self.book.settled() or self.tasks:
            self.changed.clear()
            await self.changed.wait()
        for session in self.sessions:
            session.close()
        await asyncio.gather(*(s.closed() for s in self.sessions))

    def _grow(self, hosts: int) -> None:
        self.book.grow(hosts)
        while len(self.sessions) < hosts:
            session = HostSession(
                self.transport,
                len(self.sessions),
                self.session_id,
                self,
                wait_s=self.worker.wait_s,
                probe_s=self.worker.probe_s,
                backoff=self.worker.backoff,
                probing=lambda: self.book.idle() > 0,
            )
            self.sessions.append(session)
            self.session_tasks.append(
                asyncio.create_task(session.run(), name=f"session host {session.host}")
            )

    def _offer(self, offer: Placement | None) -> None:
        if offer is not None:
            self.sessions[offer.host].offer(offer.credit)
        self.changed.set()

    # ------------------------------------------------------------------ SessionListener

    def granted(self, host: int, grant: Grant) -> None:
        slot = self.book.granted(grant.claim_id, host)
        if slot is None:
            log.warning(
                "a grant for claim %s this worker never offered; not worked", grant.claim_id
            )
            return
        if slot.index == EXTRA:
            log.info("a late grant of claim %s, worked beyond the slots", grant.claim_id)
        task = asyncio.create_task(self._work(slot, host, grant))
        self.tasks.add(task)
        task.add_done_callback(self._ended)
        self.changed.set()

    def _ended(self, task: asyncio.Task[None]) -> None:
        self.tasks.discard(task)
        self.changed.set()
        if not task.cancelled() and task.exception() is not None:
            log.error("an attempt's task failed", exc_info=task.exception())

    def cancelled(self, host: int, attempt_ids: list[Any]) -> None:
        for attempt_id in attempt_ids:
            attempt = self.attempts.get(attempt_id)
            if attempt is not None:
                attempt.request_stop("the run is being cancelled")

    def answered(self, host: int, down: SessionDown) -> None:
        if down.hosts > len(self.sessions):
            self._grow(down.hosts)
        self.book.observe(host, down.backlog, down.draining)
        for move in self.book.rebalance():
            self.sessions[move.source].withdraw(move.claim_id)

    def withdrawn(self, host: int, credit: Credit) -> None:
        self._offer(self.book.withdrawn(credit.claim_id))

    # ------------------------------------------------------------------ one attempt

    async def _work(self, slot: Slot, host: int, grant: Grant) -> None:
        lease = grant.lease
        route = _Route(host)

        async def send_once(command: Command[Any]) -> Any:
            k = route.host
            try:
                return await self.sessions[k].send(command)
            except errors.Draining:
                # The host did nothing with it: the next host of the ring serves the run
                # while this one drains (its leases live in the database).
                route.host = (k + 1) % len(self.sessions)
                raise

        attempt = AttemptContext(
            grant,
            send_once,
            clock=self.worker.clock,
            backoff=self.worker.backoff,
            lease_grace=self.worker.lease_grace,
            loop=asyncio.get_running_loop(),
        )
        self.attempts[lease.attempt_id] = attempt
        if lease.cancel_requested:
            attempt.request_stop("the run is being cancelled")
        renewing = asyncio.create_task(self._renew(attempt))
        freed = False
        try:
            agent = self.worker._agents[lease.agent_id]  # a credit names only these
            result = await self._execute(agent, attempt)
            renewing.cancel()
            # The slot's next credit rides with the report: the host may grant it the next
            # step in the same commit.
            self._offer(self.book.free(slot))
            freed = True
            if result is None:
                return
            await _flush_output(attempt)  # what was streamed is stored before the outcome
            outcome, failure_class, outcome_hash, value = result
            try:
                await attempt.send(
                    ReportOutcome(
                        **attempt.fenced(),
                        outcome=outcome,
                        failure_class=failure_class,
                        outcome_hash=outcome_hash,
                        result=value,
                    )
                )
            except errors.ResultTooLarge as refused:
                # Nothing was stored and the attempt is still open: settle it now, as Failed
                # (validation, not retried: a new attempt would return as much), rather than
                # leave it to its lease's expiry and the same refusal on every retry.
                log.error(
                    "attempt %s: its result was refused (%s): reporting it Failed (validation); "
                    "return a smaller result, or store it elsewhere and report a result_ref",
                    lease.attempt_id,
                    refused,
                )
                outcome = AttemptOutcome.FAILED
                await attempt.send(
                    ReportOutcome(
                        **attempt.fenced(),
                        outcome=outcome,
                        failure_class=FailureClass.VALIDATION,
                    )
                )
            if outcome is AttemptOutcome.SUCCEEDED:
                self.worker.completed += 1
        except LeaseGone as exc:
            log.warning("gave up on attempt %s: %s", lease.attempt_id, exc)
        except errors.RunControlError as exc:
            # Refused for good (lease gone, stale token, already settled): the run moved on.
            log.warning("attempt %s: refused: %s (%s)", lease.attempt_id, exc, exc.code)
        finally:
            renewing.cancel()
            attempt.output.close()
            with contextlib.suppress(BaseException):
                await renewing
            self.attempts.pop(lease.attempt_id, None)
            if not freed:
                self._offer(self.book.free(slot))

    async def _execute(self, agent: Agent, attempt: AttemptContext) -> _Result:
        """Call the function; a stop (cancel) interrupts it: ``CancelledError`` in an async
        function, the ``cancelled`` flag for a sync one, which then has the stop timeout."""
        body: asyncio.Future[Any]
        if agent.is_async:
            body = asyncio.ensure_future(agent.fn(Step(attempt)))
        else:
            body = _in_thread(agent.fn, SyncStep(attempt), attempt.lease.attempt_id)
        stopping = asyncio.ensure_future(attempt.stop.wait())
        try:
            await asyncio.wait({body, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not body.done():
                return await self._stopped(body, attempt, agent.is_async)
        finally:
            stopping.cancel()
        if not agent.is_async and attempt.stop.is_set():
            # A sync function that saw the flag ends as it likes: it stopped.
            return await self._stopped(body, attempt, agent.is_async)
        return self._settled(body, attempt)

    async def _stopped(
        self, body: asyncio.Future[Any], attempt: AttemptContext, is_async: bool
    ) -> _Result:
        """A stopped attempt reports ``Cancelled`` if its function ends within the stop
        timeout (however it ends), ``Uncertain`` if not: it may still be acting."""
        if is_async:
            body.cancel()
        # A thread cannot be interrupted: the function polls ``step.cancelled``.
        timeout = self.worker.stop_timeout_s
        done, _ = await asyncio.wait({body}, timeout=timeout)
        if not done:
            log.warning(
                "attempt %s did not stop within %.1fs of its cancel: reporting Uncertain",
                attempt.lease.attempt_id,
                timeout,
            )
            return AttemptOutcome.UNCERTAIN, FailureClass.UNCERTAIN, None, None
        if not body.cancelled() and isinstance(body.exception(), Parked | LeaseLost):
            return None
        return AttemptOutcome.CANCELLED, None, None, None

    def _settled(self, body: asyncio.Future[Any], attempt: AttemptContext) -> _Result:
        attempt_id = attempt.lease.attempt_id
        if body.cancelled():
            return AttemptOutcome.CANCELLED, None, None, None
        exc = body.exception()
        if isinstance(exc, Parked | LeaseLost):
            return None
        if isinstance(exc, LeaseGone):
            log.warning("gave up on attempt %s: %s", attempt_id, exc)
            return None
        if isinstance(exc, asyncio.CancelledError) and attempt.stop.is_set():
            return AttemptOutcome.CANCELLED, None, None, None
        if exc is not None:
            outcome, failure_class = outcome_of(exc)
            log.info("attempt %s: %s (%s): %r", attempt_id, outcome, failure_class, exc)
            return outcome, failure_class, None, None
        value = body.result()
        try:
            outcome_hash = canonical_hash(value)
        except Exception:
            log.exception("attempt %s: its result is not JSON", attempt_id)
            return AttemptOutcome.FAILED, FailureClass.PERMANENT, None, None
        # The return value is the step's result (the server stores it and checks the hash);
        # None is no result, as before results existed.
        return AttemptOutcome.SUCCEEDED, None, outcome_hash, value

    async def _renew(self, attempt: AttemptContext) -> None:
        while True:
            every = self.worker.renew_every_s
            if every is None:
                left = (attempt.expires_at - self.worker.clock.now()).total_seconds()
                # a third of what is left, and not faster than 4/s should the clocks disagree
                every = max(left / 3, 0.25)
            await asyncio.sleep(every)
            try:
                grant = await attempt.send(RenewLease(**attempt.fenced()))
            except LeaseGone as exc:
                log.warning("stopped renewing attempt %s: %s", attempt.lease.attempt_id, exc)
                return
            except errors.RunControlError as exc:
                attempt.request_stop(f"its renewal was refused: {exc}")
                return
            except Exception:
                log.exception("renewal of attempt %s failed", attempt.lease.attempt_id)
                return
            attempt.expires_at = max(attempt.expires_at, grant.expires_at)
            if grant.cancel_requested:
                attempt.request_stop("the run is being cancelled")


@dataclass
class _Route:
    """Which host an attempt's commands go to: the one that granted it, the next one of
    the ring while that one drains."""

    host: int


def _in_thread(
    fn: Callable[[SyncStep], Any], step: SyncStep, attempt_id: UUID
) -> asyncio.Future[Any]:
    """Run ``fn(step)`` in a daemon thread of its own: a function that never stops holds
    its thread, not one of a pool's (and not the process's exit)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if future.done():
            return
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

    def target() -> None:
        try:
            outcome: tuple[bool, Any] = (True, fn(step))
        except BaseException as exc:  # noqa: BLE001 - handed to the loop as the outcome
            outcome = (False, exc)
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=target, name=f"agent {attempt_id}", daemon=True).start()
    return future


async def _flush_output(attempt: AttemptContext) -> None:
    """Store what the function streamed before its outcome is reported. A stream that failed
    does not hold the report back: refused for good, the report is refused too; past the
    attempt's total, the chunks after it are lost and the outcome still counts."""
    try:
        await attempt.output.flush()
    except BaseException as exc:  # noqa: BLE001 - logged by the stream; the report decides
        if isinstance(exc, asyncio.CancelledError):
            raise
