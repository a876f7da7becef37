"""RunGrain: the serialised command handler of one run (load -> decide -> commit).

The grain is a virtual actor in the Orleans sense: its memory is a cache of the run's rows and
never the authority. Every command runs in one tenant-scoped transaction that writes the rows,
the outbox events and the journal entries together, guarded by the run's ``version``. If another
activation committed first the guard fails; the grain reloads and decides again, once, before
answering ``ConcurrencyConflict``. A host must call one grain's commands one at a time.
"""

from __future__ import annotations

import functools
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Generator, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar
from uuid import UUID

from .clock import Clock
from .domain import (
    ApprovalRequest,
    Attempt,
    AttemptOutcome,
    CommandContext,
    Decision,
    FailureClass,
    LeaseGrant,
    Limits,
    Options,
    Principal,
    RunAggregate,
    SideEffectClass,
    Submission,
    canonical_hash,
    errors,
)
from .ports import Budget, Capacity, PolicyStore, ReleaseRegistry
from .store import Database, DuplicateSubmission, UnitOfWork
from .store.group import Answer
from .store.uow import Fault, PendingCommit

log = logging.getLogger(__name__)
T = TypeVar("T")
P = ParamSpec("P")


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
    fault: Fault | None = None  # test seam: raise at a named point inside the transaction

    def context(self, actor: str, command_id: str | None = None) -> CommandContext:
        return CommandContext(
            now=self.clock.now(),
            actor=actor,
            command_id=command_id,
            new_id=self.new_id,
            uniform=self.rng.uniform,
        )


@dataclass(frozen=True, slots=True)
class Command(Generic[T]):
    """What a command decides on the run, who asks, and the caller's command id."""

    decide: Callable[[RunAggregate, CommandContext], T]
    actor: str
    command_id: str | None = None


class Blocking:
    """Yielded by a transition about to do blocking I/O of its own (a load, a refusal's audit,
    a port that reads): a driver on an event loop resumes it on a thread (``BLOCKING``)."""

    __slots__ = ()


BLOCKING = Blocking()
# A command as steps: yields each document it commits and is sent the database's answer for it;
# yields ``BLOCKING`` (and is sent None) before blocking I/O of its own.
Transition = Generator[PendingCommit | Blocking, Answer, T]
# The commands a host may run together (``RunGrain.transition``, ``commit_together``): those
# whose plans read nothing from the database.
BATCHABLE = frozenset({"acquire_lease", "renew_lease", "report_outcome", "cancel"})


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


def command(
    plan: Callable[Concatenate[RunGrain, P], Command[T]],
) -> Callable[Concatenate[RunGrain, P], T]:
    """A grain command written as its plan: calling it runs the plan to its answer; the plan
    stays on it as ``.plan`` (``RunGrain.transition``)."""

    @functools.wraps(plan)
    def run(self: RunGrain, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._execute(plan(self, *args, **kwargs))

    run.plan = plan  # type: ignore[attr-defined]
    return run


@dataclass(frozen=True, slots=True)
class SubmitRequest:
    project_id: str
    idempotency_key: str
    workflow_id: str
    model_profile_id: str
    input: dict[str, Any]
    release_alias: str | None = None
    release_id: str | None = None
    limits: Limits = Limits()
    environment_id: str | None = None
    correlation_id: str | None = None

    def canonical_payload(self) -> dict[str, Any]:
        return {
            "workflowId": self.workflow_id,
            "releaseAlias": self.release_alias if self.release_id is None else None,
            "releaseId": self.release_id,
            "modelProfileId": self.model_profile_id,
            "input": self.input,
            "limits": {
                "maxCostUsd": self.limits.max_cost_usd,
                "maxMinutes": self.limits.max_minutes,
            },
            "environmentId": self.environment_id,
        }


@dataclass(frozen=True, slots=True)
class SubmitResult:
    run_id: UUID
    state: str
    release_id: str
    policy_revision: str
    snapshot_id: UUID
    created: bool


class RunGrain:
    def __init__(self, env: GrainEnv, tenant_id: str, run_id: UUID) -> None:
        self.env = env
        self.tenant_id = tenant_id
        self.run_id = run_id
        self._agg: RunAggregate | None = None

    @property
    def active(self) -> bool:
        """False once the cached run is terminal: the host may deactivate it."""
        return self._agg is None or not self._agg.run.state.terminal

    @property
    def cached(self) -> bool:
        """True while the activation holds the run's rows (its commands need no read)."""
        return self._agg is not None

    # ------------------------------------------------------------------ the command loop

    def _uow(self) -> UnitOfWork:
        return UnitOfWork(
            self.env.db, self.tenant_id, options=self.env.options, fault=self.env.fault
        )

    def _execute(self, command: Command[T]) -> T:
        """Run one command to its answer, committing through the process's group commit."""
        db = self.env.db
        steps = self._transition(command)
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

    def _transition(self, command: Command[T]) -> Transition[T]:
        """The command as steps: yields the document it commits, is sent the database's answer
        (``commit_together`` sends several runs' documents as one group)."""
        for round_ in (1, 2):
            with self._uow() as uow:
                cached = self._agg is not None
                if not cached or self._decide_reads():
                    yield BLOCKING  # a load, or a port that reads while deciding
                agg = self._agg if self._agg is not None else uow.load(self.run_id)
                ctx = self.env.context(command.actor, command.command_id)
                try:
                    result = command.decide(agg, ctx)
                except errors.RunControlError:
                    self._agg = None
                    yield BLOCKING  # the checks and the audit below read and write
                    # Only a refusal decided on the cache may be stale: decide again on fresh
                    # rows. A refusal decided on rows loaded in this transaction is the answer
                    # (re-checking those would loop whenever another activation keeps committing).
                    if cached and uow.run_version(self.run_id) != agg.run.version:
                        continue
                    audits = agg.take_audits()
                    if audits:
                        uow.add_audits(audits)
                        uow.commit()
                    raise
                try:
                    pending = uow.prepare_commit(agg, release_budget_at=self._release_at(agg, ctx))
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
                if self._after_commit_writes(agg):
                    yield BLOCKING
                self._after_commit(agg, ctx)
                return result
        raise AssertionError("unreachable")

    def transition(self, name: str, *args: Any, **kwargs: Any) -> Transition[Any]:
        """Command ``name`` (one of ``BATCHABLE``) as steps, for a host that commits several
        runs' commands in one group (``commit_together``): the same decision, answer and retry
        as calling the method."""
        if name not in BATCHABLE:
            raise ValueError(f"{name} cannot run as a transition")
        plan: Callable[..., Command[Any]] = getattr(type(self), name).plan
        return self._transition(plan(self, *args, **kwargs))

    def _release_at(self, agg: RunAggregate, ctx: CommandContext) -> datetime | None:
        """When the run is terminal and its budget lives in the run's database, the commit
        itself releases the reservation (at this time)."""
        if self._releases_with_run() and self._holds_reservation(agg):
            return ctx.now
        return None

    def _releases_with_run(self) -> bool:
        # A Budget port written before the attribute existed releases after the commit.
        return bool(getattr(self.env.budget, "releases_with_run", False))

    def _after_commit_writes(self, agg: RunAggregate) -> bool:
        return not self._releases_with_run() and self._holds_reservation(agg)

    def _decide_reads(self) -> bool:
        """Whether deciding may read the database (a capacity limit is checked on dispatch);
        a port that does not say is taken to read."""
        return bool(getattr(self.env.capacity, "reads_database", True))

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

    def submit(self, principal: Principal, request: SubmitRequest) -> SubmitResult:
        """Accept the run (idempotent on tenant + project + key), reserve budget, dispatch."""
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
        ctx = self.env.context(principal.subject)
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
        try:
            with self._uow() as uow:
                uow.commit_changes(agg, release_budget_at=self._release_at(agg, ctx))
        except DuplicateSubmission:
            # The key already names a run: a concurrent submission that won the insert (give
            # our reservation back), or this very command retried after it committed (the run
            # is ours: keep its reservation). Answer with that run.
            found = None
            try:
                found = self._existing(principal.project_id, request.idempotency_key, input_hash)
            finally:
                if reservation is not None and (found is None or found.run_id != self.run_id):
                    self.env.budget.release(self.tenant_id, self.run_id, ctx.now)
            if found is None:
                raise errors.ConcurrencyConflict("the winning submission is not visible") from None
            return found
        self._agg = agg
        self._after_commit(agg, ctx)
        run = agg.run
        return SubmitResult(
            run.run_id, str(run.state), run.release_id, run.policy_revision, run.snapshot_id, True
        )

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

    def start(self) -> None:
        """Reserve the budget of an Accepted run, then dispatch its first step.

        Safe to repeat: the reservation is idempotent per run, and the reminder sweep calls
        this again for a run left Accepted by a crash between the two transactions.
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
                self._execute(Command(lambda a, c: a.deny_budget(c, reason), "budget"))
                return

            def reserve_and_dispatch(a: RunAggregate, c: CommandContext) -> None:
                if a.run.budget_reservation_id is None:
                    a.record_budget_reservation(reservation)
                self._dispatch_due(a, c)

            self._execute(Command(reserve_and_dispatch, "run-dispatcher"))
        else:
            self._execute(Command(self._dispatch_due, "run-dispatcher"))

    def _load_cached(self) -> RunAggregate:
        if self._agg is None:
            with self._uow() as uow:
                self._agg = uow.load(self.run_id)
        return self._agg

    # ------------------------------------------------------------------ commands

    def dispatch(self) -> Attempt | None:
        """RunDispatcher: dispatch the next due Pending step if capacity allows."""
        if self._load_cached().run.state.value == "Accepted":
            self.start()
            return None
        return self._execute(Command(self._dispatch_due, "run-dispatcher"))

    # Each command below is written as its plan (what it decides, and who asks); ``@command``
    # makes the method run it (``_execute``) and keeps the plan for ``transition``.

    @command
    def acquire_lease(self, attempt_id: UUID, holder: str) -> Command[LeaseGrant]:
        return Command(
            lambda a, c: a.acquire_lease(c, attempt_id, holder, self.env.options), holder
        )

    @command
    def renew_lease(self, attempt_id: UUID, holder: str, fencing_token: int) -> Command[LeaseGrant]:
        return Command(
            lambda a, c: a.renew_lease(c, attempt_id, holder, fencing_token, self.env.options),
            holder,
        )

    @command
    def report_outcome(
        self,
        attempt_id: UUID,
        holder: str,
        fencing_token: int,
        outcome: AttemptOutcome,
        *,
        failure_class: FailureClass | None = None,
        outcome_hash: str | None = None,
        command_id: str | None = None,
    ) -> Command[Attempt]:
        def decide(a: RunAggregate, c: CommandContext) -> Attempt:
            attempt = a.report_outcome(
                c,
                attempt_id,
                holder,
                fencing_token,
                outcome,
                self.env.options,
                failure_class=failure_class,
                outcome_hash=outcome_hash,
            )
            self._dispatch_due(a, c)
            return attempt

        return Command(decide, holder, command_id)

    @command
    def request_approval(
        self,
        attempt_id: UUID,
        holder: str,
        fencing_token: int,
        proposal_hash: str,
        *,
        action_class: SideEffectClass | None = None,
    ) -> Command[ApprovalRequest | None]:
        policy = self._pinned_policy()
        return Command(
            lambda a, c: a.request_approval(
                c,
                attempt_id,
                holder,
                fencing_token,
                proposal_hash,
                policy,
                self.env.options,
                action_class=action_class,
            ),
            holder,
        )

    @command
    def decide(
        self,
        approval_id: UUID,
        principal: Principal,
        decision: Decision,
        version: int,
        proposal_hash: str,
        reason: str | None = None,
    ) -> Command[ApprovalRequest]:
        if principal.tenant_id != self.tenant_id:
            raise errors.ApprovalNotFound("approval not found")
        policy = self._pinned_policy()
        return Command(
            lambda a, c: a.decide_approval(
                c,
                approval_id,
                principal,
                decision,
                version,
                proposal_hash,
                reason,
                policy,
                self.env.options,
            ),
            principal.subject,
        )

    @command
    def cancel(self, requested_by: str, reason: str) -> Command[str]:
        """Record the intent; answer the state observed after it (not an assumed one)."""

        def decide(a: RunAggregate, c: CommandContext) -> str:
            a.cancel(c, requested_by, reason, self.env.options)
            return str(a.run.state)

        return Command(decide, requested_by)

    def open_attempts(self) -> list[UUID]:
        """Ids of the run's non-terminal attempts (a read of the activation's cache)."""
        return [a.attempt_id for a in self._load_cached().open_attempts()]

    def wake(self) -> list[str]:
        """Do whatever is due (the reminder): expire leases and approvals, dispatch retries."""
        agg = self._load_cached()
        done: list[str] = []
        if agg.run.state.terminal:
            return done
        if agg.run.state.value == "Accepted":
            self.start()
            return ["start"]
        options = self.env.options

        def decide(a: RunAggregate, c: CommandContext) -> None:
            for attempt_id in list(a.leases):
                if a.expire_lease(c, attempt_id, options):
                    done.append(f"lease-expired:{attempt_id}")
            for approval in a.pending_approvals():
                if a.expire_approval(c, approval.approval_id):
                    done.append(f"approval-expired:{approval.approval_id}")
            if self._dispatch_due(a, c) is not None:
                done.append("dispatched")

        self._execute(Command(decide, "reminder"))
        return done

    def _pinned_policy(self) -> Any:
        run = self._load_cached().run
        return self.env.policies.revision(self.tenant_id, run.policy.policy_id, run.policy.revision)
