"""What an agent function is handed: ``Step`` (``async def``) or ``SyncStep`` (plain ``def``,
run in a thread), one leased attempt of one step of one run.

Every call that reaches Run Control is a fenced command sent through the worker's session
with the run's host; a transient failure resends the *same* command (same ``command_id``),
so a lost answer never becomes a second effect.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, NoReturn, TypeVar
from uuid import UUID

from ..clock import Clock
from ..commands import (
    ClaimToolCall,
    Command,
    CompleteToolCall,
    ConsumeRateLimit,
    HandBackAttempt,
    RecordCall,
    ReportProgress,
    RequestApproval,
)
from ..domain import (
    ApprovalState,
    ProgressAck,
    ProgressMessage,
    RateConsumed,
    SideEffectClass,
    ToolCallClaim,
    ToolCallStatus,
    canonical_hash,
    errors,
)
from ..workers.protocol import Grant
from ._backoff import Backoff, transient
from ._calls import (
    MISSING,
    CallJournal,
    answered,
    arguments_hash,
    as_json,
    final_error,
    inline,
    replayed,
)
from ._errors import CallFailed, ReplayDiverged
from ._output import OutputStream

log = logging.getLogger(__name__)
R = TypeVar("R")


class Parked(BaseException):
    """The attempt waits for a human decision: the function ends without an outcome.

    A ``BaseException`` (like ``CancelledError``) so that an ``except Exception`` in the
    function does not swallow it."""


class LeaseGone(Exception):
    """By the local clock the lease expired (plus a grace) while its commands went unanswered:
    the reconciler re-dispatches the attempt, so sending more is pointless."""


class LeaseLost(BaseException):
    """Run Control refused a command of this attempt for good (a stale fencing token, the
    attempt settled, the lease revoked): the function ends and reports nothing."""


class HandedBack(LeaseLost):
    """The function gave its attempt back (``step.hand_back``): it ends and reports nothing;
    the attempt settled when Run Control took it back."""


@dataclass(frozen=True, slots=True)
class Approval:
    """What ``step.approval`` answers: the proposal may go ahead.

    ``approval_id`` is None when the policy needed no human for it."""

    proposal_hash: str
    approval_id: UUID | None = None


class ToolCall:
    """The at-most-once claim of one tool call (``step.tool_call``).

    ``proceed``: this attempt holds the claim and must run the call, then ``complete`` it
    with the result. Otherwise the call ran (or was claimed) before: ``status`` says how,
    ``result_hash`` is the stored result's hash and ``result`` the result (``completed``;
    None when it was completed with its hash only), and the call must not run."""

    def __init__(self, attempt: AttemptContext, call_id: str, claim: ToolCallClaim) -> None:
        self._attempt = attempt
        self.call_id = call_id
        self.status = claim.status
        self.result_hash = claim.result_hash
        self.error = claim.error
        self.result: Any = None if claim.result_json is None else json.loads(claim.result_json)

    @property
    def proceed(self) -> bool:
        return self.status is ToolCallStatus.PROCEED

    async def _complete(self, result: Any) -> str:
        stored, _ = as_json(result)
        result_hash = canonical_hash(stored)
        answer = await self._attempt.send(
            CompleteToolCall(
                **self._attempt.fenced(),
                call_id=self.call_id,
                result_hash=result_hash,
                result=stored,
            )
        )
        self.status, self.result_hash, self.result = answer.status, answer.result_hash, stored
        return result_hash


class AsyncToolCall(ToolCall):
    async def complete(self, result: Any) -> str:
        """Store the call's result (JSON) and its hash (answers the hash); only after
        ``proceed``. A repeat claim of the call gets the result back."""
        return await self._complete(result)


class SyncToolCall(ToolCall):
    def complete(self, result: Any) -> str:
        """Store the call's result (JSON) and its hash (answers the hash); only after
        ``proceed``. A repeat claim of the call gets the result back."""
        return self._attempt.blocking(self._complete(result))


class AttemptContext:
    """One leased attempt as the worker runs it: its lease, its commands and its stop."""

    def __init__(
        self,
        grant: Grant,
        send_once: Callable[[Command[Any]], Awaitable[Any]],
        *,
        clock: Clock,
        backoff: Backoff,
        lease_grace: timedelta,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self.grant = grant
        self.lease = grant.lease
        self.expires_at: datetime = grant.lease.expires_at
        self._send_once = send_once
        self.clock = clock
        self.backoff = backoff
        self.lease_grace = lease_grace
        self.loop = loop
        self.stop = asyncio.Event()  # cancelled, or the lease is no longer ours
        self.cancelled = threading.Event()  # what a sync function polls
        self.progress_seq = 0
        self.calls = CallJournal(grant.calls)
        self.output = OutputStream(self)  # ``step.stream``

    def fenced(self) -> dict[str, Any]:
        lease = self.lease
        return {
            "tenant_id": self.grant.tenant_id,
            "run_id": lease.run_id,
            "attempt_id": lease.attempt_id,
            "holder": lease.holder,
            "fencing_token": lease.fencing_token,
            "lease_id": lease.lease_id,
        }

    def request_stop(self, why: str) -> None:
        if not self.stop.is_set():
            log.info("attempt %s: %s; stopping it", self.lease.attempt_id, why)
        self.cancelled.set()
        self.stop.set()

    async def send(self, command: Command[R]) -> R:
        """Send ``command`` until answered, refused for good, or the lease is certainly gone.

        A transient failure leaves it unknown whether the command ran; the resend is the same
        object, so its ``command_id`` gets the stored answer rather than a second effect."""
        failures = 0
        while True:
            try:
                answer: R = await self._send_once(command)
                return answer
            except Exception as exc:
                if not transient(exc):
                    raise
                failures += 1
                if self.clock.now() > self.expires_at + self.lease_grace:
                    raise LeaseGone(
                        f"{type(command).__name__} unanswered ({exc!r}) and the lease expired "
                        f"at {self.expires_at.isoformat()}"
                    ) from exc
                delay = self.backoff.delay(failures)
                log.warning(
                    "%s for attempt %s: %r; resending in %.2fs",
                    type(command).__name__,
                    self.lease.attempt_id,
                    exc,
                    delay,
                )
                await self.backoff.sleep(delay)

    async def fenced_send(self, command: Command[R]) -> R:
        """``send`` for the function's own calls: a refusal for good ends the function."""
        try:
            return await self.send(command)
        except errors.RunControlError as exc:
            if isinstance(exc, errors.ReplayDiverged):  # the step fails replay-diverged
                raise ReplayDiverged(str(exc)) from exc
            if isinstance(exc, errors.ValidationFailed):
                raise
            self.request_stop(f"refused: {exc} ({exc.code})")
            raise LeaseLost(str(exc)) from exc

    async def command(self, kind: Callable[..., Command[R]], **fields: Any) -> R:
        """The function's fenced command ``kind`` (this lease's fields, and ``fields``), sent
        by ``fenced_send``: a step's verb is one call of this."""
        return await self.fenced_send(kind(**self.fenced(), **fields))

    def blocking(self, coro: Coroutine[Any, Any, R]) -> R:
        """Run ``coro`` on the worker's loop from the function's thread and wait for it."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    # ------------------------------------------------------------------ the step's calls

    async def progress(self, text: str | None, data: dict[str, Any] | None) -> None:
        seq = self.progress_seq + 1
        for _ in range(3):
            message = ProgressMessage(seq, text, data)
            try:
                ack: ProgressAck = await self.command(ReportProgress, messages=(message,))
            except errors.ProgressGap as gap:  # numbering behind the attempt's: catch up
                seq = int(gap.details.get("acked_seq", seq - 1)) + 1
                continue
            if ack.stored == 0 and ack.duplicates and ack.acked_seq >= seq:
                # An earlier lease of this attempt (before it parked) used these numbers.
                seq = ack.acked_seq + 1
                continue
            self.progress_seq = max(seq, ack.acked_seq)
            return
        raise errors.RunControlError("progress numbering did not settle")

    async def hand_back(self, reason: str) -> None:
        await self.output.flush()
        await self.command(HandBackAttempt, reason=reason)

    async def tool_call(self, call_id: str, request: Any) -> ToolCallClaim:
        request_hash = canonical_hash(request)
        return await self.command(ClaimToolCall, call_id=call_id, request_hash=request_hash)

    async def call_stored(self, name: str, request_hash: str | None) -> tuple[int, Any]:
        """The occurrence of this call of ``name`` in this execution, and the value stored
        for it (``MISSING``: none yet; a stored final error is raised as ``CallFailed``). In a
        replay, a call not stored yet is answered with the original's (the same arguments:
        ``request_hash``), or is ``MISSING`` when the replay makes calls live, or fails the
        step (``ReplayDiverged``, docs/replay.md)."""
        occurrence = self.calls.next_occurrence(name)
        stored = self.calls.stored(name, occurrence)
        if stored is None and self.lease.replay is None:
            return occurrence, MISSING
        if stored is not None and inline(stored):
            return occurrence, replayed(name, occurrence, stored.value_json, stored.error)
        # past the grant's cap, or a replay's call: one read of it
        try:
            answer = await self.command(
                RecordCall,
                name=name,
                occurrence=occurrence,
                read_only=True,
                request_hash=request_hash,
            )
        except ReplayDiverged:
            if self.lease.replay == "live":
                return occurrence, MISSING
            raise
        return occurrence, replayed(name, occurrence, answer.value_json, answer.error)

    async def call_returned(
        self, name: str, occurrence: int, value: Any, request_hash: str | None
    ) -> Any:
        """Record the value the call's function returned: answers it as JSON, or the value
        another execution stored first."""
        own, _ = as_json(value)
        answer = await self.command(
            RecordCall, name=name, occurrence=occurrence, value=own, request_hash=request_hash
        )
        return answered(name, occurrence, answer, own)

    async def call_raised(
        self, name: str, occurrence: int, exc: Exception, request_hash: str | None
    ) -> Any:
        """The call's function raised ``exc``: a final error is recorded and raised as
        ``CallFailed`` (or the value another execution stored first is answered); any other
        is raised as it is, recording nothing."""
        error = final_error(exc)
        if error is None:
            raise exc
        answer = await self.command(
            RecordCall, name=name, occurrence=occurrence, error=error, request_hash=request_hash
        )
        if answer.recorded:
            raise CallFailed(name, occurrence, error) from exc
        return replayed(name, occurrence, answer.value_json, answer.error)

    async def approval(self, proposal: Any, action_class: SideEffectClass | None) -> Approval:
        proposal_hash = canonical_hash(proposal)
        approved = self.lease.approved_proposal_hash
        if approved == proposal_hash:
            return Approval(proposal_hash)  # the re-entry of a resumed attempt
        if approved is not None:
            log.warning(
                "attempt %s: the proposal changed since it was approved; asking again",
                self.lease.attempt_id,
            )
        await self.output.flush()  # parked, the lease ends: what was streamed is stored first
        # The proposal goes with its hash: a run template's constraint is checked against it.
        request = await self.command(
            RequestApproval,
            proposal_hash=proposal_hash,
            action_class=action_class,
            proposal=proposal,
        )
        if request is None:
            return Approval(proposal_hash)
        if request.state is ApprovalState.APPROVED:
            return Approval(proposal_hash, request.approval_id)
        log.info(
            "attempt %s parked until approval %s is decided",
            self.lease.attempt_id,
            request.approval_id,
        )
        raise Parked(str(request.approval_id))


class _StepBase:
    def __init__(self, attempt: AttemptContext) -> None:
        self._attempt = attempt
        grant, lease = attempt.grant, attempt.lease
        self.tenant_id: str = grant.tenant_id
        self.run_id: UUID = lease.run_id
        self.step_id: UUID = lease.step_id
        self.attempt_id: UUID = lease.attempt_id
        self.attempt: int = lease.attempt_number
        self.agent_id: str = lease.agent_id
        self.holder: str = lease.holder  # who holds the lease: this worker's slot
        self.skill_id: str | None = lease.skill_id
        self.side_effect_class: SideEffectClass = lease.side_effect_class
        self.gate: str = lease.gate
        self.input: dict[str, Any] | None = grant.input
        self.results: Mapping[str, Any] = grant.results
        # Set when the attempt resumes after a human approved a proposal of this hash.
        self.approved_proposal_hash: str | None = lease.approved_proposal_hash
        # A replay run's: ``refuse`` or ``live`` (docs/replay.md); None: not a replay.
        self.replay: str | None = lease.replay

    @property
    def lease_expires_at(self) -> datetime:
        """When the lease in hand expires unless renewed (the worker renews it)."""
        return self._attempt.expires_at

    @property
    def deadline(self) -> datetime | None:
        """When Run Control cancels the run: its wall-clock budget (``maxMinutes``) or its
        maximum lifetime, the earlier. None when the grant did not say (a grant found again
        after its host restarted)."""
        return self._attempt.grant.deadline_at

    @property
    def cancelled(self) -> bool:
        """The run is being cancelled (or the lease is no longer this worker's): stop."""
        return self._attempt.cancelled.is_set()

    @property
    def needs_approval(self) -> bool:
        """Whether this step's kind asks for approval by default: an approval gate, or a
        side effect of local-write or more (the policy decides whether a human must)."""
        return self.gate == "approval" or self.side_effect_class.at_least(
            SideEffectClass.LOCAL_WRITE
        )

    def __repr__(self) -> str:
        return (
            f"<{type(self).__name__} {self.agent_id} run={self.run_id} "
            f"attempt={self.attempt_id} #{self.attempt}>"
        )


class Step(_StepBase):
    """The attempt an ``async def`` agent function works on."""

    async def progress(self, text: str | None = None, data: dict[str, Any] | None = None) -> None:
        """Report progress (a ``ProgressReported`` event clients see), in order, once each."""
        await self._attempt.progress(text, data)

    async def consume(self, name: str, units: float) -> RateConsumed:
        """Report ``units`` of the named rate limit ``name`` this attempt used (model tokens,
        say): the tenant's bucket moves by them, so later dispatches drawing on it wait
        (units / rate). Once per call, whatever the resends."""
        return await self._attempt.command(ConsumeRateLimit, name=name, units=units)

    async def hand_back(self, reason: str) -> NoReturn:
        """Give this attempt back now, for ``reason`` (this worker cannot run it: it is going
        away, a resource it needs is missing). The attempt settles at once as an expired
        lease's would (``TimedOut``; ``Uncertain`` for a side-effecting step) and its step is
        retried under its policy, on any worker, without waiting for the lease to expire.
        Does not return: the function ends without an outcome."""
        await self._attempt.hand_back(reason)
        raise HandedBack(reason)

    async def run(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """A journaled call: ``fn(*args, **kwargs)`` (sync or async) the first time, its
        stored value in every later execution of this step (a re-entry after an approval, a
        retry, the attempt leased again elsewhere), without calling ``fn``. Keyed by ``name``
        and how many calls of ``name`` this execution made before (so loops work); answers
        the value as JSON (it must be JSON, at most ``RunControl:Results:MaxInlineBytes``).
        ``fn`` runs at least once: a crash after it returns and before its value is stored
        runs it again; use ``tool_call`` for a side effect that must happen at most once.
        A final error of ``fn`` (an ``AgentError`` but ``Transient``) is stored too and raised
        as ``CallFailed`` in every execution (docs/workers.md)."""
        attempt = self._attempt
        request_hash = arguments_hash(args, kwargs)
        occurrence, value = await attempt.call_stored(name, request_hash)
        if value is not MISSING:
            return value
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = await value
        except Exception as exc:
            return await attempt.call_raised(name, occurrence, exc, request_hash)
        return await attempt.call_returned(name, occurrence, value, request_hash)

    async def stream(self, chunk: Any) -> None:
        """Stream ``chunk`` (text, or any JSON value) to the run's readers, after the chunks
        before it: batched with those that follow within a moment (docs/streaming.md), stored
        before this attempt's outcome is reported. Returns once queued; raises
        ``OutputChunkTooLarge`` (over 64 KiB) or ``OutputLimitExceeded`` (the attempt wrote
        8 MiB), and ends the function (``LeaseLost``) once a write was refused for good."""
        await self._attempt.output.add(chunk)

    async def tool_call(self, call_id: str, request: Any) -> AsyncToolCall:
        """Claim tool call ``call_id`` (one per run) before its side effect: run it only if
        the answer ``proceed``s, then ``complete`` it with its result."""
        claim = await self._attempt.tool_call(call_id, request)
        return AsyncToolCall(self._attempt, call_id, claim)

    async def approval(
        self, proposal: Any, *, action_class: SideEffectClass | None = None
    ) -> Approval:
        """Ask for approval of exactly ``proposal`` (bound to its canonical hash).

        Answers at once when the policy needs no human, or when this attempt resumed after
        a human approved a proposal of the same hash. When a human must decide, the attempt
        parks: this call does not return, the function ends without an outcome and its slot
        is freed; once approved, the attempt is leased again and the function is called
        again from the start (docs/workers.md: the re-entry rule)."""
        return await self._attempt.approval(proposal, action_class)


class SyncStep(_StepBase):
    """The attempt a plain ``def`` agent function works on (in a thread of its own)."""

    def progress(self, text: str | None = None, data: dict[str, Any] | None = None) -> None:
        self._attempt.blocking(self._attempt.progress(text, data))

    def consume(self, name: str, units: float) -> RateConsumed:
        attempt = self._attempt
        return attempt.blocking(attempt.command(ConsumeRateLimit, name=name, units=units))

    def hand_back(self, reason: str) -> NoReturn:
        self._attempt.blocking(self._attempt.hand_back(reason))
        raise HandedBack(reason)

    def run(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``Step.run``, blocking: ``fn`` runs in this function's thread (an async ``fn`` on
        the worker's loop)."""
        attempt = self._attempt
        request_hash = arguments_hash(args, kwargs)
        occurrence, value = attempt.blocking(attempt.call_stored(name, request_hash))
        if value is not MISSING:
            return value
        try:
            value = fn(*args, **kwargs)
            if inspect.isawaitable(value):
                value = attempt.blocking(_awaited(value))
        except Exception as exc:
            return attempt.blocking(attempt.call_raised(name, occurrence, exc, request_hash))
        return attempt.blocking(attempt.call_returned(name, occurrence, value, request_hash))

    def stream(self, chunk: Any) -> None:
        self._attempt.blocking(self._attempt.output.add(chunk))

    def tool_call(self, call_id: str, request: Any) -> SyncToolCall:
        claim = self._attempt.blocking(self._attempt.tool_call(call_id, request))
        return SyncToolCall(self._attempt, call_id, claim)

    def approval(self, proposal: Any, *, action_class: SideEffectClass | None = None) -> Approval:
        return self._attempt.blocking(self._attempt.approval(proposal, action_class))


async def _awaited(value: Awaitable[R]) -> R:
    return await value
