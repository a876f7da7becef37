"""The reference runtime worker: claim, renew while working, ask for approval, report once.

Executors are pluggable by ``agentId``. An executor may offer ``propose(input)`` (what it is
about to do, hashed into the approval's ``proposalHash``) and must offer ``execute(input)``.
Raise ``TransientError`` for a failure worth retrying; any other exception is permanent.

A worker outlives the store's and the hosts' outages: a fenced command (report, approval
request, renewal) that meets a transient failure is resent as the *same* command, so its
``command_id`` makes a resend after an unknown outcome answer the stored result instead of
acting twice; the claim loop backs off and carries on after any failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Protocol, TypeVar
from uuid import UUID

from .client import Claim
from .clock import Clock, SystemClock
from .commands import Command, RenewLease, ReportOutcome, RequestApproval, new_command_id
from .domain import (
    ApprovalState,
    AttemptOutcome,
    FailureClass,
    SideEffectClass,
    WorkerIdentity,
    canonical_hash,
    errors,
)
from .domain.retry import backoff_delay

log = logging.getLogger(__name__)
R = TypeVar("R")


class TransientError(Exception):
    """An executor failure that a retry may fix."""


class WorkerClient(Protocol):
    """What a worker needs of Run Control: ``RunControlClient`` in the cluster (actor
    handles), ``runcontrol.rpc.GrpcWorkerClient`` anywhere else."""

    async def send(self, command: Command[R]) -> R: ...

    async def claim(
        self,
        agent_ids: list[str],
        holder: str | WorkerIdentity,
        timeout_s: float = 30.0,
        *,
        claim_id: str | None = None,
    ) -> Claim | None: ...

    def watch(
        self, tenant_id: str, run_id: UUID, after_seq: int = 0, *, wait_s: float = 20.0
    ) -> AsyncIterator[dict[str, Any]]: ...


class Executor(Protocol):
    async def propose(self, input: dict[str, Any] | None) -> dict[str, Any]: ...

    async def execute(self, input: dict[str, Any] | None) -> dict[str, Any]: ...


class EchoExecutor:
    """Does no work: proposes and returns a digest of its input (the demo's agents)."""

    def __init__(self, name: str, seconds: float = 0.5) -> None:
        self.name = name
        self.seconds = seconds

    async def propose(self, input: dict[str, Any] | None) -> dict[str, Any]:
        return {"agent": self.name, "action": "apply", "inputHash": canonical_hash(input or {})}

    async def execute(self, input: dict[str, Any] | None) -> dict[str, Any]:
        await asyncio.sleep(self.seconds)
        return {"agent": self.name, "inputHash": canonical_hash(input or {})}


@dataclass(frozen=True)
class Backoff:
    """Pauses between tries: exponential backoff with full jitter, capped (``domain.retry``)."""

    base_s: float = 0.2
    cap_s: float = 10.0
    uniform: Callable[[float, float], float] = random.uniform
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep

    def delay(self, failures: int) -> float:
        return backoff_delay(
            failures, base_seconds=self.base_s, cap_seconds=self.cap_s, uniform=self.uniform
        )


def transient(exc: BaseException) -> bool:
    """Whether sending the same command again may succeed (the error says so, or the
    connection failed and nobody knows whether the command ran)."""
    return bool(getattr(exc, "retryable", False)) or isinstance(
        exc, errors.Unavailable | ConnectionError | TimeoutError
    )


CANCEL_EVENTS = frozenset({"CancellationRequested", "RunCancelled"})


class _Stopped(Exception):
    """The run was cancelled while the attempt waited: stop and report ``Cancelled``."""


class LeaseGone(Exception):
    """By the local clock the lease expired (plus a grace) while its commands went unanswered:
    the reconciler re-dispatches the attempt, so sending more is pointless."""


class _Lease:
    """The expiry of the lease in hand, moved on by each renewal."""

    def __init__(self, claim: Claim) -> None:
        self.attempt_id = claim.attempt_id
        self.expires_at: datetime = claim.grant.expires_at


class ReferenceWorker:
    def __init__(
        self,
        client: WorkerClient,
        holder: str | WorkerIdentity,
        executors: Mapping[str, Executor],
        *,
        renew_every_s: float = 30.0,
        claim_timeout_s: float = 20.0,
        lease_grace_s: float = 35.0,
        backoff: Backoff | None = None,
        restart_backoff: Backoff | None = None,
        clock: Clock | None = None,
        concurrency: int = 8,
    ) -> None:
        if concurrency < 1:
            raise ValueError("a worker runs at least one attempt at a time")
        self.client = client
        self.concurrency = concurrency
        self.identity = holder
        self.holder = holder.holder if isinstance(holder, WorkerIdentity) else holder
        self.executors = dict(executors)
        self.renew_every_s = renew_every_s
        self.claim_timeout_s = claim_timeout_s
        # Beyond the server's renewal grace, plus some clock skew: only then is the lease
        # certainly gone, whatever the server's clock says.
        self.lease_grace = timedelta(seconds=lease_grace_s)
        self.backoff = backoff or Backoff()
        self.restart_backoff = restart_backoff or Backoff(base_s=1.0, cap_s=30.0)
        self.clock = clock or SystemClock()
        self.completed = 0
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run_supervised(self) -> None:
        """``run()`` until stopped, restarting it after a short backoff should it die anyway."""
        failures = 0
        while not self._stop.is_set():
            try:
                await self.run()
            except Exception:
                failures += 1
                delay = self.restart_backoff.delay(failures)
                log.exception("worker %s died; restarting in %.1fs", self.holder, delay)
            else:
                if self._stop.is_set():
                    return
                failures += 1
                delay = self.restart_backoff.delay(failures)
                log.error(
                    "worker %s left its loop unasked; restarting in %.1fs", self.holder, delay
                )
            await self._pause(delay, self.restart_backoff)

    async def run(self) -> None:
        """Claim and work until stopped, ``concurrency`` attempts at a time (drains: attempts
        in hand finish first).

        No failure ends a slot's loop: it is logged, and the next claim follows a backoff."""
        await asyncio.gather(*(self._slot(self.slot_holder(k)) for k in range(self.concurrency)))

    def slot_holder(self, k: int) -> str | WorkerIdentity:
        """Who slot ``k`` claims as: each slot holds its own leases (a claim retried by the
        same holder gets the same lease, so two slots sharing one would run one attempt
        twice). An authenticated worker's slots are instances of its identity."""
        if self.concurrency == 1:
            return self.identity
        if isinstance(self.identity, WorkerIdentity):
            return dataclasses.replace(
                self.identity, instance_id=f"{self.identity.instance_id}.{k}"
            )
        return f"{self.holder}/{k}"

    async def _slot(self, holder: str | WorkerIdentity) -> None:
        failures = 0
        # The claim id of a claim left unanswered by a transient failure: its next send is a
        # resend, which gets the lease the first send may have been granted (its answer lost).
        unanswered: str | None = None
        while not self._stop.is_set():
            claim_id = unanswered or new_command_id()
            try:
                unanswered = claim_id
                claim = await self._claim(holder, claim_id)
                unanswered = None
                if claim is not None:
                    await self.work(claim)
                failures = 0
            except Exception as exc:
                failures += 1
                delay = self.backoff.delay(failures)
                if transient(exc):
                    log.warning("worker %s: %r; claiming again in %.2fs", self.holder, exc, delay)
                else:
                    unanswered = None  # refused: nothing was granted to it
                    log.exception("worker %s failed; claiming again in %.2fs", self.holder, delay)
                await self._pause(delay, self.backoff)
        if unanswered is not None:
            await self._claim_unanswered(holder, unanswered)

    async def _claim(
        self, holder: str | WorkerIdentity, claim_id: str, timeout_s: float | None = None
    ) -> Claim | None:
        """The next claim, or None when nothing came.

        A claim already asked for when the worker stops is awaited (one long poll, at most
        ``claim_timeout_s``) and then worked, not abandoned: the host may grant it anyway, and
        a lease nobody works expires, which settles a shared-write attempt Uncertain although
        it never ran (the chaos suite's SIGTERM of the service did this to claims in flight)."""
        return await self.client.claim(
            list(self.executors),
            holder,
            self.claim_timeout_s if timeout_s is None else timeout_s,
            claim_id=claim_id,
        )

    async def _claim_unanswered(self, holder: str | WorkerIdentity, claim_id: str) -> None:
        """Stopping with a claim unanswered: resend it once, without waiting for new work, and
        work what it was granted (if anything), for the same reason as a claim in flight."""
        try:
            claim = await self._claim(holder, claim_id, timeout_s=0.0)
            if claim is not None:
                await self.work(claim)
        except Exception as exc:  # noqa: BLE001 - stopping: its lease, if any, will expire
            log.warning("worker %s: a claim left unanswered at stop: %r", self.holder, exc)

    async def _pause(self, seconds: float, backoff: Backoff) -> None:
        """Sleep ``seconds`` (through the backoff's sleep), cut short by ``stop()``."""
        stopping = asyncio.create_task(self._stop.wait())
        sleeping = asyncio.ensure_future(backoff.sleep(seconds))
        try:
            await asyncio.wait({sleeping, stopping}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
            sleeping.cancel()

    async def work(self, claim: Claim) -> None:
        """Run one leased attempt to its report. A cancellation of the run (the lease grant or
        a renewal says ``cancel_requested``, the run's events carry ``CancellationRequested``,
        or a renewal is refused) stops the executor and reports ``Cancelled``."""
        grant = claim.grant
        lease = _Lease(claim)
        stop = asyncio.Event()
        if grant.cancel_requested:
            stop.set()
        helpers = [
            asyncio.create_task(self._renew(claim, lease, stop)),
            asyncio.create_task(self._watch_for_cancel(claim, stop)),
        ]
        body = asyncio.create_task(self._attempt(claim, lease))
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({body, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if body.done() and not isinstance(body.exception(), _Stopped):
                body.result()
                return
            body.cancel()
            with contextlib.suppress(asyncio.CancelledError, _Stopped):
                await body
            log.info("attempt %s: the run was cancelled; stopped", grant.attempt_id)
            await self._report(claim, lease, AttemptOutcome.CANCELLED)
        except LeaseGone as exc:
            log.warning("gave up on attempt %s: %s", grant.attempt_id, exc)
        except errors.RunControlError as exc:
            # Refused for good (lease gone, stale token, already settled): the run has moved on.
            log.warning("attempt %s: refused: %s (%s)", grant.attempt_id, exc, exc.code)
        finally:
            for task in (*helpers, stopping, body):
                task.cancel()
            for task in (*helpers, stopping, body):
                with contextlib.suppress(BaseException):
                    await task

    async def _attempt(self, claim: Claim, lease: _Lease) -> None:
        """The attempt's work: approval first when its step needs it, then the executor."""
        grant = claim.grant
        executor = self.executors[grant.agent_id]
        if grant.gate == "approval" or grant.side_effect_class.at_least(
            SideEffectClass.LOCAL_WRITE
        ):
            if not await self._approved(claim, lease, executor):
                return
        try:
            result = await executor.execute(claim.input)
        except TransientError as exc:
            log.info("attempt %s failed transiently: %s", grant.attempt_id, exc)
            await self._report(claim, lease, AttemptOutcome.FAILED, FailureClass.TRANSIENT)
            return
        except Exception:
            log.exception("attempt %s failed", grant.attempt_id)
            await self._report(claim, lease, AttemptOutcome.FAILED, FailureClass.PERMANENT)
            return
        await self._report(
            claim, lease, AttemptOutcome.SUCCEEDED, outcome_hash=canonical_hash(result)
        )
        self.completed += 1

    async def _watch_for_cancel(self, claim: Claim, stop: asyncio.Event) -> None:
        """Follow the run's events while the attempt runs: a cancellation stops it within a
        long-poll's wake-up (a NOTIFY), not at the next renewal."""
        try:
            async for event in self._follow(claim):
                if event["type"] in CANCEL_EVENTS:
                    stop.set()
                    return
        except Exception as exc:  # renewals still carry cancel_requested
            log.warning("attempt %s: watching its run failed: %r", claim.attempt_id, exc)

    async def _follow(self, claim: Claim) -> AsyncIterator[dict[str, Any]]:
        """The run's events in order, until its terminal event: a transient failure resumes
        from the last event seen, after a backoff."""
        cursor = failures = 0
        while True:
            try:
                async for event in self.client.watch(claim.tenant_id, claim.run_id, cursor):
                    cursor, failures = event["seq"], 0
                    yield event
                return
            except Exception as exc:
                if not transient(exc):
                    raise
                failures += 1
                await self.backoff.sleep(self.backoff.delay(failures))

    async def _send(self, command: Command[R], lease: _Lease) -> R:
        """Send ``command`` until answered, refused for good, or the lease is certainly gone.

        A transient failure leaves it unknown whether the command ran; the resend is the same
        object, so its ``command_id`` gets the stored answer rather than a second effect."""
        failures = 0
        while True:
            try:
                return await self.client.send(command)
            except Exception as exc:
                if not transient(exc):
                    raise
                failures += 1
                if self.clock.now() > lease.expires_at + self.lease_grace:
                    raise LeaseGone(
                        f"{type(command).__name__} unanswered ({exc!r}) and the lease expired "
                        f"at {lease.expires_at.isoformat()}"
                    ) from exc
                delay = self.backoff.delay(failures)
                log.warning(
                    "%s for attempt %s: %r; resending in %.2fs",
                    type(command).__name__,
                    lease.attempt_id,
                    exc,
                    delay,
                )
                await self.backoff.sleep(delay)

    async def _approved(self, claim: Claim, lease: _Lease, executor: Executor) -> bool:
        """Ask for approval of the exact proposal. Approved (by policy, or before: a resumed
        attempt's grant carries the approved hash, and the same proposal asked again answers
        that approval) -> execute. Pending -> the control plane parked the attempt and
        released the lease: this slot is free, and any worker resumes it after the decision."""
        proposal = await executor.propose(claim.input)
        proposal_hash = canonical_hash(proposal)
        approved = claim.grant.approved_proposal_hash
        if approved is not None and approved != proposal_hash:
            log.warning(
                "attempt %s: the proposal changed since it was approved; asking again",
                claim.attempt_id,
            )
        approval = await self._send(
            RequestApproval(**claim.fenced(), proposal_hash=proposal_hash), lease
        )
        if approval is None or approval.state is ApprovalState.APPROVED:
            return True
        log.info(
            "attempt %s parked until approval %s is decided", claim.attempt_id, approval.approval_id
        )
        return False

    async def _renew(self, claim: Claim, lease: _Lease, stop: asyncio.Event) -> None:
        while True:
            await asyncio.sleep(self.renew_every_s)
            try:
                grant = await self._send(RenewLease(**claim.fenced()), lease)
            except LeaseGone as exc:
                log.warning("stopped renewing attempt %s: %s", claim.attempt_id, exc)
                return
            except errors.RunControlError as exc:
                log.warning("renewal of attempt %s refused: %s", claim.attempt_id, exc)
                stop.set()  # the lease is no longer ours: stop working on it
                return
            except Exception:
                log.exception("renewal of attempt %s failed", claim.attempt_id)
                return
            lease.expires_at = max(lease.expires_at, grant.expires_at)
            if grant.cancel_requested:
                stop.set()

    async def _report(
        self,
        claim: Claim,
        lease: _Lease,
        outcome: AttemptOutcome,
        failure_class: FailureClass | None = None,
        outcome_hash: str | None = None,
    ) -> None:
        await self._send(
            ReportOutcome(
                **claim.fenced(),
                outcome=outcome,
                failure_class=failure_class,
                outcome_hash=outcome_hash,
            ),
            lease,
        )
