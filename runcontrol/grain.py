"""RunGrain: the serialised command handler of one run (load -> decide -> commit).

The grain is a virtual actor in the Orleans sense: its memory is a cache of the run's rows and
never the authority. Every command commits in one ``runcontrol_apply`` statement that writes the
rows, the outbox events, the journal entries and the command's answer together, guarded by the
run's ``version``. If another activation committed first the guard fails; the grain reloads
and decides again, once, before answering ``ConcurrencyConflict``. A host must call one grain's
commands one at a time.

Commands are the typed messages of ``runcontrol.commands``; ``HANDLERS`` maps each type to the
grain's handler. Every handler is a coroutine on the caller's event loop: loads, port reads and
commits are awaited (``runcontrol.store.commit``), and every commit joins the process's group
commit, so the commands of many runs committing at the same moment share one statement. A
committed command's answer is stored with its effect; a resend of its ``command_id`` within
the window (``RunControl:Commands:AnswerRetentionHours``) gets that answer, never a second
effect.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar
from uuid import UUID

from .clock import Clock
from .commands import (
    AcquireLease,
    CancelRun,
    ClaimToolCall,
    Command,
    CompleteToolCall,
    ControlResult,
    DecideApproval,
    DispatchRun,
    OpenAttempts,
    RenewLease,
    ReportOutcome,
    ReportProgress,
    RequestApproval,
    RerunRelease,
    RerunRun,
    ResolveAttempt,
    ResumeRun,
    RetryStep,
    SettleRestoredLeases,
    StartRun,
    SubmitRequest,
    SubmitResult,
    SubmitRun,
    SuspendRun,
    WakeResult,
    WakeRun,
    fingerprint,
)
from .domain import (
    ApprovalRequest,
    Attempt,
    CommandContext,
    Event,
    LeaseGrant,
    Options,
    PolicyDocument,
    ProgressAck,
    RunAggregate,
    Submission,
    ToolCallClaim,
    canonical_hash,
    errors,
)
from .domain.run import RESTORE_CHECK
from .ports import Budget, Capacity, PolicyStore, ReleaseRegistry
from .store.commit import (
    DuplicateSubmission,
    GroupCommit,
    PendingCommit,
    Reservation,
    Store,
    StoredAnswer,
    audits_document,
    conclude,
    prepare,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
C = TypeVar("C", bound=Command[Any])
Observer = Callable[[RunAggregate, Sequence[Event]], None]


@dataclass
class GrainEnv:
    """Everything a grain needs from the outside, built once by ``runcontrol.bootstrap``. Used
    from one event loop (a host's): ``commits`` groups the commits made on it."""

    store: Store
    clock: Clock
    options: Options
    releases: ReleaseRegistry
    policies: PolicyStore
    budget: Budget
    capacity: Capacity
    new_id: Callable[[], UUID] = uuid.uuid4
    rng: random.Random = field(default_factory=random.Random)
    # Told of every commit's events, with the run as committed (a host's metrics).
    observers: list[Observer] = field(default_factory=list)
    commits: GroupCommit = field(init=False)

    def __post_init__(self) -> None:
        self.commits = GroupCommit(self.store.send)

    def context(self, actor: str, command_id: str | None = None) -> CommandContext:
        return CommandContext(
            now=self.clock.now(),
            actor=actor,
            command_id=command_id,
            new_id=self.new_id,
            uniform=self.rng.uniform,
        )


@dataclass(frozen=True, slots=True)
class Plan(Generic[T]):
    """What a command decides on the run, and who asks."""

    decide: Callable[[RunAggregate, CommandContext], T]
    actor: str


Handler = Callable[["RunGrain", Any], Awaitable[Any]]
# The registry: command type -> the grain's handler (filled by ``handles`` below). Every
# command commits through the group commit; none needs a path of its own.
HANDLERS: dict[type[Command[Any]], Handler] = {}


def handles(
    command_type: type[C],
) -> Callable[[Callable[[RunGrain, C], Awaitable[Any]]], Callable[[RunGrain, C], Awaitable[Any]]]:
    """Register the grain's handler for ``command_type``."""

    def register(
        fn: Callable[[RunGrain, C], Awaitable[Any]],
    ) -> Callable[[RunGrain, C], Awaitable[Any]]:
        HANDLERS[command_type] = fn
        return fn

    return register


class RunGrain:
    def __init__(self, env: GrainEnv, tenant_id: str, run_id: UUID) -> None:
        self.env = env
        self.tenant_id = tenant_id
        self.run_id = run_id
        self._agg: RunAggregate | None = None
        # Exactly-once: answers this activation committed (id -> (when, answer, fingerprint)),
        # and the ids of every command the store held answers for when the run was loaded.
        self._answers: dict[str, tuple[datetime, Any, str]] = {}
        self._answered: set[str] = set()
        # False while a command decides again after its dispatch met the tenant's capacity cap
        # (checked by the statement, migration 0007): the step stays Pending for the sweep.
        self._may_dispatch = True

    @property
    def active(self) -> bool:
        """False once the cached run is terminal: the host may deactivate it."""
        return self._agg is None or not self._agg.run.state.terminal

    @property
    def cached(self) -> bool:
        """True while the activation holds the run's rows (its commands need no read)."""
        return self._agg is not None

    # ------------------------------------------------------------------ the command loop

    async def execute(self, command: Command[T]) -> T:
        """Handle one command to its answer (a resend gets the answer stored for its id)."""
        handler = HANDLERS.get(type(command))
        if handler is None:
            raise errors.ValidationFailed(f"{type(command).__name__} is not a grain command")
        if command.tenant_id != self.tenant_id or command.run_id != self.run_id:
            raise errors.ValidationFailed("the command is addressed to another run")
        answer: T = await handler(self, command)
        return answer

    async def _run(
        self, plan: Plan[T], command: Command[Any], *, reserve: Reservation | None = None
    ) -> T:
        """Decide ``plan`` on the run and commit it with its answer. ``reserve``: the budget
        reservation the plan records, made by the same statement."""
        retries = 1  # a lost race (or a stale refusal) decides again once, on fresh rows
        self._may_dispatch = True
        while True:
            ctx = self.env.context(plan.actor, command.command_id)
            cached = self._agg is not None
            agg = self._agg if self._agg is not None else await self._load(ctx.now)
            self._agg = None  # trusted again only once this command has answered
            found, stored = await self._recall(command, ctx.now)
            if found:
                self._agg = agg
                return stored  # type: ignore[no-any-return]
            try:
                result = plan.decide(agg, ctx)
            except errors.RunControlError:
                # Only a refusal decided on the cache may be stale: decide again on fresh rows
                # (which also finds this command's answer if another activation committed
                # it). A refusal decided on rows just loaded is the answer (re-checking those
                # would loop whenever another activation keeps committing).
                if cached and retries and await self._version() != agg.run.version:
                    retries -= 1
                    continue
                await self._audit(agg)
                raise
            answer = StoredAnswer(
                command.command_id,
                type(command).__name__,
                copy.copy(result),
                ctx.now,
                fingerprint(command),
            )
            reserved = reserve if reserve is not None and self._records(agg, reserve) else None
            pending = prepare(
                self.tenant_id,
                agg,
                self.env.options,
                release_budget_at=self._release_at(agg, ctx),
                answer=answer,
                reserve=reserved,
                max_open_attempts=self.env.capacity.max_open_attempts_per_tenant,
            )
            if pending is not None:
                try:
                    await self._commit(pending)
                except errors.ConcurrencyConflict:
                    if retries:
                        retries -= 1
                        continue
                    raise
                except errors.CapacityDenied:
                    if not self._may_dispatch:
                        raise
                    self._may_dispatch = False  # decide again without the dispatch
                    continue
                self._remember(answer)
                self._observe(agg, pending.changes.events)
            self._agg = agg
            return result

    async def _commit(self, pending: PendingCommit) -> None:
        conclude(pending, await self.env.commits.commit(pending.doc, pending.key))

    async def _audit(self, agg: RunAggregate) -> None:
        """Commit a refused command's audit records (the refusal itself changes nothing)."""
        audits = agg.take_audits()
        if audits:
            answer = await self.env.commits.commit(
                audits_document(self.tenant_id, audits), str(self.run_id)
            )
            if answer is not None:
                raise errors.Unavailable(f"the refusal's audit was not stored: {answer[1]}")

    async def _version(self) -> int | None:
        return await self.env.store.run_version(self.tenant_id, self.run_id)

    def _observe(self, agg: RunAggregate, events: Sequence[Event]) -> None:
        for observer in self.env.observers:
            try:
                observer(agg, events)
            except Exception:  # noqa: BLE001 - an observer never fails a committed command
                log.exception("observer %r failed", observer)

    # ------------------------------------------------------------------ exactly once

    def _window_start(self, now: datetime) -> datetime:
        return now - timedelta(seconds=self.env.options.answer_retention_seconds)

    async def _load(self, now: datetime) -> RunAggregate:
        agg, self._answered = await self.env.store.load(
            self.tenant_id, self.run_id, self._window_start(now)
        )
        self._answers.clear()
        return agg

    async def _load_cached(self) -> RunAggregate:
        if self._agg is None:
            self._agg = await self._load(self.env.clock.now())
        return self._agg

    async def _recall(
        self, command: Command[Any], now: datetime, *, look_up: bool = False
    ) -> tuple[bool, Any]:
        """``(True, answer)`` when the command already committed inside the window (``look_up``:
        ask the store even if the run was not loaded). A command id committed for a different
        command is refused (``IdempotencyConflict``)."""
        since = self._window_start(now)
        memo = self._answers.get(command.command_id)
        stored: tuple[Any, str | None] | None = None
        if memo is not None:
            at, value, memo_print = memo
            if at < since:
                return False, None
            stored = copy.copy(value), memo_print
        elif look_up or command.command_id in self._answered:
            stored = await self.env.store.stored_answer(
                self.tenant_id, self.run_id, command.command_id, since
            )
        if stored is None:
            return False, None
        value, printed = stored
        if printed is not None and printed != fingerprint(command):
            raise errors.IdempotencyConflict(
                "this command id (Idempotency-Key) was already used for a different command"
            )
        return True, value

    def _remember(self, answer: StoredAnswer) -> None:
        self._answers[answer.command_id] = (answer.at, answer.value, answer.fingerprint)
        if len(self._answers) > 1024:  # a long-lived activation: forget what left the window
            since = self._window_start(answer.at)
            self._answers = {k: v for k, v in self._answers.items() if v[0] >= since}

    # ------------------------------------------------------------------ budget and capacity

    def _reservation(self, agg: RunAggregate, now: datetime) -> Reservation:
        """A reservation of the run's cost limit, for its accepting or starting statement."""
        amount = agg.run.limits.max_cost_usd or 0.0
        return Reservation(self.env.new_id(), amount, self.env.budget.tenant_limit_usd, now)

    @staticmethod
    def _records(agg: RunAggregate, reserve: Reservation) -> bool:
        return agg.run.budget_reservation_id == reserve.reservation_id

    @staticmethod
    def _release_at(agg: RunAggregate, ctx: CommandContext) -> datetime | None:
        """When the run is terminal, the commit itself releases its reservation (at this time)."""
        if agg.run.state.terminal and agg.run.budget_reservation_id is not None:
            return ctx.now
        return None

    def _dispatch_due(self, agg: RunAggregate, ctx: CommandContext) -> Attempt | None:
        step = agg.dispatchable_step(ctx.now)
        if step is None or agg.run.budget_reservation_id is None:
            return None
        if not self._may_dispatch:
            return None  # denied capacity leaves the step Pending; the dispatcher retries
        return agg.dispatch(ctx, step)

    # ------------------------------------------------------------------ SubmitRun

    @handles(SubmitRun)
    async def _submit(self, command: SubmitRun) -> SubmitResult:
        """Accept the run (idempotent on tenant + project + key), reserve its budget and
        dispatch its first step: one statement."""
        return await self._accept(command)

    async def _accept(
        self, command: SubmitRun, also: Callable[[RunAggregate, CommandContext], None] | None = None
    ) -> SubmitResult:
        """``_submit``'s statement; ``also`` records more on the new run before it commits."""
        principal, request = command.principal, command.request
        if principal.tenant_id != self.tenant_id:
            raise errors.Forbidden("the grain's tenant differs from the caller's")
        if not request.idempotency_key:
            raise errors.ValidationFailed("an Idempotency-Key is required")
        input_hash = canonical_hash(request.canonical_payload())
        try:
            release = await self.env.releases.resolve(
                self.tenant_id,
                request.workflow_id,
                alias=request.release_alias,
                release_id=request.release_id,
            )
        except errors.NotFound:
            # A key already used with another payload is a conflict, whatever this one names.
            found = await self._existing(principal.project_id, request.idempotency_key, input_hash)
            if found is None:
                raise
            return found
        policy = await self.env.policies.current(self.tenant_id)
        ctx = self.env.context(principal.subject, command.command_id)
        submission = Submission(
            run_id=self.run_id,
            tenant_id=self.tenant_id,
            project_id=principal.project_id,
            idempotency_key=request.idempotency_key,
            workflow_id=request.workflow_id,
            model_profile_id=request.model_profile_id,
            input_hash=input_hash,
            snapshot_id=self.env.new_id(),
            requested_by=principal.subject,
            environment_id=request.environment_id,
            limits=request.limits,
            correlation_id=request.correlation_id,
            input=request.input,
        )
        denied: str | None = None
        self._may_dispatch = True
        while True:
            agg = RunAggregate.accept(submission, release, policy, self.env.options, ctx)
            if also is not None:
                also(agg, ctx)
            reserve: Reservation | None = None
            if denied is None:
                reserve = self._reservation(agg, ctx.now)
                agg.record_budget_reservation(reserve.reservation_id)
                self._dispatch_due(agg, ctx)
            else:
                agg.deny_budget(ctx, denied)
            run = agg.run
            result = SubmitResult(
                run.run_id,
                str(run.state),
                run.release_id,
                run.policy_revision,
                run.snapshot_id,
                True,
            )
            answer = StoredAnswer(
                command.command_id, type(command).__name__, result, ctx.now, fingerprint(command)
            )
            pending = prepare(
                self.tenant_id,
                agg,
                self.env.options,
                answer=answer,
                reserve=reserve,
                max_open_attempts=self.env.capacity.max_open_attempts_per_tenant,
            )
            assert pending is not None  # a new run always has rows to write
            try:
                await self._commit(pending)
            except errors.BudgetReservationDenied as refused:
                if denied is not None:
                    raise
                denied = str(refused)  # the run is accepted as failed: PolicyDenied
                continue
            except errors.CapacityDenied:
                if not self._may_dispatch:
                    raise
                self._may_dispatch = False  # accepted; its first step waits for capacity
                continue
            except DuplicateSubmission:
                return await self._resubmitted(command, input_hash, ctx.now)
            break
        self._observe(agg, pending.changes.events)
        self._agg = agg
        self._answered = set()
        self._answers = {}
        self._remember(answer)
        return result

    async def _resubmitted(
        self, command: SubmitRun, input_hash: str, now: datetime
    ) -> SubmitResult:
        """The key already names a run: this very command, resent after it committed (its
        stored answer), or another submission that won the insert (answer with that run)."""
        found, stored = await self._recall(command, now, look_up=True)
        if found:
            return stored  # type: ignore[no-any-return]
        request = command.request
        existing = await self._existing(
            command.principal.project_id, request.idempotency_key, input_hash
        )
        if existing is None:
            raise errors.ConcurrencyConflict("the winning submission is not visible") from None
        return existing

    async def _existing(self, project_id: str, key: str, input_hash: str) -> SubmitResult | None:
        store = self.env.store
        run_id = await store.run_id_for_key(self.tenant_id, project_id, key)
        if run_id is None:
            return None
        agg, _ = await store.load(self.tenant_id, run_id, self.env.clock.now())
        agg.assert_same_submission(input_hash)
        run = agg.run
        return SubmitResult(
            run.run_id, str(run.state), run.release_id, run.policy_revision, run.snapshot_id, False
        )

    @handles(StartRun)
    async def _start(self, command: StartRun) -> None:
        """Reserve the budget of an Accepted run and dispatch its first step, in one statement.

        Safe to repeat: the reservation is idempotent per run, and the reminder sweep starts
        again a run left Accepted (a run accepted before migration 0007, or a lost command).
        """
        agg = await self._load_cached()
        if agg.run.state.value != "Accepted":
            return
        if agg.run.budget_reservation_id is not None:
            await self._run(Plan(self._dispatch_due, "run-dispatcher"), command)
            return
        reserve = self._reservation(agg, self.env.clock.now())

        def reserve_and_dispatch(a: RunAggregate, c: CommandContext) -> None:
            if a.run.budget_reservation_id is None:
                a.record_budget_reservation(reserve.reservation_id)
            self._dispatch_due(a, c)

        try:
            await self._run(Plan(reserve_and_dispatch, "run-dispatcher"), command, reserve=reserve)
        except errors.BudgetReservationDenied as denied:
            reason = str(denied)
            await self._run(Plan(lambda a, c: a.deny_budget(c, reason), "budget"), command)

    # ------------------------------------------------------------------ commands

    @handles(DispatchRun)
    async def _dispatch(self, command: DispatchRun) -> Attempt | None:
        """RunDispatcher: dispatch the next due Pending step if capacity allows."""
        if (await self._load_cached()).run.state.value == "Accepted":
            await self._start(StartRun(tenant_id=self.tenant_id, run_id=self.run_id))
            return None
        return await self._run(Plan(self._dispatch_due, "run-dispatcher"), command)

    @handles(AcquireLease)
    async def _acquire_lease(self, c: AcquireLease) -> LeaseGrant:
        options = self.env.options
        return await self._run(
            Plan(lambda a, x: a.acquire_lease(x, c.attempt_id, c.holder, options), c.holder), c
        )

    @handles(RenewLease)
    async def _renew_lease(self, c: RenewLease) -> LeaseGrant:
        options = self.env.options
        return await self._run(
            Plan(
                lambda a, x: a.renew_lease(
                    x, c.attempt_id, c.holder, c.fencing_token, options, lease_id=c.lease_id
                ),
                c.holder,
            ),
            c,
        )

    @handles(ReportOutcome)
    async def _report_outcome(self, c: ReportOutcome) -> Attempt:
        def decide(a: RunAggregate, x: CommandContext) -> Attempt:
            attempt = a.report_outcome(
                x,
                c.attempt_id,
                c.holder,
                c.fencing_token,
                c.outcome,
                self.env.options,
                failure_class=c.failure_class,
                outcome_hash=c.outcome_hash,
                lease_id=c.lease_id,
            )
            self._dispatch_due(a, x)
            return attempt

        return await self._run(Plan(decide, c.holder), c)

    @handles(RequestApproval)
    async def _request_approval(self, c: RequestApproval) -> ApprovalRequest | None:
        policy = await self._pinned_policy()
        plan = Plan(
            lambda a, x: a.request_approval(
                x,
                c.attempt_id,
                c.holder,
                c.fencing_token,
                c.proposal_hash,
                policy,
                self.env.options,
                action_class=c.action_class,
                lease_id=c.lease_id,
            ),
            c.holder,
        )
        return await self._run(plan, c)

    @handles(DecideApproval)
    async def _decide(self, c: DecideApproval) -> ApprovalRequest:
        if c.principal.tenant_id != self.tenant_id:
            raise errors.ApprovalNotFound("approval not found")
        policy = await self._pinned_policy()
        plan = Plan(
            lambda a, x: a.decide_approval(
                x,
                c.approval_id,
                c.principal,
                c.decision,
                c.version,
                c.proposal_hash,
                c.reason,
                policy,
                self.env.options,
            ),
            c.principal.subject,
        )
        return await self._run(plan, c)

    @handles(CancelRun)
    async def _cancel(self, c: CancelRun) -> str:
        """Record the intent; answer the state observed after it (not an assumed one)."""

        def decide(a: RunAggregate, x: CommandContext) -> str:
            a.cancel(x, c.requested_by, c.reason, self.env.options)
            return str(a.run.state)

        return await self._run(Plan(decide, c.requested_by), c)

    @handles(OpenAttempts)
    async def _open_attempts(self, command: OpenAttempts) -> list[UUID]:
        """Ids of the run's non-terminal attempts (a read of the activation's cache)."""
        return [a.attempt_id for a in (await self._load_cached()).open_attempts()]

    @handles(WakeRun)
    async def _wake(self, command: WakeRun) -> WakeResult:
        """Do whatever is due (the reminder): expire leases and approvals, dispatch retries."""
        agg = await self._load_cached()
        if agg.run.state.terminal:
            return WakeResult()
        if agg.run.state.value == "Accepted":
            await self._start(StartRun(tenant_id=self.tenant_id, run_id=self.run_id))
            return WakeResult(started=True)
        options = self.env.options
        now = self.env.clock.now()
        due = any(ap.expires_at <= now for ap in agg.pending_approvals())
        policy = await self._pinned_policy() if due else None  # for its expiry action

        def decide(a: RunAggregate, c: CommandContext) -> WakeResult:
            calls = a.expire_tool_calls(c)
            stopped = a.enforce_deadlines(c, options)
            if a.run.state.terminal:
                return WakeResult(stopped=stopped, tool_calls_expired=calls)
            leases = sum(
                1 for attempt_id in list(a.leases) if a.expire_lease(c, attempt_id, options)
            )
            approvals = 0
            if policy is not None:
                approvals = sum(
                    1
                    for ap in a.pending_approvals()
                    if a.expire_approval(c, ap.approval_id, policy, options)
                )
            dispatched = self._dispatch_due(a, c) is not None
            return WakeResult(False, leases, approvals, dispatched, stopped, calls)

        return await self._run(Plan(decide, "reminder"), command)

    # ------------------------------------------------------------------ progress, tool calls

    @handles(ReportProgress)
    async def _report_progress(self, c: ReportProgress) -> ProgressAck:
        """Commit the messages up to a gap, then refuse the gap (a resend of this command id
        gets the same ack and the same refusal)."""
        options = self.env.options
        ack = await self._run(
            Plan(
                lambda a, x: a.report_progress(
                    x,
                    c.attempt_id,
                    c.holder,
                    c.fencing_token,
                    c.messages,
                    options,
                    lease_id=c.lease_id,
                ),
                c.holder,
            ),
            c,
        )
        if ack.gap_at is not None:
            raise errors.ProgressGap(
                f"progress message {ack.gap_at} follows {ack.acked_seq}: resend from "
                f"{ack.acked_seq + 1}",
                attempt_id=str(c.attempt_id),
                acked_seq=ack.acked_seq,
                gap_at=ack.gap_at,
            )
        return ack

    @handles(ClaimToolCall)
    async def _claim_tool_call(self, c: ClaimToolCall) -> ToolCallClaim:
        options = self.env.options
        return await self._run(
            Plan(
                lambda a, x: a.claim_tool_call(
                    x,
                    c.attempt_id,
                    c.holder,
                    c.fencing_token,
                    c.call_id,
                    c.request_hash,
                    options,
                    lease_id=c.lease_id,
                ),
                c.holder,
            ),
            c,
        )

    @handles(CompleteToolCall)
    async def _complete_tool_call(self, c: CompleteToolCall) -> ToolCallClaim:
        options = self.env.options
        return await self._run(
            Plan(
                lambda a, x: a.complete_tool_call(
                    x,
                    c.attempt_id,
                    c.holder,
                    c.fencing_token,
                    c.call_id,
                    c.result_hash,
                    options,
                    lease_id=c.lease_id,
                ),
                c.holder,
            ),
            c,
        )

    async def _pinned_policy(self) -> PolicyDocument:
        run = (await self._load_cached()).run
        return await self.env.policies.revision(
            self.tenant_id, run.policy.policy_id, run.policy.revision
        )

    # ------------------------------------------------------------------ operator controls

    def _control_result(
        self, agg: RunAggregate, attempt: Attempt | None = None, step_id: UUID | None = None
    ) -> ControlResult:
        run = agg.run
        return ControlResult(
            run_id=run.run_id,
            state=str(run.state),
            suspended=run.suspended_at is not None,
            step_id=attempt.step_id if attempt is not None else step_id,
            attempt_id=attempt.attempt_id if attempt is not None else None,
            attempt_state=str(attempt.state) if attempt is not None else None,
            attempt_number=attempt.number if attempt is not None else None,
        )

    def _operator(self, principal_tenant: str) -> None:
        if principal_tenant != self.tenant_id:
            raise errors.RunNotFound(f"run {self.run_id} not found")

    @handles(SuspendRun)
    async def _suspend(self, c: SuspendRun) -> ControlResult:
        self._operator(c.principal.tenant_id)

        def decide(a: RunAggregate, x: CommandContext) -> ControlResult:
            a.suspend(x, c.reason)
            return self._control_result(a)

        return await self._run(Plan(decide, c.principal.subject), c)

    @handles(ResumeRun)
    async def _resume(self, c: ResumeRun) -> ControlResult:
        """Lift the suspension and dispatch what is due, in one statement."""
        self._operator(c.principal.tenant_id)

        def decide(a: RunAggregate, x: CommandContext) -> ControlResult:
            a.resume(x, c.reason)
            self._dispatch_due(a, x)
            return self._control_result(a)

        return await self._run(Plan(decide, c.principal.subject), c)

    @handles(RetryStep)
    async def _retry_step(self, c: RetryStep) -> ControlResult:
        """Skip the step's backoff and dispatch its new attempt, in one statement (past the
        tenant's capacity cap the step stays Pending, due now, for the dispatcher)."""
        self._operator(c.principal.tenant_id)

        def decide(a: RunAggregate, x: CommandContext) -> ControlResult:
            step = a.retry_step(x, c.step_id, c.reason)
            attempt = self._dispatch_due(a, x)
            return self._control_result(a, attempt, step.step_id)

        return await self._run(Plan(decide, c.principal.subject), c)

    @handles(ResolveAttempt)
    async def _resolve_attempt(self, c: ResolveAttempt) -> ControlResult:
        self._operator(c.principal.tenant_id)
        options = self.env.options

        def decide(a: RunAggregate, x: CommandContext) -> ControlResult:
            attempt = a.resolve_attempt(x, c.attempt_id, c.outcome, c.reason, options)
            self._dispatch_due(a, x)
            return self._control_result(a, attempt)

        return await self._run(Plan(decide, c.principal.subject), c)

    @handles(RerunRun)
    async def _rerun(self, c: RerunRun) -> SubmitResult:
        """Accept the new run (this grain's) with the finished run's input, linked to it: the
        SubmitRun of the old run's project, keyed by this command's id (a resend answers the
        same run). The old run is read, never written."""
        self._operator(c.principal.tenant_id)
        if not c.reason or not c.reason.strip():
            raise errors.ValidationFailed("an operator control needs a reason")
        old, _ = await self.env.store.load(self.tenant_id, c.rerun_of, self.env.clock.now())
        run = old.run
        if not run.state.terminal:
            raise errors.RunNotFinished(
                f"run {run.run_id} is {run.state}: only a finished run can be rerun",
                run_state=str(run.state),
            )
        pinned = c.release is RerunRelease.PINNED
        request = SubmitRequest(
            project_id=run.project_id,
            idempotency_key=f"rerun:{run.run_id}:{c.command_id}",
            workflow_id=run.workflow_id,
            model_profile_id=run.model_profile_id,
            input=dict(run.input or {}),
            release_alias=None if pinned else c.release_alias,
            release_id=run.release_id if pinned else None,
            limits=run.limits,
            environment_id=run.environment_id,
            correlation_id=run.correlation_id,
        )
        principal = dataclasses.replace(c.principal, project_id=run.project_id)
        submit = SubmitRun(
            tenant_id=self.tenant_id,
            run_id=self.run_id,
            command_id=c.command_id,
            principal=principal,
            request=request,
        )
        return await self._accept(
            submit, lambda a, x: a.record_rerun(x, run.run_id, str(c.release), c.reason)
        )

    # ------------------------------------------------------------------ restore from backup

    @handles(SettleRestoredLeases)
    async def _settle_restored(self, command: SettleRestoredLeases) -> list[str]:
        """restore-check: the run's open leases revoked, their attempts Uncertain."""
        options = self.env.options

        def decide(a: RunAggregate, c: CommandContext) -> list[str]:
            return [str(attempt) for attempt in a.settle_restored_leases(c, options)]

        return await self._run(Plan(decide, RESTORE_CHECK), command)
