"""RunGrain: the serialised command handler of one run (load -> decide -> commit).

The grain is a virtual actor in the Orleans sense: its memory is a cache of the run's rows and
never the authority. Every command runs in one tenant-scoped transaction that writes the rows,
the outbox events and the journal entries together, guarded by the run's ``version``. If another
activation committed first the guard fails; the grain reloads and decides again, once, before
answering ``ConcurrencyConflict``. A host must call one grain's commands one at a time.

Commands are the typed messages of ``runcontrol.commands``; ``HANDLERS`` maps each type to the
grain's handler and says whether a host may commit it together with other runs' commands. A
committed command's answer is stored with its effect; a resend of its ``command_id`` within the
window (``RunControl:Commands:AnswerRetentionHours``) gets that answer, never a second effect.
"""

from __future__ import annotations

import copy
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Generic, TypeVar
from uuid import UUID

from .clock import Clock
from .commands import (
    AcquireLease,
    CancelRun,
    Command,
    DecideApproval,
    DispatchRun,
    OpenAttempts,
    RenewLease,
    ReportOutcome,
    RequestApproval,
    StartRun,
    SubmitResult,
    SubmitRun,
    WakeResult,
    WakeRun,
)
from .domain import (
    ApprovalRequest,
    Attempt,
    CommandContext,
    Event,
    LeaseGrant,
    Options,
    RunAggregate,
    Submission,
    canonical_hash,
    errors,
)
from .ports import Budget, Capacity, PolicyStore, ReleaseRegistry
from .store import Database, DuplicateSubmission, UnitOfWork
from .store.group import Answer
from .store.uow import PendingCommit, StoredAnswer

log = logging.getLogger(__name__)
T = TypeVar("T")
C = TypeVar("C", bound=Command[Any])
Observer = Callable[[RunAggregate, Sequence[Event]], None]


@dataclass
class GrainEnv:
    """Everything a grain needs from the outside, built once by ``runcontrol.bootstrap``."""

    db: Database
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


@dataclass(frozen=True, slots=True)
class Handler:
    """How the grain handles one command type: as a ``plan`` decided on the run (committed by
    the grain's loop, and by a host's group when ``batches``), or as a ``procedure`` with steps
    of its own (a submission, a start, a read)."""

    plan: Callable[[RunGrain, Any], Plan[Any]] | None = None
    procedure: Callable[[RunGrain, Any], Any] | None = None
    batches: bool = False


# The registry: command type -> its handler (filled by ``plans`` and ``procedure`` below).
HANDLERS: dict[type[Command[Any]], Handler] = {}


def plans(
    command_type: type[C], *, batches: bool = False
) -> Callable[[Callable[[RunGrain, C], Plan[Any]]], Callable[[RunGrain, C], Plan[Any]]]:
    """Register the grain's plan for ``command_type``. ``batches``: the plan reads nothing
    from the database, so a host may commit it in one group with other runs' commands."""

    def register(fn: Callable[[RunGrain, C], Plan[Any]]) -> Callable[[RunGrain, C], Plan[Any]]:
        HANDLERS[command_type] = Handler(plan=fn, batches=batches)
        return fn

    return register


def procedure(
    command_type: type[C],
) -> Callable[[Callable[[RunGrain, C], Any]], Callable[[RunGrain, C], Any]]:
    def register(fn: Callable[[RunGrain, C], Any]) -> Callable[[RunGrain, C], Any]:
        HANDLERS[command_type] = Handler(procedure=fn)
        return fn

    return register


def batches(command: Command[Any]) -> bool:
    """Whether a host may commit ``command`` together with other runs' commands."""
    handler = HANDLERS.get(type(command))
    return handler is not None and handler.batches


class Blocking:
    """Yielded by a transition about to do blocking I/O of its own (a load, a refusal's audit,
    a port that reads): a driver on an event loop resumes it on a thread (``BLOCKING``)."""

    __slots__ = ()


BLOCKING = Blocking()
# A command as steps: yields each document it commits and is sent the database's answer for it;
# yields ``BLOCKING`` (and is sent None) before blocking I/O of its own.
Transition = Generator[PendingCommit | Blocking, Answer, T]


class GroupRounds:
    """The rounds of committing several runs' transitions together, without the I/O: each
    round, ``next_group`` gives the documents ready (in run order, so two groups lock their
    runs in the same order) and ``answer`` hands each transition the database's answer for its
    own. One that lost its race reloads and decides again, exactly as when called alone, and
    joins the next round. Transitions that yielded ``BLOCKING`` wait in ``blocked`` until the
    driver calls ``resume_blocked`` (where blocking I/O may run). ``results`` then holds
    ``(True, result)`` or ``(False, error)`` per transition, in order. Give it one transition
    per run."""

    def __init__(self, transitions: Sequence[Transition[Any]]) -> None:
        self._transitions = transitions
        self.results: list[tuple[bool, Any]] = [(False, None)] * len(transitions)
        self._ready: list[tuple[int, PendingCommit]] = []
        self._group: list[tuple[int, PendingCommit]] = []
        self.blocked: list[int] = []
        for i, steps in enumerate(transitions):
            self._advance(i, steps.__next__)

    def resume_blocked(self) -> None:
        """Run the blocked transitions to their next step (they may block: call it on a thread
        from an event loop), until none is left blocked."""
        while self.blocked:
            resumed, self.blocked = self.blocked, []
            for i in resumed:
                self._advance(i, self._transitions[i].__next__)

    def next_group(self) -> list[str] | None:
        if not self._ready:
            return None
        self._group = sorted(self._ready, key=lambda item: item[1].key)
        self._ready = []
        return [pending.doc for _, pending in self._group]

    def answer(self, answers: list[Answer] | Exception) -> None:
        """The database's answers for the last group, or why the whole group failed."""
        for k, (i, _) in enumerate(self._group):
            steps = self._transitions[i]
            if isinstance(answers, Exception):
                self._advance(i, lambda s=steps, e=answers: s.throw(e))  # type: ignore[misc]
            else:
                self._advance(i, lambda s=steps, a=answers[k]: s.send(a))  # type: ignore[misc]

    def _advance(self, i: int, step: Callable[[], PendingCommit | Blocking]) -> None:
        try:
            out = step()
        except StopIteration as done:
            self.results[i] = (True, done.value)
        except Exception as exc:  # noqa: BLE001 - answered to its own caller
            self.results[i] = (False, exc)
        else:
            if isinstance(out, Blocking):
                self.blocked.append(i)
            else:
                self._ready.append((i, out))


def commit_together(db: Database, transitions: Sequence[Transition[Any]]) -> list[tuple[bool, Any]]:
    """Commit several runs' transitions together (``GroupRounds``), each round's documents
    in one ``Database.send_documents`` statement; blocking steps run inline."""
    rounds = GroupRounds(transitions)
    while True:
        rounds.resume_blocked()
        docs = rounds.next_group()
        if docs is None:
            return rounds.results
        try:
            rounds.answer(db.send_documents(docs))
        except Exception as exc:  # noqa: BLE001 - the whole group failed (a lost connection)
            rounds.answer(exc)


async def commit_together_async(
    send: Callable[[list[str]], Awaitable[list[Answer]]],
    transitions: Sequence[Transition[Any]],
    on_thread: Callable[[Callable[[], None]], Awaitable[None]],
) -> list[tuple[bool, Any]]:
    """``commit_together`` for an event loop: each round's statement is awaited (``send``:
    ``store.AsyncDocumentSender.send``) and the transitions' steps run on the loop, except
    those that said they block (``BLOCKING``: a load, a refusal's audit, a port that reads),
    which ``on_thread`` runs on a thread. A cached grain's lease or outcome thus costs no
    thread hand-off and no round trip but the group's."""
    rounds = GroupRounds(transitions)
    while True:
        if rounds.blocked:
            await on_thread(rounds.resume_blocked)
        docs = rounds.next_group()
        if docs is None:  # none blocked (resumed above) and none ready: all answered
            return rounds.results
        try:
            rounds.answer(await send(docs))
        except Exception as exc:  # noqa: BLE001 - the whole group failed (a lost connection)
            rounds.answer(exc)


class RunGrain:
    def __init__(self, env: GrainEnv, tenant_id: str, run_id: UUID) -> None:
        self.env = env
        self.tenant_id = tenant_id
        self.run_id = run_id
        self._agg: RunAggregate | None = None
        # Exactly-once: answers this activation committed (id -> (when, answer)), and the ids
        # of every command the store held answers for when the run was loaded.
        self._answers: dict[str, tuple[datetime, Any]] = {}
        self._answered: set[str] = set()

    @property
    def active(self) -> bool:
        """False once the cached run is terminal: the host may deactivate it."""
        return self._agg is None or not self._agg.run.state.terminal

    @property
    def cached(self) -> bool:
        """True while the activation holds the run's rows (its commands need no read)."""
        return self._agg is not None

    # ------------------------------------------------------------------ the command loop

    def execute(self, command: Command[T]) -> T:
        """Handle one command to its answer (a resend gets the answer stored for its id)."""
        handler = self._handler(command)
        if handler.procedure is not None:
            answer: T = handler.procedure(self, command)
            return answer
        assert handler.plan is not None
        plan: Plan[T] = handler.plan(self, command)
        return self._execute(plan, command)

    def transition(self, command: Command[T]) -> Transition[T]:
        """A batching command (``batches``) as steps, for a host that commits several runs'
        commands in one group (``commit_together``): the same decision, answer and retry as
        ``execute``."""
        handler = self._handler(command)
        if handler.plan is None or not handler.batches:
            raise ValueError(f"{type(command).__name__} cannot run as a transition")
        return self._transition(handler.plan(self, command), command)

    def _handler(self, command: Command[Any]) -> Handler:
        handler = HANDLERS.get(type(command))
        if handler is None:
            raise errors.ValidationFailed(f"{type(command).__name__} is not a grain command")
        if command.tenant_id != self.tenant_id or command.run_id != self.run_id:
            raise errors.ValidationFailed("the command is addressed to another run")
        return handler

    def _uow(self) -> UnitOfWork:
        return UnitOfWork(self.env.db, self.tenant_id, options=self.env.options)

    def _execute(self, plan: Plan[T], command: Command[Any]) -> T:
        """Run one plan to its answer, committing through the process's group commit."""
        db = self.env.db
        steps = self._transition(plan, command)
        try:
            step = next(steps)
            while True:
                if isinstance(step, Blocking):
                    step = next(steps)  # this caller may block: go on
                    continue
                try:
                    answer = db.group.apply(step.doc, db.send_documents, step.key)
                except BaseException as exc:  # noqa: BLE001 - the transition decides what it means
                    step = steps.throw(exc)
                else:
                    step = steps.send(answer)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]

    def _transition(self, plan: Plan[T], command: Command[Any]) -> Transition[T]:
        """The plan as steps: yields the document it commits, is sent the database's answer
        (``commit_together`` sends several runs' documents as one group)."""
        for round_ in (1, 2):
            with self._uow() as uow:
                cached = self._agg is not None
                if not cached or self._decide_reads() or self._answered_before_load(command):
                    yield BLOCKING  # a load, a stored answer, or a port that reads while deciding
                ctx = self.env.context(plan.actor, command.command_id)
                agg = self._agg if self._agg is not None else self._load(uow, ctx.now)
                found, stored = self._recall(uow, command, ctx.now)
                if found:
                    self._agg = agg
                    return stored  # type: ignore[no-any-return]
                try:
                    result = plan.decide(agg, ctx)
                except errors.RunControlError:
                    self._agg = None
                    yield BLOCKING  # the checks and the audit below read and write
                    # Only a refusal decided on the cache may be stale: decide again on fresh
                    # rows (which also finds this command's answer if another activation
                    # committed it). A refusal decided on rows loaded in this transaction is
                    # the answer (re-checking those would loop whenever another activation
                    # keeps committing).
                    if cached and uow.run_version(self.run_id) != agg.run.version:
                        continue
                    audits = agg.take_audits()
                    if audits:
                        uow.add_audits(audits)
                        uow.commit()
                    raise
                answer = StoredAnswer(
                    command.command_id, type(command).__name__, copy.copy(result), ctx.now
                )
                try:
                    pending = uow.prepare_commit(
                        agg, release_budget_at=self._release_at(agg, ctx), answer=answer
                    )
                    if pending is not None:
                        uow.conclude(pending, (yield pending))
                except errors.ConcurrencyConflict:
                    self._agg = None
                    if round_ == 1:
                        continue
                    raise
                except BaseException:
                    self._agg = None
                    raise
                self._agg = agg
                if pending is not None:
                    self._remember(answer)
                    self._observe(agg, pending.changes.events)
                if self._after_commit_writes(agg):
                    yield BLOCKING
                self._after_commit(agg, ctx)
                return result
        raise AssertionError("unreachable")

    def _observe(self, agg: RunAggregate, events: Sequence[Event]) -> None:
        for observer in self.env.observers:
            try:
                observer(agg, events)
            except Exception:  # noqa: BLE001 - an observer never fails a committed command
                log.exception("observer %r failed", observer)

    # ------------------------------------------------------------------ exactly once

    def _window_start(self, now: datetime) -> datetime:
        return now - timedelta(seconds=self.env.options.answer_retention_seconds)

    def _load(self, uow: UnitOfWork, now: datetime) -> RunAggregate:
        agg = uow.load(self.run_id)
        self._answered = uow.answered(self.run_id, self._window_start(now))
        self._answers.clear()
        return agg

    def _answered_before_load(self, command: Command[Any]) -> bool:
        """The command committed before this activation loaded the run: its answer is read."""
        return command.command_id in self._answered and command.command_id not in self._answers

    def _recall(self, uow: UnitOfWork, command: Command[Any], now: datetime) -> tuple[bool, Any]:
        """``(True, answer)`` when the command already committed inside the window."""
        since = self._window_start(now)
        memo = self._answers.get(command.command_id)
        if memo is not None:
            at, value = memo
            return (True, copy.copy(value)) if at >= since else (False, None)
        if command.command_id in self._answered:
            return uow.stored_answer(self.run_id, command.command_id, since)
        return False, None

    def _remember(self, answer: StoredAnswer) -> None:
        self._answers[answer.command_id] = (answer.at, answer.value)
        if len(self._answers) > 1024:  # a long-lived activation: forget what left the window
            since = self._window_start(answer.at)
            self._answers = {k: v for k, v in self._answers.items() if v[0] >= since}

    # ------------------------------------------------------------------ budget and capacity

    def _release_at(self, agg: RunAggregate, ctx: CommandContext) -> datetime | None:
        """When the run is terminal and its budget lives in the run's database, the commit
        itself releases the reservation (at this time)."""
        if self.env.budget.releases_with_run and self._holds_reservation(agg):
            return ctx.now
        return None

    def _after_commit_writes(self, agg: RunAggregate) -> bool:
        return not self.env.budget.releases_with_run and self._holds_reservation(agg)

    def _decide_reads(self) -> bool:
        """Whether deciding may read the database (a capacity limit is checked on dispatch)."""
        return self.env.capacity.reads_database

    @staticmethod
    def _holds_reservation(agg: RunAggregate) -> bool:
        return agg.run.state.terminal and agg.run.budget_reservation_id is not None

    def _after_commit(self, agg: RunAggregate, ctx: CommandContext) -> None:
        if self._after_commit_writes(agg):
            self.env.budget.release(self.tenant_id, self.run_id, ctx.now)

    def _dispatch_due(self, agg: RunAggregate, ctx: CommandContext) -> Attempt | None:
        step = agg.dispatchable_step(ctx.now)
        if step is None or agg.run.budget_reservation_id is None:
            return None
        if not self.env.capacity.allow(self.tenant_id, step.agent_id):
            return None  # denied capacity leaves the step Pending; the dispatcher retries
        return agg.dispatch(ctx, step)

    # ------------------------------------------------------------------ SubmitRun

    @procedure(SubmitRun)
    def _submit(self, command: SubmitRun) -> SubmitResult:
        """Accept the run (idempotent on tenant + project + key), reserve budget, dispatch."""
        principal, request = command.principal, command.request
        if principal.tenant_id != self.tenant_id:
            raise errors.Forbidden("the grain's tenant differs from the caller's")
        if not request.idempotency_key:
            raise errors.ValidationFailed("an Idempotency-Key is required")
        input_hash = canonical_hash(request.canonical_payload())
        try:
            release = self.env.releases.resolve(
                self.tenant_id,
                request.workflow_id,
                alias=request.release_alias,
                release_id=request.release_id,
            )
        except errors.NotFound:
            # A key already used with another payload is a conflict, whatever this one names.
            found = self._existing(principal.project_id, request.idempotency_key, input_hash)
            if found is None:
                raise
            return found
        policy = self.env.policies.current(self.tenant_id)
        ctx = self.env.context(principal.subject, command.command_id)
        # Reserve first, so acceptance, reservation and first dispatch commit as one
        # transaction (one fsync). A duplicate submission gives its reservation back below.
        reservation: UUID | None = None
        denied: str | None = None
        try:
            reservation = self.env.budget.reserve(
                self.tenant_id, self.run_id, request.limits.max_cost_usd or 0.0, ctx.now
            )
        except errors.BudgetReservationDenied as exc:
            denied = str(exc)
        agg = RunAggregate.accept(
            Submission(
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
            ),
            release,
            policy,
            self.env.options,
            ctx,
        )
        if reservation is None:
            agg.deny_budget(ctx, denied or "budget reservation denied")
        else:
            agg.record_budget_reservation(reservation)
            self._dispatch_due(agg, ctx)
        run = agg.run
        result = SubmitResult(
            run.run_id, str(run.state), run.release_id, run.policy_revision, run.snapshot_id, True
        )
        answer = StoredAnswer(command.command_id, type(command).__name__, result, ctx.now)
        try:
            with self._uow() as uow:
                events = uow.commit_changes(
                    agg, release_budget_at=self._release_at(agg, ctx), answer=answer
                )
        except DuplicateSubmission:
            return self._resubmitted(command, input_hash, reservation is not None, ctx.now)
        self._observe(agg, events)
        self._agg = agg
        self._answered = set()
        self._answers = {}
        self._remember(answer)
        self._after_commit(agg, ctx)
        return result

    def _resubmitted(
        self, command: SubmitRun, input_hash: str, reserved: bool, now: datetime
    ) -> SubmitResult:
        """The key already names a run: this very command, resent after it committed (its
        stored answer), or another submission that won the insert (give our reservation back
        and answer with that run)."""
        with self._uow() as uow:
            found, stored = uow.stored_answer(
                self.run_id, command.command_id, self._window_start(now)
            )
        if found:
            return stored  # type: ignore[no-any-return]
        existing = None
        try:
            request = command.request
            existing = self._existing(
                command.principal.project_id, request.idempotency_key, input_hash
            )
        finally:
            if reserved and (existing is None or existing.run_id != self.run_id):
                self.env.budget.release(self.tenant_id, self.run_id, now)
        if existing is None:
            raise errors.ConcurrencyConflict("the winning submission is not visible") from None
        return existing

    def _existing(self, project_id: str, key: str, input_hash: str) -> SubmitResult | None:
        with self._uow() as uow:
            run_id = uow.run_id_for_key(project_id, key)
            if run_id is None:
                return None
            agg = uow.load(run_id)
        agg.assert_same_submission(input_hash)
        run = agg.run
        return SubmitResult(
            run.run_id, str(run.state), run.release_id, run.policy_revision, run.snapshot_id, False
        )

    @procedure(StartRun)
    def _start(self, command: StartRun) -> None:
        """Reserve the budget of an Accepted run, then dispatch its first step.

        Safe to repeat: the reservation is idempotent per run, and the reminder sweep starts
        again a run left Accepted by a crash between the two transactions.
        """
        agg = self._load_cached()
        run = agg.run
        if run.state.value != "Accepted":
            return
        if run.budget_reservation_id is None:
            try:
                reservation = self.env.budget.reserve(
                    self.tenant_id,
                    self.run_id,
                    run.limits.max_cost_usd or 0.0,
                    self.env.clock.now(),
                )
            except errors.BudgetReservationDenied as denied:
                reason = str(denied)
                self._execute(Plan(lambda a, c: a.deny_budget(c, reason), "budget"), command)
                return

            def reserve_and_dispatch(a: RunAggregate, c: CommandContext) -> None:
                if a.run.budget_reservation_id is None:
                    a.record_budget_reservation(reservation)
                self._dispatch_due(a, c)

            self._execute(Plan(reserve_and_dispatch, "run-dispatcher"), command)
        else:
            self._execute(Plan(self._dispatch_due, "run-dispatcher"), command)

    def _load_cached(self) -> RunAggregate:
        if self._agg is None:
            with self._uow() as uow:
                self._agg = self._load(uow, self.env.clock.now())
        return self._agg

    # ------------------------------------------------------------------ commands

    @procedure(DispatchRun)
    def _dispatch(self, command: DispatchRun) -> Attempt | None:
        """RunDispatcher: dispatch the next due Pending step if capacity allows."""
        if self._load_cached().run.state.value == "Accepted":
            self._start(StartRun(tenant_id=self.tenant_id, run_id=self.run_id))
            return None
        return self._execute(Plan(self._dispatch_due, "run-dispatcher"), command)

    @plans(AcquireLease, batches=True)
    def _acquire_lease(self, c: AcquireLease) -> Plan[LeaseGrant]:
        options = self.env.options
        return Plan(lambda a, x: a.acquire_lease(x, c.attempt_id, c.holder, options), c.holder)

    @plans(RenewLease, batches=True)
    def _renew_lease(self, c: RenewLease) -> Plan[LeaseGrant]:
        options = self.env.options
        return Plan(
            lambda a, x: a.renew_lease(
                x, c.attempt_id, c.holder, c.fencing_token, options, lease_id=c.lease_id
            ),
            c.holder,
        )

    @plans(ReportOutcome, batches=True)
    def _report_outcome(self, c: ReportOutcome) -> Plan[Attempt]:
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

        return Plan(decide, c.holder)

    @plans(RequestApproval)
    def _request_approval(self, c: RequestApproval) -> Plan[ApprovalRequest | None]:
        policy = self._pinned_policy()
        return Plan(
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

    @plans(DecideApproval)
    def _decide(self, c: DecideApproval) -> Plan[ApprovalRequest]:
        if c.principal.tenant_id != self.tenant_id:
            raise errors.ApprovalNotFound("approval not found")
        policy = self._pinned_policy()
        return Plan(
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

    @plans(CancelRun, batches=True)
    def _cancel(self, c: CancelRun) -> Plan[str]:
        """Record the intent; answer the state observed after it (not an assumed one)."""

        def decide(a: RunAggregate, x: CommandContext) -> str:
            a.cancel(x, c.requested_by, c.reason, self.env.options)
            return str(a.run.state)

        return Plan(decide, c.requested_by)

    @procedure(OpenAttempts)
    def _open_attempts(self, command: OpenAttempts) -> list[UUID]:
        """Ids of the run's non-terminal attempts (a read of the activation's cache)."""
        return [a.attempt_id for a in self._load_cached().open_attempts()]

    @procedure(WakeRun)
    def _wake(self, command: WakeRun) -> WakeResult:
        """Do whatever is due (the reminder): expire leases and approvals, dispatch retries."""
        agg = self._load_cached()
        if agg.run.state.terminal:
            return WakeResult()
        if agg.run.state.value == "Accepted":
            self._start(StartRun(tenant_id=self.tenant_id, run_id=self.run_id))
            return WakeResult(started=True)
        options = self.env.options

        def decide(a: RunAggregate, c: CommandContext) -> WakeResult:
            leases = sum(
                1 for attempt_id in list(a.leases) if a.expire_lease(c, attempt_id, options)
            )
            approvals = sum(
                1 for ap in a.pending_approvals() if a.expire_approval(c, ap.approval_id)
            )
            dispatched = self._dispatch_due(a, c) is not None
            return WakeResult(False, leases, approvals, dispatched)

        return self._execute(Plan(decide, "reminder"), command)

    def _pinned_policy(self) -> Any:
        run = self._load_cached().run
        return self.env.policies.revision(self.tenant_id, run.policy.policy_id, run.policy.revision)
