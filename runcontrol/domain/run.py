"""The run aggregate: every rule about a run, its steps, attempts, leases and approvals.

``RunAggregate`` is pure: commands take a ``CommandContext`` (clock reading, id source, jitter,
actor) and ``Options``, mutate the in-memory entities, and record what must be persisted in one
transaction: changed entities, outbox events, journal entries and audit records. Validation
always happens before the first mutation, so a command that raises leaves the aggregate as it
was, except for audit records that must be kept even when the command is refused.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from . import errors
from .hashing import canonical_hash, is_hash
from .machines import (
    APPROVAL_TRANSITIONS,
    ATTEMPT_RESOLUTIONS,
    ATTEMPT_TRANSITIONS,
    RUN_TRANSITIONS,
    STEP_TRANSITIONS,
    TOOL_CALL_TRANSITIONS,
    check,
)
from .model import (
    TOPICS,
    ApprovalDecision,
    ApprovalRequest,
    Attempt,
    AuditRecord,
    CancellationIntent,
    Event,
    Lease,
    Limits,
    PolicyRef,
    ProgressAck,
    ProgressMessage,
    RecoveryJournalEntry,
    ReleaseRef,
    Run,
    Step,
    ToolCall,
    ToolCallClaim,
)
from .retry import backoff_delay
from .states import (
    ApprovalState,
    AttemptOutcome,
    AttemptState,
    Decision,
    ExpiryAction,
    FailureClass,
    Role,
    RunState,
    SideEffectClass,
    StepState,
    ToolCallState,
    ToolCallStatus,
)
from .workflow import PolicyDocument, Release

# Who decides an approval that expired (``decided_by``): the reconciler, on the policy's behalf.
APPROVAL_EXPIRY = "approval-expiry-reconciler"

WORKER_OUTCOMES = frozenset(
    {
        AttemptOutcome.SUCCEEDED,
        AttemptOutcome.FAILED,
        AttemptOutcome.UNCERTAIN,
        AttemptOutcome.CANCELLED,
    }
)


@dataclass(frozen=True, slots=True)
class Options:
    """The spec's RunControl options that the rules read (see ``runcontrol.config``)."""

    lease_seconds: float = 120
    renewal_grace_seconds: float = 30
    default_max_attempts: int = 3
    approval_expiry_hours: float = 72
    retry_base_seconds: float = 1.0
    retry_cap_seconds: float = 300.0
    # How long a committed command's answer answers its resends (exactly-once window).
    answer_retention_seconds: float = 86400.0
    # How long the holders of a cancelled run's leases have to stop and report, before the
    # reminder settles their attempts Uncertain (RunControl:Cancel:StopTimeoutSeconds).
    cancel_stop_timeout_seconds: float = 120.0
    # The same for a run the control plane itself cancels (wall clock, lifetime): cancelGrace.
    cancel_grace_seconds: float = 30.0
    # Every run is cancelled this long after it was accepted (RunControl:Runs:MaxLifetimeHours).
    max_run_lifetime_seconds: float = 86400.0
    # A claimed tool call without a result this long is closed by the reminder, never
    # executed (RunControl:ToolCalls:ClaimTimeoutSeconds).
    tool_call_claim_timeout_seconds: float = 300.0


# At most this many progress messages per report (one transaction).
PROGRESS_BATCH_MAX = 50
MAX_CALL_ID = 200
CLAIM_TIMED_OUT = "no result before the claim timeout; never executed"

# Reasons of the cancellations the control plane itself records.
WALL_CLOCK_EXCEEDED = "wall-clock-exceeded"
LIFETIME_EXCEEDED = "lifetime-exceeded"
RUN_CONTROL = "run-control"  # the actor of what the reminder does on its own
RESTORED_FROM_BACKUP = "restored-from-backup"  # why restore-check settles a lease
RESTORE_CHECK = "restore-check"  # the actor of that settlement


@dataclass(slots=True)
class CommandContext:
    now: datetime
    actor: str
    command_id: str | None = None
    new_id: Callable[[], UUID] = uuid.uuid4
    uniform: Callable[[float, float], float] = random.uniform


@dataclass(frozen=True, slots=True)
class Principal:
    """Who issues a command, taken from a verified token (never from a request body)."""

    subject: str
    tenant_id: str
    project_id: str
    roles: frozenset[Role] = frozenset()


@dataclass(slots=True)
class Changes:
    """What one command must persist, atomically."""

    run: Run
    expected_version: int | None
    steps: dict[UUID, Step] = field(default_factory=dict)
    attempts: dict[UUID, Attempt] = field(default_factory=dict)
    leases: dict[UUID, Lease] = field(default_factory=dict)
    approvals: dict[UUID, ApprovalRequest] = field(default_factory=dict)
    decisions: list[ApprovalDecision] = field(default_factory=list)
    intents: list[CancellationIntent] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    journal: list[RecoveryJournalEntry] = field(default_factory=list)
    audits: list[AuditRecord] = field(default_factory=list)
    tool_calls: dict[UUID, ToolCall] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        return not (
            self.steps
            or self.attempts
            or self.leases
            or self.approvals
            or self.decisions
            or self.intents
            or self.events
            or self.journal
            or self.tool_calls
            or self.run_dirty
        )

    run_dirty: bool = False


@dataclass(frozen=True, slots=True)
class Submission:
    run_id: UUID
    tenant_id: str
    project_id: str
    idempotency_key: str
    workflow_id: str
    model_profile_id: str
    input_hash: str
    snapshot_id: UUID
    requested_by: str
    environment_id: str | None = None
    limits: Limits = Limits()
    correlation_id: str | None = None
    input: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    run_id: UUID
    step_id: UUID
    attempt_id: UUID
    lease_id: UUID
    fencing_token: int
    holder: str
    expires_at: datetime
    agent_id: str
    skill_id: str | None
    attempt_number: int
    side_effect_class: SideEffectClass
    gate: str = "none"
    cancel_requested: bool = False
    # Set when the attempt resumes after a human approved this exact proposal: a holder whose
    # proposal hashes the same may execute at once (asking again answers the same approval).
    approved_proposal_hash: str | None = None


class RunAggregate:
    def __init__(
        self,
        run: Run,
        steps: Iterable[Step],
        attempts: Iterable[Attempt] = (),
        leases: Iterable[Lease] = (),
        approvals: Iterable[ApprovalRequest] = (),
        decisions: Iterable[ApprovalDecision] = (),
        intents: Iterable[CancellationIntent] = (),
        tool_calls: Iterable[ToolCall] = (),
        *,
        is_new: bool = False,
    ) -> None:
        self.run = run
        self.steps: list[Step] = sorted(steps, key=lambda s: s.ordinal)
        self.attempts: dict[UUID, Attempt] = {a.attempt_id: a for a in attempts}
        self.leases: dict[UUID, Lease] = {}
        for lease in leases:
            if lease.current:
                self.leases[lease.attempt_id] = lease
        self.approvals: dict[UUID, ApprovalRequest] = {a.approval_id: a for a in approvals}
        self.decisions: dict[UUID, list[ApprovalDecision]] = {}
        for d in decisions:
            self.decisions.setdefault(d.approval_id, []).append(d)
        self.intents: list[CancellationIntent] = sorted(intents, key=lambda i: i.requested_at)
        self.tool_calls: dict[str, ToolCall] = {t.call_id: t for t in tool_calls}
        self._is_new = is_new
        self._changes = self._fresh_changes()

    # ------------------------------------------------------------------ bookkeeping

    def _fresh_changes(self) -> Changes:
        expected = None if self._is_new else self.run.version
        return Changes(run=self.run, expected_version=expected, run_dirty=self._is_new)

    def take_changes(self) -> Changes:
        """Hand the pending writes to the unit of work and start a new batch."""
        changes = self._changes
        if changes.run_dirty and not self._is_new:
            self.run.version += 1
        self._is_new = False
        self._changes = self._fresh_changes()
        return changes

    def take_audits(self) -> list[AuditRecord]:
        audits, self._changes.audits = self._changes.audits, []
        return audits

    def _touch(self, ctx: CommandContext) -> None:
        self.run.updated_at = ctx.now
        self._changes.run_dirty = True

    def _emit(
        self,
        ctx: CommandContext,
        event_type: str,
        payload: dict[str, Any],
        *,
        step_id: UUID | None = None,
        attempt_id: UUID | None = None,
    ) -> None:
        self.run.event_seq += 1
        self._touch(ctx)
        self._changes.events.append(
            Event(
                event_id=ctx.new_id(),
                run_id=self.run.run_id,
                tenant_id=self.run.tenant_id,
                project_id=self.run.project_id,
                seq=self.run.event_seq,
                event_type=event_type,
                topic=TOPICS[event_type],
                payload=payload,
                occurred_at=ctx.now,
                step_id=step_id,
                attempt_id=attempt_id,
                correlation_id=self.run.correlation_id or str(self.run.run_id),
                causation_id=ctx.command_id,
            )
        )

    def _journal(
        self,
        ctx: CommandContext,
        entity: str,
        entity_id: UUID,
        from_state: str | None,
        to_state: str,
        cause: str,
    ) -> None:
        self.run.journal_seq += 1
        self._touch(ctx)
        self._changes.journal.append(
            RecoveryJournalEntry(
                run_id=self.run.run_id,
                tenant_id=self.run.tenant_id,
                sequence=self.run.journal_seq,
                entity=entity,
                entity_id=entity_id,
                from_state=from_state,
                to_state=to_state,
                cause=cause,
                actor=ctx.actor,
                occurred_at=ctx.now,
            )
        )

    def _audit(self, ctx: CommandContext, kind: str, **detail: Any) -> None:
        self._changes.audits.append(
            AuditRecord(
                tenant_id=self.run.tenant_id,
                run_id=self.run.run_id,
                kind=kind,
                actor=ctx.actor,
                detail={k: (str(v) if isinstance(v, UUID) else v) for k, v in detail.items()},
                occurred_at=ctx.now,
            )
        )

    # ------------------------------------------------------------------ transitions

    def _move_run(self, ctx: CommandContext, target: RunState, cause: str | None = None) -> None:
        current = self.run.state
        spec_cause = check("Run", RUN_TRANSITIONS, current, target)
        self.run.state = target
        if target.terminal:
            self.run.suspended_at = None  # a suspension ends with the run
        self._journal(ctx, "Run", self.run.run_id, current, target, cause or spec_cause)
        self._emit(
            ctx,
            "RunStateChanged",
            {
                "runId": str(self.run.run_id),
                "tenantId": self.run.tenant_id,
                "fromState": str(current),
                "toState": str(target),
                "cause": cause or spec_cause,
            },
        )

    def _move_step(self, ctx: CommandContext, step: Step, target: StepState, cause: str) -> None:
        current = step.state
        check("Step", STEP_TRANSITIONS, current, target)
        step.state = target
        self._changes.steps[step.step_id] = step
        self._journal(ctx, "Step", step.step_id, current, target, cause)

    def _move_attempt(
        self, ctx: CommandContext, attempt: Attempt, target: AttemptState, cause: str
    ) -> None:
        current = attempt.state
        check("Attempt", ATTEMPT_TRANSITIONS, current, target)
        attempt.state = target
        self._changes.attempts[attempt.attempt_id] = attempt
        self._journal(ctx, "Attempt", attempt.attempt_id, current, target, cause)

    def _move_approval(
        self, ctx: CommandContext, approval: ApprovalRequest, target: ApprovalState, cause: str
    ) -> None:
        current = approval.state
        check("ApprovalRequest", APPROVAL_TRANSITIONS, current, target)
        approval.state = target
        approval.version += 1
        self._changes.approvals[approval.approval_id] = approval
        self._journal(ctx, "ApprovalRequest", approval.approval_id, current, target, cause)

    # ------------------------------------------------------------------ queries

    def step(self, step_id: UUID) -> Step:
        for step in self.steps:
            if step.step_id == step_id:
                return step
        raise errors.StepNotFound(f"step {step_id} not found", step_id=str(step_id))

    def attempt(self, attempt_id: UUID) -> Attempt:
        try:
            return self.attempts[attempt_id]
        except KeyError:
            raise errors.AttemptNotFound(
                f"attempt {attempt_id} not found", attempt_id=str(attempt_id)
            ) from None

    def approval(self, approval_id: UUID) -> ApprovalRequest:
        try:
            return self.approvals[approval_id]
        except KeyError:
            raise errors.ApprovalNotFound(
                f"approval {approval_id} not found", approval_id=str(approval_id)
            ) from None

    def attempts_of(self, step: Step) -> list[Attempt]:
        return sorted(
            (a for a in self.attempts.values() if a.step_id == step.step_id),
            key=lambda a: a.number,
        )

    def open_attempts(self) -> list[Attempt]:
        return [a for a in self.attempts.values() if not a.state.terminal]

    def pending_approvals(self) -> list[ApprovalRequest]:
        return [a for a in self.approvals.values() if a.state is ApprovalState.PENDING]

    def next_due(self, options: Options) -> datetime | None:
        """When this run next needs a command nobody will send (its durable reminder)."""
        state = self.run.state
        if state.terminal:
            return None
        if state is RunState.ACCEPTED:
            return self.run.created_at  # budget and first dispatch are due at once
        times: list[datetime] = []
        if state is RunState.CANCELLING:
            stop = self.stop_deadline(options)
            if stop is not None:
                times.append(stop)
        elif state is not RunState.WAITING_FOR_APPROVAL:  # a human's wait has its own expiry
            times.append(self.deadline(options))
        if state is RunState.RUNNING and self.run.suspended_at is None:
            step = self._first_open_step()
            if step is not None and step.state is StepState.PENDING:
                times.append(step.not_before or self.run.updated_at)
        if state is not RunState.WAITING_FOR_APPROVAL:
            grace = timedelta(seconds=options.renewal_grace_seconds)
            times.extend(lease.expires_at + grace for lease in self.leases.values())
        times.extend(a.expires_at for a in self.pending_approvals())
        times.extend(t.expires_at for t in self.open_tool_calls())
        return min(times) if times else None

    def _first_open_step(self) -> Step | None:
        return next((s for s in self.steps if not s.state.terminal), None)

    def lease_grant(self, attempt: Attempt, lease: Lease) -> LeaseGrant:
        step = self.step(attempt.step_id)
        return LeaseGrant(
            run_id=self.run.run_id,
            step_id=step.step_id,
            attempt_id=attempt.attempt_id,
            lease_id=lease.lease_id,
            fencing_token=lease.fencing_token,
            holder=lease.holder,
            expires_at=lease.expires_at,
            agent_id=step.agent_id,
            skill_id=step.skill_id,
            attempt_number=attempt.number,
            side_effect_class=step.side_effect_class,
            gate=step.gate,
            cancel_requested=self.run.state is RunState.CANCELLING,
            approved_proposal_hash=self._approved_hash(attempt),
        )

    def _approved_hash(self, attempt: Attempt) -> str | None:
        approved = [
            a
            for a in self.approvals.values()
            if a.attempt_id == attempt.attempt_id and a.state is ApprovalState.APPROVED
        ]
        return max(approved, key=lambda a: a.created_at).proposal_hash if approved else None

    # ------------------------------------------------------------------ SubmitRun

    @classmethod
    def accept(
        cls,
        submission: Submission,
        release: Release,
        policy: PolicyDocument,
        options: Options,
        ctx: CommandContext,
    ) -> RunAggregate:
        if not is_hash(submission.input_hash):
            raise errors.ValidationFailed("inputHash must be a sha256 canonical hash")
        if release.workflow_id != submission.workflow_id:
            raise errors.ValidationFailed("release does not belong to the submitted workflow")
        limits = submission.limits
        run = Run(
            run_id=submission.run_id,
            tenant_id=submission.tenant_id,
            project_id=submission.project_id,
            environment_id=submission.environment_id,
            idempotency_key=submission.idempotency_key,
            workflow_id=submission.workflow_id,
            release=ReleaseRef(release.release_id, release.content_hash),
            policy=PolicyRef(policy.policy_id, policy.revision),
            model_profile_id=submission.model_profile_id,
            state=RunState.ACCEPTED,
            input_hash=submission.input_hash,
            snapshot_id=submission.snapshot_id,
            requested_by=submission.requested_by,
            created_at=ctx.now,
            updated_at=ctx.now,
            limits=limits,  # limits.max_minutes runs from the first lease grant (deadline_at)
            correlation_id=submission.correlation_id,
            input=submission.input,
        )
        steps = [
            Step(
                step_id=ctx.new_id(),
                run_id=run.run_id,
                tenant_id=run.tenant_id,
                ordinal=i + 1,
                name=spec.name,
                agent_id=spec.agent_id,
                skill_id=spec.skill_id,
                state=StepState.PENDING,
                max_attempts=spec.max_attempts or options.default_max_attempts,
                gate=spec.gate,
                side_effect_class=spec.side_effect_class,
            )
            for i, spec in enumerate(release.definition.steps)
        ]
        agg = cls(run, steps, is_new=True)
        for step in steps:
            agg._changes.steps[step.step_id] = step
        agg._journal(ctx, "Run", run.run_id, None, RunState.ACCEPTED, "SubmitRun")
        agg._emit(
            ctx,
            "RunAccepted",
            {
                "runId": str(run.run_id),
                "tenantId": run.tenant_id,
                "projectId": run.project_id,
                "workflowId": run.workflow_id,
                "releaseId": run.release_id,
                "policyRevision": run.policy_revision,
                "modelProfileId": run.model_profile_id,
                "requestedBy": run.requested_by,
            },
        )
        return agg

    def assert_same_submission(self, input_hash: str) -> None:
        """Invariant 1: same key + same canonical input -> same run; otherwise a conflict."""
        if input_hash != self.run.input_hash:
            raise errors.IdempotencyConflict(
                "this Idempotency-Key was used with a different payload",
                run_id=str(self.run.run_id),
            )

    def record_budget_reservation(self, reservation_id: UUID) -> None:
        self.run.budget_reservation_id = reservation_id
        self._changes.run_dirty = True

    def deny_budget(self, ctx: CommandContext, reason: str) -> None:
        self._fail_run(ctx, FailureClass.POLICY_DENIED, reason, cause="BudgetReservationDenied")

    # ------------------------------------------------------------------ dispatch

    def dispatchable_step(self, now: datetime) -> Step | None:
        """The next step to dispatch now, if the run may dispatch at all (invariant 4)."""
        if self.run.state not in (RunState.ACCEPTED, RunState.RUNNING):
            return None
        if self.run.suspended_at is not None:
            return None  # an operator suspended the run: nothing new starts
        step = self._first_open_step()  # steps run in order
        if step is None or step.state is not StepState.PENDING:
            return None
        if step.not_before is not None and step.not_before > now:
            return None
        return step

    def dispatch(self, ctx: CommandContext, step: Step) -> Attempt:
        if self.run.state not in (RunState.ACCEPTED, RunState.RUNNING):
            raise errors.IllegalTransition(
                f"no dispatch while the run is {self.run.state}", run_state=str(self.run.state)
            )
        if any(not a.state.terminal for a in self.attempts_of(step)):
            raise errors.IllegalTransition(
                "a step may have only one non-terminal attempt", step_id=str(step.step_id)
            )
        previous = self.attempts_of(step)
        attempt = Attempt(
            attempt_id=ctx.new_id(),
            step_id=step.step_id,
            run_id=self.run.run_id,
            tenant_id=self.run.tenant_id,
            number=len(previous) + 1,
            state=AttemptState.DISPATCHED,
            dispatched_at=ctx.now,
        )
        self._move_step(ctx, step, StepState.RUNNING, "AttemptDispatched")
        step.not_before = None
        self.attempts[attempt.attempt_id] = attempt
        self._changes.attempts[attempt.attempt_id] = attempt
        self._journal(
            ctx, "Attempt", attempt.attempt_id, None, AttemptState.DISPATCHED, "RunDispatcher"
        )
        # Dispatch is pull-based: the lease and its fencing token are granted when a worker
        # claims the attempt (LeaseGranted), so they are null here.
        self._emit(
            ctx,
            "AttemptDispatched",
            {
                "runId": str(self.run.run_id),
                "stepId": str(step.step_id),
                "attemptId": str(attempt.attempt_id),
                "leaseId": None,
                "fencingToken": None,
                "agentId": step.agent_id,
                "skillId": step.skill_id,
                "attemptNumber": attempt.number,
            },
            step_id=step.step_id,
            attempt_id=attempt.attempt_id,
        )
        if self.run.state is RunState.ACCEPTED:
            self._move_run(ctx, RunState.RUNNING)
        return attempt

    # ------------------------------------------------------------------ leases

    def acquire_lease(
        self, ctx: CommandContext, attempt_id: UUID, holder: str, options: Options
    ) -> LeaseGrant:
        attempt = self.attempt(attempt_id)
        if not holder:
            raise errors.ValidationFailed("a lease needs a holder identity")
        if attempt.state is AttemptState.LEASED:
            lease = self.leases[attempt_id]
            if lease.holder == holder:
                return self.lease_grant(attempt, lease)  # a retried claim: same lease
            raise errors.LeaseHeld("the attempt is leased to another worker")
        if attempt.state.terminal:
            raise errors.LeaseRejected(
                f"the attempt is settled ({attempt.state})", attempt_id=str(attempt_id)
            )
        if attempt.state is AttemptState.PARKED:
            raise errors.LeaseRejected(
                "the attempt waits for an approval decision", attempt_id=str(attempt_id)
            )
        if self.run.state is not RunState.RUNNING:
            raise errors.LeaseRejected(
                f"no lease while the run is {self.run.state}", run_state=str(self.run.state)
            )
        if self.run.suspended_at is not None:
            raise errors.LeaseRejected("no new lease while the run is suspended", suspended=True)
        self.run.fencing_seq += 1
        if self.run.deadline_at is None and self.run.limits.max_minutes:
            # The wall-clock budget runs from the first lease grant: work starts there.
            self.run.deadline_at = ctx.now + timedelta(minutes=self.run.limits.max_minutes)
        lease = Lease(
            lease_id=ctx.new_id(),
            attempt_id=attempt_id,
            run_id=self.run.run_id,
            tenant_id=self.run.tenant_id,
            holder=holder,
            fencing_token=self.run.fencing_seq,
            granted_at=ctx.now,
            expires_at=ctx.now + timedelta(seconds=options.lease_seconds),
        )
        self._move_attempt(ctx, attempt, AttemptState.LEASED, "LeaseGranted")
        attempt.lease_id = lease.lease_id
        attempt.fencing_token = lease.fencing_token
        attempt.holder = holder
        self.leases[attempt_id] = lease
        self._changes.leases[lease.lease_id] = lease
        self._emit(
            ctx,
            "LeaseGranted",
            {
                "runId": str(self.run.run_id),
                "stepId": str(attempt.step_id),
                "attemptId": str(attempt_id),
                "leaseId": str(lease.lease_id),
                "fencingToken": lease.fencing_token,
                "holder": holder,
                "expiresAt": lease.expires_at.isoformat(),
            },
            step_id=attempt.step_id,
            attempt_id=attempt_id,
        )
        return self.lease_grant(attempt, lease)

    def _held_lease(
        self,
        ctx: CommandContext,
        attempt: Attempt,
        holder: str,
        token: int,
        options: Options,
        lease_id: UUID | None = None,
    ) -> Lease:
        """The caller's lease if it is the current one; otherwise audit and refuse (inv. 5).
        ``lease_id``, when the caller names its lease, must be the current lease's id."""
        lease = self.leases.get(attempt.attempt_id)
        if lease is None or attempt.state is not AttemptState.LEASED:
            self._audit(
                ctx,
                "lease-rejected",
                attempt_id=attempt.attempt_id,
                holder=holder,
                fencing_token=token,
                reason="no current lease",
            )
            raise errors.StaleFencingToken(
                "the attempt has no current lease for this token",
                attempt_id=str(attempt.attempt_id),
            )
        if token != lease.fencing_token:
            self._audit(
                ctx,
                "stale-fencing-token",
                attempt_id=attempt.attempt_id,
                holder=holder,
                fencing_token=token,
                current_token=lease.fencing_token,
            )
            raise errors.StaleFencingToken(
                f"fencing token {token} is stale (current {lease.fencing_token})",
                attempt_id=str(attempt.attempt_id),
            )
        if lease_id is not None and lease_id != lease.lease_id:
            self._audit(
                ctx,
                "lease-rejected",
                attempt_id=attempt.attempt_id,
                holder=holder,
                fencing_token=token,
                reason=f"lease {lease_id} is not the current lease",
            )
            raise errors.StaleFencingToken(
                f"lease {lease_id} is not the attempt's current lease",
                attempt_id=str(attempt.attempt_id),
            )
        if holder != lease.holder:
            self._audit(
                ctx,
                "lease-not-held",
                attempt_id=attempt.attempt_id,
                holder=holder,
                fencing_token=token,
            )
            raise errors.LeaseNotHeld("the caller does not hold this lease")
        deadline = lease.expires_at + timedelta(seconds=options.renewal_grace_seconds)
        if ctx.now > deadline and self.run.state is not RunState.WAITING_FOR_APPROVAL:
            self._audit(
                ctx,
                "lease-expired",
                attempt_id=attempt.attempt_id,
                holder=holder,
                fencing_token=token,
            )
            raise errors.LeaseExpired("the lease expired and is being reconciled")
        return lease

    def renew_lease(
        self,
        ctx: CommandContext,
        attempt_id: UUID,
        holder: str,
        fencing_token: int,
        options: Options,
        *,
        lease_id: UUID | None = None,
    ) -> LeaseGrant:
        attempt = self.attempt(attempt_id)
        lease = self._held_lease(ctx, attempt, holder, fencing_token, options, lease_id)
        stop = self.stop_deadline(options)
        if stop is not None and ctx.now >= stop:
            self._audit(
                ctx,
                "renewal-after-stop-timeout",
                attempt_id=attempt_id,
                holder=holder,
                fencing_token=fencing_token,
            )
            raise errors.LeaseRejected(
                "the run was cancelled and its stop timeout has passed",
                attempt_id=str(attempt_id),
            )
        lease.expires_at = ctx.now + timedelta(seconds=options.lease_seconds)
        self._changes.leases[lease.lease_id] = lease
        self._touch(ctx)
        return self.lease_grant(attempt, lease)

    def _release_lease(self, ctx: CommandContext, attempt: Attempt, cause: str) -> Lease | None:
        lease = self.leases.pop(attempt.attempt_id, None)
        if lease is not None:
            lease.released_at = ctx.now
            lease.release_cause = cause
            self._changes.leases[lease.lease_id] = lease
        return lease

    # ------------------------------------------------------------------ outcomes

    def report_outcome(
        self,
        ctx: CommandContext,
        attempt_id: UUID,
        holder: str,
        fencing_token: int,
        outcome: AttemptOutcome,
        options: Options,
        *,
        failure_class: FailureClass | None = None,
        outcome_hash: str | None = None,
        lease_id: UUID | None = None,
    ) -> Attempt:
        attempt = self.attempt(attempt_id)
        if outcome not in WORKER_OUTCOMES:
            raise errors.ValidationFailed(f"a worker cannot report {outcome}")
        if outcome_hash is not None and not is_hash(outcome_hash):
            raise errors.ValidationFailed("outcomeHash must be a sha256 canonical hash")
        failure_class = _failure_class_for(outcome, failure_class)
        if attempt.state.terminal:
            if (
                attempt.settled_by == holder
                and attempt.fencing_token == fencing_token
                and attempt.outcome is outcome
                and attempt.outcome_hash == outcome_hash
                and attempt.failure_class == failure_class
            ):
                return attempt  # the same report retried (at-least-once delivery): no effect
            if attempt.settled_by == holder and attempt.fencing_token == fencing_token:
                self._audit(
                    ctx,
                    "duplicate-outcome",
                    attempt_id=attempt_id,
                    holder=holder,
                    fencing_token=fencing_token,
                    outcome=str(outcome),
                )
                raise errors.OutcomeAlreadyRecorded(
                    "this attempt already has its outcome", attempt_id=str(attempt_id)
                )
            self._audit(
                ctx,
                "stale-fencing-token",
                attempt_id=attempt_id,
                holder=holder,
                fencing_token=fencing_token,
                reason=f"attempt settled as {attempt.state}",
            )
            raise errors.StaleFencingToken(
                f"the attempt was settled as {attempt.state}; this lease is stale",
                attempt_id=str(attempt_id),
            )
        self._held_lease(ctx, attempt, holder, fencing_token, options, lease_id)
        if any(a.attempt_id == attempt_id for a in self.pending_approvals()):
            raise errors.IllegalTransition(
                "the attempt awaits an approval decision; report after the decision"
            )
        self._settle(ctx, attempt, outcome, failure_class, outcome_hash, settled_by=holder)
        self._after_settled(ctx, attempt, options)
        return attempt

    def _settle(
        self,
        ctx: CommandContext,
        attempt: Attempt,
        outcome: AttemptOutcome,
        failure_class: FailureClass | None,
        outcome_hash: str | None,
        *,
        settled_by: str,
        cause: str = "OutcomeReported",
    ) -> None:
        self._move_attempt(ctx, attempt, outcome.attempt_state, cause)
        attempt.outcome = outcome
        attempt.failure_class = failure_class
        attempt.outcome_hash = outcome_hash
        attempt.settled_at = ctx.now
        attempt.settled_by = settled_by
        self._release_lease(ctx, attempt, cause)
        self._emit(
            ctx,
            "AttemptOutcomeRecorded",
            {
                "runId": str(self.run.run_id),
                "stepId": str(attempt.step_id),
                "attemptId": str(attempt.attempt_id),
                "outcome": str(outcome),
                "failureClass": str(failure_class) if failure_class else None,
                "outcomeHash": outcome_hash,
            },
            step_id=attempt.step_id,
            attempt_id=attempt.attempt_id,
        )

    def _after_settled(self, ctx: CommandContext, attempt: Attempt, options: Options) -> None:
        step = self.step(attempt.step_id)
        outcome = attempt.outcome
        if self.run.state is RunState.CANCELLING:
            if outcome is AttemptOutcome.SUCCEEDED:
                # Completed effects stay visible (invariant 8): the step did succeed.
                step.outcome_hash = attempt.outcome_hash
                self._move_step(ctx, step, StepState.SUCCEEDED, "AttemptSucceeded")
            else:
                self._move_step(ctx, step, StepState.CANCELLED, "RunCancelled")
            self._finish_cancelling(ctx)
            return
        if outcome is AttemptOutcome.SUCCEEDED:
            step.outcome_hash = attempt.outcome_hash
            self._move_step(ctx, step, StepState.SUCCEEDED, "AttemptSucceeded")
            if all(s.state is StepState.SUCCEEDED for s in self.steps):
                self.run.outcome_hash = canonical_hash([s.outcome_hash for s in self.steps])
                self._move_run(ctx, RunState.COMPLETED)
                self._emit(
                    ctx,
                    "RunCompleted",
                    {
                        "runId": str(self.run.run_id),
                        "tenantId": self.run.tenant_id,
                        "outcomeHash": self.run.outcome_hash,
                    },
                )
            return
        failure = attempt.failure_class or FailureClass.TRANSIENT
        if failure is FailureClass.UNCERTAIN and step.side_effect_class.at_least(
            SideEffectClass.SHARED_WRITE
        ):
            # Invariant 6: a side effect may have happened; never retry on our own.
            step.failure_class = failure
            self._move_step(ctx, step, StepState.FAILED, "UncertainOutcome")
            self._fail_run(
                ctx,
                FailureClass.UNCERTAIN,
                f"step {step.name!r} ended Uncertain with side-effect class "
                f"{step.side_effect_class}; an operator must resolve it",
            )
            return
        retryable = failure.retryable or failure is FailureClass.UNCERTAIN
        if retryable and attempt.number < step.max_attempts:
            delay = backoff_delay(
                attempt.number,
                base_seconds=options.retry_base_seconds,
                cap_seconds=options.retry_cap_seconds,
                uniform=ctx.uniform,
            )
            step.not_before = ctx.now + timedelta(seconds=delay)
            self._move_step(ctx, step, StepState.PENDING, "RetryScheduled")
            self._emit(
                ctx,
                "StepRetryScheduled",
                {
                    "runId": str(self.run.run_id),
                    "stepId": str(step.step_id),
                    "nextAttemptNumber": attempt.number + 1,
                    "notBefore": step.not_before.isoformat(),
                },
                step_id=step.step_id,
            )
            return
        step.failure_class = failure
        self._move_step(ctx, step, StepState.FAILED, "AttemptFailedTerminally")
        reason = f"step {step.name!r} failed after {attempt.number} attempt(s) ({failure})"
        self._fail_run(ctx, failure, reason)

    def _fail_run(
        self,
        ctx: CommandContext,
        failure_class: FailureClass,
        reason: str,
        *,
        cause: str | None = None,
    ) -> None:
        self._move_run(ctx, RunState.FAILED, cause)
        self.run.failure_class = failure_class
        self.run.failure_reason = reason
        self._close_remaining(ctx, failure_class)
        self._emit(
            ctx,
            "RunFailed",
            {
                "runId": str(self.run.run_id),
                "tenantId": self.run.tenant_id,
                "failureClass": str(failure_class),
                "reason": reason,
            },
        )

    def _cancel_unleased(self, ctx: CommandContext, attempt: Attempt) -> None:
        """An attempt nobody holds settles as Cancelled at once: a Dispatched one never ran; a
        Parked one stopped before its side effect, which waited for the decision."""
        cause = (
            "CancelledWhileParked"
            if attempt.state is AttemptState.PARKED
            else "CancelledBeforeLease"
        )
        self._move_attempt(ctx, attempt, AttemptState.CANCELLED, cause)
        attempt.outcome = AttemptOutcome.CANCELLED
        attempt.failure_class = FailureClass.CANCELLATION
        attempt.settled_at = ctx.now
        attempt.settled_by = "run-control"

    def _close_remaining(self, ctx: CommandContext, failure_class: FailureClass) -> None:
        """On a terminal run: settle open attempts, cancel pending approvals and steps."""
        for attempt in self.open_attempts():
            if attempt.state is not AttemptState.LEASED:
                self._cancel_unleased(ctx, attempt)
            else:
                self._settle(
                    ctx,
                    attempt,
                    AttemptOutcome.CANCELLED,
                    failure_class,
                    None,
                    settled_by="run-control",
                    cause="RunEnded",
                )
        for approval in self.pending_approvals():
            self._move_approval(ctx, approval, ApprovalState.CANCELLED, "RunCancelled")
            self._emit_approval_decided(ctx, approval)
        for step in self.steps:
            if step.state is StepState.PENDING:
                self._move_step(ctx, step, StepState.CANCELLED, "RunEnded")
            elif step.state is StepState.RUNNING:
                self._move_step(ctx, step, StepState.CANCELLED, "RunCancelled")

    # ------------------------------------------------------------------ lease expiry

    def expire_lease(self, ctx: CommandContext, attempt_id: UUID, options: Options) -> bool:
        """LeaseExpiryReconciler: settle an attempt whose lease passed expiry + grace."""
        attempt = self.attempts.get(attempt_id)
        lease = self.leases.get(attempt_id)
        if attempt is None or lease is None or attempt.state is not AttemptState.LEASED:
            return False
        if self.run.state is RunState.WAITING_FOR_APPROVAL:
            return False  # the lease is suspended while a human decides
        if ctx.now <= lease.expires_at + timedelta(seconds=options.renewal_grace_seconds):
            return False
        step = self.step(attempt.step_id)
        side_effecting = step.side_effect_class.at_least(SideEffectClass.SHARED_WRITE)
        outcome = AttemptOutcome.UNCERTAIN if side_effecting else AttemptOutcome.TIMED_OUT
        failure = FailureClass.UNCERTAIN if side_effecting else FailureClass.TRANSIENT
        self._emit(
            ctx,
            "LeaseExpired",
            {
                "attemptId": str(attempt_id),
                "leaseId": str(lease.lease_id),
                "holder": lease.holder,
                "fencingToken": lease.fencing_token,
            },
            step_id=step.step_id,
            attempt_id=attempt_id,
        )
        if outcome is AttemptOutcome.TIMED_OUT:
            self._move_attempt(ctx, attempt, AttemptState.TIMED_OUT, "LeaseExpired")
            attempt.outcome = outcome
            attempt.failure_class = failure
            attempt.settled_at = ctx.now
            attempt.settled_by = "lease-expiry-reconciler"
            self._release_lease(ctx, attempt, "LeaseExpired")
            self._emit(
                ctx,
                "AttemptOutcomeRecorded",
                {
                    "runId": str(self.run.run_id),
                    "stepId": str(step.step_id),
                    "attemptId": str(attempt_id),
                    "outcome": str(outcome),
                    "failureClass": str(failure),
                    "outcomeHash": None,
                },
                step_id=step.step_id,
                attempt_id=attempt_id,
            )
        else:
            self._settle(
                ctx,
                attempt,
                outcome,
                failure,
                None,
                settled_by="lease-expiry-reconciler",
                cause="OutcomeReported",
            )
        self._after_settled(ctx, attempt, options)
        return True

    # ------------------------------------------------------------------ approvals

    def request_approval(
        self,
        ctx: CommandContext,
        attempt_id: UUID,
        holder: str,
        fencing_token: int,
        proposal_hash: str,
        policy: PolicyDocument,
        options: Options,
        *,
        action_class: SideEffectClass | None = None,
        lease_id: UUID | None = None,
    ) -> ApprovalRequest | None:
        """Open (or return) the approval for this exact proposal; None if policy needs none."""
        if not is_hash(proposal_hash):
            raise errors.ValidationFailed("proposalHash must be a sha256 canonical hash")
        attempt = self.attempt(attempt_id)
        if attempt.state.terminal:
            self._audit(
                ctx,
                "stale-fencing-token",
                attempt_id=attempt_id,
                holder=holder,
                fencing_token=fencing_token,
                reason=f"attempt settled as {attempt.state}",
            )
            raise errors.StaleFencingToken("the attempt is settled; this lease is stale")
        self._held_lease(ctx, attempt, holder, fencing_token, options, lease_id)
        if self.run.state not in (RunState.RUNNING, RunState.WAITING_FOR_APPROVAL):
            raise errors.IllegalTransition(
                f"no approval request while the run is {self.run.state}",
                run_state=str(self.run.state),
            )
        step = self.step(attempt.step_id)
        action = action_class or step.side_effect_class
        if not policy.needs_approval(action, step.gate):
            return None
        same_step = [a for a in self.approvals.values() if a.step_id == step.step_id]
        for existing in same_step:
            if existing.proposal_hash == proposal_hash and existing.state in (
                ApprovalState.PENDING,
                ApprovalState.APPROVED,
            ):
                # The same proposal asked again: the same request. Approved: the holder goes
                # on to execute. Pending: the attempt parks until the decision.
                if existing.state is ApprovalState.PENDING:
                    self._park(ctx, attempt, existing)
                return existing
        for existing in same_step:
            if existing.state is ApprovalState.PENDING:
                # Invariant 7: a regenerated proposal makes the pending request Stale.
                self._move_approval(ctx, existing, ApprovalState.STALE, "ProposalChanged")
                existing.reason = "proposal regenerated"
                self._emit_approval_decided(ctx, existing)
        approval = self._open_approval(
            ctx, step, attempt_id, action, proposal_hash, policy, options
        )
        if self.run.state is RunState.RUNNING:
            self._move_run(ctx, RunState.WAITING_FOR_APPROVAL)
        self._park(ctx, attempt, approval)
        return approval

    def _open_approval(
        self,
        ctx: CommandContext,
        step: Step,
        attempt_id: UUID,
        action: SideEffectClass,
        proposal_hash: str,
        policy: PolicyDocument,
        options: Options,
    ) -> ApprovalRequest:
        expiry_hours = policy.expiry_hours or options.approval_expiry_hours
        approval = ApprovalRequest(
            approval_id=ctx.new_id(),
            run_id=self.run.run_id,
            step_id=step.step_id,
            attempt_id=attempt_id,
            tenant_id=self.run.tenant_id,
            action_class=action,
            proposal_hash=proposal_hash,
            policy_revision=self.run.policy_revision,
            approver_rule=policy.approver_rule,
            required_approvals=max(policy.required_approvals, 1),
            requested_by=self.run.requested_by,
            created_at=ctx.now,
            expires_at=ctx.now + timedelta(hours=expiry_hours),
        )
        self.approvals[approval.approval_id] = approval
        self._changes.approvals[approval.approval_id] = approval
        self._journal(
            ctx,
            "ApprovalRequest",
            approval.approval_id,
            None,
            ApprovalState.PENDING,
            "ApprovalRequested",
        )
        self._emit(
            ctx,
            "ApprovalRequested",
            {
                "approvalId": str(approval.approval_id),
                "runId": str(self.run.run_id),
                "stepId": str(step.step_id),
                "tenantId": self.run.tenant_id,
                "actionClass": str(action),
                "proposalHash": proposal_hash,
                "approverRule": approval.approver_rule,
                "expiresAt": approval.expires_at.isoformat(),
            },
            step_id=step.step_id,
            attempt_id=attempt_id,
        )
        return approval

    def _park(self, ctx: CommandContext, attempt: Attempt, approval: ApprovalRequest) -> None:
        """A human's wait holds no worker: the lease is released (its holder's later reports
        are refused as stale) and the attempt waits, unclaimable, for the decision."""
        lease = self._release_lease(ctx, attempt, "ParkedForApproval")
        self._move_attempt(ctx, attempt, AttemptState.PARKED, "ParkedForApproval")
        self._emit(
            ctx,
            "AttemptParked",
            {
                "runId": str(self.run.run_id),
                "stepId": str(attempt.step_id),
                "attemptId": str(attempt.attempt_id),
                "approvalId": str(approval.approval_id),
                "leaseId": str(lease.lease_id) if lease else None,
                "fencingToken": lease.fencing_token if lease else None,
                "holder": lease.holder if lease else None,
            },
            step_id=attempt.step_id,
            attempt_id=attempt.attempt_id,
        )

    def _resume_parked(
        self, ctx: CommandContext, attempt: Attempt, approval: ApprovalRequest
    ) -> None:
        """After the decision any worker may claim the attempt again (a new lease, a new
        fencing token); an approval's grant carries the approved proposal hash."""
        self._move_attempt(ctx, attempt, AttemptState.DISPATCHED, "ApprovalDecided")
        attempt.dispatched_at = ctx.now
        step = self.step(attempt.step_id)
        self._emit(
            ctx,
            "AttemptResumed",
            {
                "runId": str(self.run.run_id),
                "stepId": str(step.step_id),
                "attemptId": str(attempt.attempt_id),
                "approvalId": str(approval.approval_id),
                "approvalState": str(approval.state),
                "agentId": step.agent_id,
                "skillId": step.skill_id,
                "attemptNumber": attempt.number,
            },
            step_id=step.step_id,
            attempt_id=attempt.attempt_id,
        )

    def _emit_approval_decided(self, ctx: CommandContext, approval: ApprovalRequest) -> None:
        self._emit(
            ctx,
            "ApprovalDecided",
            {
                "approvalId": str(approval.approval_id),
                "runId": str(self.run.run_id),
                "tenantId": self.run.tenant_id,
                "state": str(approval.state),
                "decidedBy": approval.decided_by,
                "reason": approval.reason,
            },
            step_id=approval.step_id,
            attempt_id=approval.attempt_id,
        )

    def decide_approval(
        self,
        ctx: CommandContext,
        approval_id: UUID,
        principal: Principal,
        decision: Decision,
        version: int,
        proposal_hash: str,
        reason: str | None,
        policy: PolicyDocument,
        options: Options,
    ) -> ApprovalRequest:
        approval = self.approval(approval_id)
        if principal.tenant_id != self.run.tenant_id:
            raise errors.ApprovalNotFound("approval not found")  # never reveal other tenants
        if approval.state in (ApprovalState.EXPIRED, ApprovalState.STALE):
            raise errors.ApprovalGone(f"the approval request is {approval.state}")
        if approval.state.terminal:
            raise errors.ApprovalAlreadyDecided(f"the approval request is {approval.state}")
        if ctx.now >= approval.expires_at:
            raise errors.ApprovalGone("the approval request expired")
        if principal.subject == self.run.requested_by:
            raise errors.SeparationOfDuties("the requester of a run may never decide its approvals")
        break_glass = False
        if not policy.may_decide(principal.subject, principal.roles):
            if Role.PLATFORM_ADMIN not in principal.roles:
                raise errors.Forbidden(
                    f"deciding needs to match the rule: {approval.approver_rule}"
                )
            if not (reason and reason.strip()):
                raise errors.BreakGlassReasonRequired("break-glass decisions require a reason")
            break_glass = True
        if version != approval.version:
            raise errors.ApprovalVersionMismatch(
                f"approval version is {approval.version}, not {version}",
                current_version=approval.version,
            )
        if proposal_hash != approval.proposal_hash:
            raise errors.ProposalHashMismatch("the decision is for a different proposal")
        votes = self.decisions.setdefault(approval_id, [])
        if any(v.decided_by == principal.subject for v in votes):
            raise errors.ApprovalAlreadyDecided("this approver already decided")
        vote = ApprovalDecision(
            approval_id=approval_id,
            run_id=self.run.run_id,
            tenant_id=self.run.tenant_id,
            decided_by=principal.subject,
            decision=decision,
            proposal_hash=proposal_hash,
            reason=reason,
            break_glass=break_glass,
            decided_at=ctx.now,
        )
        votes.append(vote)
        self._changes.decisions.append(vote)
        if break_glass:
            self._audit(
                ctx,
                "break-glass-decision",
                approval_id=approval_id,
                decision=str(decision),
                reason=reason,
            )
        approvals = sum(1 for v in votes if v.decision is Decision.APPROVE)
        if decision is Decision.APPROVE and (
            break_glass or approvals >= approval.required_approvals
        ):
            self._finish_approval(ctx, approval, ApprovalState.APPROVED, "Approve", vote)
            self._resume_after_approval(ctx, approval, options)
        elif decision is Decision.REJECT:
            self._finish_approval(ctx, approval, ApprovalState.REJECTED, "Reject", vote)
            self._fail_run(
                ctx,
                FailureClass.POLICY_DENIED,
                f"approval rejected: {reason or 'no reason given'}",
                cause="ApprovalRejected",
            )
        elif decision is Decision.REQUEST_CHANGES:
            # The proposal must be regenerated: the request goes Stale, the worker resumes.
            self._finish_approval(ctx, approval, ApprovalState.STALE, "ChangesRequested", vote)
            self._resume_after_approval(ctx, approval, options)
        else:
            approval.version += 1  # a vote short of quorum: still Pending, new version
            self._changes.approvals[approval_id] = approval
            self._touch(ctx)
        return approval

    def _finish_approval(
        self,
        ctx: CommandContext,
        approval: ApprovalRequest,
        target: ApprovalState,
        cause: str,
        vote: ApprovalDecision,
    ) -> None:
        self._move_approval(ctx, approval, target, cause)
        approval.decided_by = vote.decided_by
        approval.decided_at = vote.decided_at
        approval.reason = vote.reason
        self._emit_approval_decided(ctx, approval)

    def _resume_after_approval(
        self, ctx: CommandContext, approval: ApprovalRequest, options: Options
    ) -> None:
        if self.run.state is RunState.WAITING_FOR_APPROVAL and not self.pending_approvals():
            cause = (
                "ApprovalGranted"
                if approval.state is ApprovalState.APPROVED
                else "ChangesRequested"
            )
            self._move_run(ctx, RunState.RUNNING, cause)
        attempt = self.attempts.get(approval.attempt_id)
        if (
            attempt is not None
            and attempt.state is AttemptState.PARKED
            and self.run.state is RunState.RUNNING
        ):
            self._resume_parked(ctx, attempt, approval)
        lease = self.leases.get(approval.attempt_id)
        if lease is not None:
            # The lease was suspended while a human decided: give the holder a full term.
            lease.expires_at = ctx.now + timedelta(seconds=options.lease_seconds)
            self._changes.leases[lease.lease_id] = lease

    def expire_approval(
        self,
        ctx: CommandContext,
        approval_id: UUID,
        policy: PolicyDocument,
        options: Options,
    ) -> bool:
        """ApprovalExpiryReconciler: a Pending request past expiresAt gets its policy's expiry
        action (the run's pinned policy revision): ``fail`` (Expired, run Failed),
        ``reject`` (Rejected, run Failed policy-denied), ``auto-approve`` (Approved, the
        attempt resumes), ``re-request`` (Expired and asked again, up to
        ``maxReRequests`` times, then ``fail``). Each is audited as the reconciler's act."""
        approval = self.approvals.get(approval_id)
        if approval is None or approval.state is not ApprovalState.PENDING:
            return False
        if ctx.now < approval.expires_at:
            return False
        action = policy.expiry_action
        if action is ExpiryAction.RE_REQUEST and self._re_requests(approval) >= (
            policy.max_re_requests
        ):
            action = ExpiryAction.FAIL
        self._audit(ctx, "approval-expired", approval_id=approval_id, action=str(action))
        approval.decided_at = ctx.now
        approval.decided_by = APPROVAL_EXPIRY
        if action is ExpiryAction.AUTO_APPROVE:
            approval.reason = "expired without a decision: approved by policy"
            self._move_approval(ctx, approval, ApprovalState.APPROVED, "ExpiryReminder")
            self._emit_approval_decided(ctx, approval)
            self._resume_after_approval(ctx, approval, options)
            return True
        if action is ExpiryAction.REJECT:
            approval.reason = "expired without a decision: rejected by policy"
            self._move_approval(ctx, approval, ApprovalState.REJECTED, "ExpiryReminder")
            self._emit_approval_decided(ctx, approval)
            if self.run.state is RunState.WAITING_FOR_APPROVAL:
                self._fail_run(
                    ctx,
                    FailureClass.POLICY_DENIED,
                    "approval expired; the policy rejects it",
                    cause="ApprovalExpired",
                )
            return True
        approval.reason = "expired without a decision"
        self._move_approval(ctx, approval, ApprovalState.EXPIRED, "ExpiryReminder")
        self._emit_approval_decided(ctx, approval)
        if self.run.state is not RunState.WAITING_FOR_APPROVAL:
            return True
        if action is ExpiryAction.RE_REQUEST:
            self._open_approval(
                ctx,
                self.step(approval.step_id),
                approval.attempt_id,
                approval.action_class,
                approval.proposal_hash,
                policy,
                options,
            )
            return True
        self._fail_run(ctx, FailureClass.CANCELLATION, "approval expired", cause="ApprovalExpired")
        return True

    def _re_requests(self, approval: ApprovalRequest) -> int:
        """How many times this attempt's proposal was asked again after an expiry."""
        return sum(
            1
            for a in self.approvals.values()
            if a.attempt_id == approval.attempt_id
            and a.proposal_hash == approval.proposal_hash
            and a.state is ApprovalState.EXPIRED
        )

    # ------------------------------------------------------------------ deadlines

    def deadline(self, options: Options) -> datetime:
        """When the control plane cancels the run: its wall-clock budget (``maxMinutes`` from
        the first lease grant) or its maximum lifetime, whichever comes first."""
        lifetime = self.run.created_at + timedelta(seconds=options.max_run_lifetime_seconds)
        wall_clock = self.run.deadline_at
        return lifetime if wall_clock is None else min(lifetime, wall_clock)

    def stop_deadline(self, options: Options) -> datetime | None:
        """While Cancelling: when the lease holders' time to stop and report runs out."""
        if self.run.state is not RunState.CANCELLING or not self.intents:
            return None
        intent = max(self.intents, key=lambda i: i.requested_at)
        own = intent.reason in (WALL_CLOCK_EXCEEDED, LIFETIME_EXCEEDED)
        wait = options.cancel_grace_seconds if own else options.cancel_stop_timeout_seconds
        return intent.requested_at + timedelta(seconds=wait)

    def enforce_deadlines(self, ctx: CommandContext, options: Options) -> str | None:
        """The reminder's part: past its deadline a run gets a cancellation intent (reason
        ``wall-clock-exceeded`` or ``lifetime-exceeded``); past the stop deadline a Cancelling
        run's open attempts are settled Uncertain (cause ``StopTimeout``: a holder that never
        reported may have acted), their leases revoked, and the run ends Cancelled. Answers
        what it did, or None."""
        state = self.run.state
        if state.terminal or state is RunState.WAITING_FOR_APPROVAL:
            # A human decision is never cut short by the run's clock: the approval's expiry
            # bounds that wait, and a run past its deadline is cancelled once it resumes.
            return None
        if state is not RunState.CANCELLING:
            if ctx.now < self.deadline(options):
                return None
            lifetime = self.run.created_at + timedelta(seconds=options.max_run_lifetime_seconds)
            reason = LIFETIME_EXCEEDED if ctx.now >= lifetime else WALL_CLOCK_EXCEEDED
            self.cancel(ctx, RUN_CONTROL, reason, options)
            return reason
        stop = self.stop_deadline(options)
        if stop is None or ctx.now < stop:
            return None
        for attempt in self.open_attempts():
            if attempt.state is not AttemptState.LEASED:
                self._cancel_unleased(ctx, attempt)
                self._move_step(
                    ctx, self.step(attempt.step_id), StepState.CANCELLED, "RunCancelled"
                )
                continue
            self._settle(
                ctx,
                attempt,
                AttemptOutcome.UNCERTAIN,
                FailureClass.UNCERTAIN,
                None,
                settled_by=RUN_CONTROL,
                cause="StopTimeout",
            )
            self._after_settled(ctx, attempt, options)
        self._finish_cancelling(ctx)
        return "stop-timeout"

    # ------------------------------------------------------------------ cancellation

    def cancel(
        self,
        ctx: CommandContext,
        requested_by: str,
        reason: str,
        options: Options | None = None,
    ) -> bool:
        """Record intent, then settle what can settle now; True if intent was recorded."""
        if not reason or not reason.strip():
            raise errors.ValidationFailed("a cancellation needs a reason")
        if self.run.state.terminal or self.run.state is RunState.CANCELLING:
            return False
        intent = CancellationIntent(
            intent_id=ctx.new_id(),
            run_id=self.run.run_id,
            tenant_id=self.run.tenant_id,
            requested_by=requested_by,
            reason=reason,
            requested_at=ctx.now,
        )
        self._changes.intents.append(intent)
        self.intents.append(intent)
        self._emit(
            ctx,
            "CancellationRequested",
            {"runId": str(self.run.run_id), "requestedBy": requested_by, "reason": reason},
        )
        if self.run.state is RunState.ACCEPTED:
            self._move_run(ctx, RunState.CANCELLED)
            self._close_remaining(ctx, FailureClass.CANCELLATION)
            self._emit_cancelled(ctx, intent)
            return True
        if self.run.state is RunState.WAITING_FOR_APPROVAL:
            # The leases were suspended while a human decided: give each holder a full term
            # to observe the cancellation and settle its attempt itself.
            term = timedelta(seconds=(options or Options()).lease_seconds)
            for lease in self.leases.values():
                lease.expires_at = ctx.now + term
                self._changes.leases[lease.lease_id] = lease
        self._move_run(ctx, RunState.CANCELLING)
        for approval in self.pending_approvals():
            self._move_approval(ctx, approval, ApprovalState.CANCELLED, "RunCancelled")
            self._emit_approval_decided(ctx, approval)
        for attempt in self.open_attempts():
            if attempt.state is not AttemptState.LEASED:
                # Not held (never leased, or parked before its side effect): it settles at once.
                self._cancel_unleased(ctx, attempt)
                self._move_step(
                    ctx, self.step(attempt.step_id), StepState.CANCELLED, "RunCancelled"
                )
        self._finish_cancelling(ctx)
        return True

    def _finish_cancelling(self, ctx: CommandContext) -> None:
        if self.run.state is not RunState.CANCELLING or self.open_attempts():
            return
        for step in self.steps:
            if step.state is StepState.PENDING:
                self._move_step(ctx, step, StepState.CANCELLED, "RunEnded")
        self._move_run(ctx, RunState.CANCELLED)
        self._emit_cancelled(ctx, self.intents[-1] if self.intents else None)

    def _emit_cancelled(self, ctx: CommandContext, intent: CancellationIntent | None) -> None:
        self._emit(
            ctx,
            "RunCancelled",
            {
                "runId": str(self.run.run_id),
                "tenantId": self.run.tenant_id,
                "reason": intent.reason if intent else self.run.failure_reason,
                "requestedBy": intent.requested_by if intent else None,
            },
        )

    # ------------------------------------------------------------------ progress

    def report_progress(
        self,
        ctx: CommandContext,
        attempt_id: UUID,
        holder: str,
        fencing_token: int,
        messages: Sequence[ProgressMessage],
        options: Options,
        *,
        lease_id: UUID | None = None,
    ) -> ProgressAck:
        """Store the lease holder's progress messages in sequence, each as a per-run event
        (``ProgressReported``). A message at or below the attempt's last stored seq is a
        duplicate (a resend) and is dropped; a message past the next seq is a gap: the batch
        stops there, keeping what came before it (the answer's ``gap_at`` says where)."""
        if not messages:
            raise errors.ValidationFailed("a progress report needs at least one message")
        if len(messages) > PROGRESS_BATCH_MAX:
            raise errors.ValidationFailed(
                f"at most {PROGRESS_BATCH_MAX} progress messages per report",
                count=len(messages),
            )
        for message in messages:
            if message.seq < 1:
                raise errors.ValidationFailed("progress messages are numbered from 1")
        attempt = self.attempt(attempt_id)
        self._held_lease(ctx, attempt, holder, fencing_token, options, lease_id)
        stored = duplicates = 0
        gap_at: int | None = None
        for message in messages:
            if message.seq <= attempt.progress_seq:
                duplicates += 1
                continue
            if message.seq != attempt.progress_seq + 1:
                gap_at = message.seq
                break
            attempt.progress_seq = message.seq
            self._changes.attempts[attempt_id] = attempt
            self._emit(
                ctx,
                "ProgressReported",
                {
                    "runId": str(self.run.run_id),
                    "stepId": str(attempt.step_id),
                    "attemptId": str(attempt_id),
                    "seq": message.seq,
                    "text": message.text,
                    "payload": message.payload,
                },
                step_id=attempt.step_id,
                attempt_id=attempt_id,
            )
            stored += 1
        return ProgressAck(attempt_id, attempt.progress_seq, stored, duplicates, gap_at)

    # ------------------------------------------------------------------ tool calls

    def open_tool_calls(self) -> list[ToolCall]:
        return [t for t in self.tool_calls.values() if not t.state.terminal]

    def _tool_call_checks(
        self,
        ctx: CommandContext,
        attempt_id: UUID,
        holder: str,
        fencing_token: int,
        call_id: str,
        options: Options,
        lease_id: UUID | None,
    ) -> Attempt:
        """What claims and completions share: a live run, and the caller's current lease."""
        if not call_id or len(call_id) > MAX_CALL_ID:
            raise errors.ValidationFailed(f"a call id has 1 to {MAX_CALL_ID} characters")
        attempt = self.attempt(attempt_id)
        if self.run.state.terminal:
            # After a hard stop nothing may execute, and no late result is recorded.
            self._audit(
                ctx,
                "tool-call-after-run-ended",
                attempt_id=attempt_id,
                holder=holder,
                fencing_token=fencing_token,
                call_id=call_id,
                run_state=str(self.run.state),
            )
            raise errors.RunTerminal(f"the run is {self.run.state}", run_state=str(self.run.state))
        self._held_lease(ctx, attempt, holder, fencing_token, options, lease_id)
        return attempt

    def claim_tool_call(
        self,
        ctx: CommandContext,
        attempt_id: UUID,
        holder: str,
        fencing_token: int,
        call_id: str,
        request_hash: str,
        options: Options,
        *,
        lease_id: UUID | None = None,
    ) -> ToolCallClaim:
        """Claim ``call_id`` before its side effect. The first claim answers ``proceed``; any
        later one (another command, another attempt) answers what became of the first:
        ``in-progress``, ``completed`` (with its result hash) or ``expired``; never
        ``proceed`` again."""
        if not is_hash(request_hash):
            raise errors.ValidationFailed("requestHash must be a sha256 canonical hash")
        self._tool_call_checks(ctx, attempt_id, holder, fencing_token, call_id, options, lease_id)
        existing = self.tool_calls.get(call_id)
        if existing is not None:
            if existing.request_hash != request_hash:
                self._audit(
                    ctx,
                    "tool-call-conflict",
                    attempt_id=attempt_id,
                    holder=holder,
                    call_id=call_id,
                    reason="another request under this call id",
                )
                raise errors.ToolCallConflict(
                    "this call id was claimed for a different request", call_id=call_id
                )
            return _claim_answer(existing, ctx.now)
        if self.run.state is RunState.CANCELLING:
            self._audit(
                ctx,
                "tool-call-refused",
                attempt_id=attempt_id,
                holder=holder,
                call_id=call_id,
                reason="the run is being cancelled",
            )
            raise errors.ToolCallRefused("the run is being cancelled: start no new side effect")
        call = ToolCall(
            tool_call_id=ctx.new_id(),
            run_id=self.run.run_id,
            tenant_id=self.run.tenant_id,
            call_id=call_id,
            attempt_id=attempt_id,
            request_hash=request_hash,
            claimed_by=holder,
            fencing_token=fencing_token,
            claimed_at=ctx.now,
            expires_at=ctx.now + timedelta(seconds=options.tool_call_claim_timeout_seconds),
        )
        self.tool_calls[call_id] = call
        self._changes.tool_calls[call.tool_call_id] = call
        self._journal(ctx, "ToolCall", call.tool_call_id, None, call.state, "ToolCallClaimed")
        self._emit_tool_call(ctx, "ToolCallClaimed", call)
        return ToolCallClaim(call.tool_call_id, call_id, ToolCallStatus.PROCEED)

    def complete_tool_call(
        self,
        ctx: CommandContext,
        attempt_id: UUID,
        holder: str,
        fencing_token: int,
        call_id: str,
        result_hash: str,
        options: Options,
        *,
        lease_id: UUID | None = None,
    ) -> ToolCallClaim:
        """Store the result hash of a call this attempt claimed (the same result again is a
        no-op). A claim past its timeout takes no result: it is closed, or about to be."""
        if not is_hash(result_hash):
            raise errors.ValidationFailed("resultHash must be a sha256 canonical hash")
        self._tool_call_checks(ctx, attempt_id, holder, fencing_token, call_id, options, lease_id)
        call = self.tool_calls.get(call_id)
        if call is None:
            raise errors.ToolCallNotFound(f"no claim of call {call_id!r}", call_id=call_id)
        if call.attempt_id != attempt_id:
            self._audit(
                ctx,
                "tool-call-conflict",
                attempt_id=attempt_id,
                holder=holder,
                call_id=call_id,
                reason="claimed by another attempt",
            )
            raise errors.ToolCallConflict("another attempt claimed this call", call_id=call_id)
        if call.state is ToolCallState.COMPLETED:
            if call.result_hash == result_hash:
                return _claim_answer(call, ctx.now)  # the same completion retried
            raise errors.ToolCallConflict(
                "the call already has a different result", call_id=call_id
            )
        if call.state is ToolCallState.EXPIRED or ctx.now >= call.expires_at:
            self._audit(
                ctx,
                "tool-call-late-result",
                attempt_id=attempt_id,
                holder=holder,
                call_id=call_id,
                result_hash=result_hash,
            )
            raise errors.ToolCallExpired(
                "the claim timed out without a result; the result is not stored",
                call_id=call_id,
            )
        self._move_tool_call(ctx, call, ToolCallState.COMPLETED)
        call.result_hash = result_hash
        call.completed_at = ctx.now
        self._emit_tool_call(ctx, "ToolCallCompleted", call)
        return _claim_answer(call, ctx.now)

    def expire_tool_calls(self, ctx: CommandContext) -> int:
        """The reminder's part: close every claim past its timeout without a result (it is
        never executed: a repeat claim answers ``expired``). Answers how many it closed."""
        closed = 0
        for call in self.open_tool_calls():
            if ctx.now < call.expires_at:
                continue
            self._move_tool_call(ctx, call, ToolCallState.EXPIRED)
            call.completed_at = ctx.now
            call.error = CLAIM_TIMED_OUT
            self._emit_tool_call(ctx, "ToolCallExpired", call)
            closed += 1
        return closed

    def _move_tool_call(self, ctx: CommandContext, call: ToolCall, target: ToolCallState) -> None:
        current = call.state
        cause = check("ToolCall", TOOL_CALL_TRANSITIONS, current, target)
        call.state = target
        self._changes.tool_calls[call.tool_call_id] = call
        self._journal(ctx, "ToolCall", call.tool_call_id, current, target, cause)

    def _emit_tool_call(self, ctx: CommandContext, event_type: str, call: ToolCall) -> None:
        attempt = self.attempt(call.attempt_id)
        self._emit(
            ctx,
            event_type,
            {
                "runId": str(self.run.run_id),
                "attemptId": str(call.attempt_id),
                "toolCallId": str(call.tool_call_id),
                "callId": call.call_id,
                "requestHash": call.request_hash,
                "state": str(call.state),
                "resultHash": call.result_hash,
                "error": call.error,
            },
            step_id=attempt.step_id,
            attempt_id=call.attempt_id,
        )

    # ---- operator controls
    #
    # Suspend, resume, retry a step, resolve an Uncertain attempt (issue 14). Each records its
    # journal entry, its outbox event and an audit record naming the caller (``ctx.actor``) and
    # the required reason, in the command's one transaction. A finished run (Completed, Failed,
    # Cancelled) is terminal: no control reopens it, a rerun repeats it as a new run
    # (``runcontrol.grain``); resolving an attempt of a finished run corrects the attempt's
    # record only.

    def suspend(self, ctx: CommandContext, reason: str) -> None:
        """Hold the run: no step is dispatched and no dispatched attempt leased until it is
        resumed. Leases in hand may still renew, request approval and report."""
        reason = _control_reason(reason)
        self._controllable("suspend")
        if self.run.state is RunState.ACCEPTED:
            raise errors.IllegalTransition(
                "the run has not started: cancel it, or suspend it once it runs",
                run_state=str(self.run.state),
            )
        if self.run.suspended_at is not None:
            raise errors.RunSuspended("the run is already suspended")
        self.run.suspended_at = ctx.now
        self._journal(ctx, "Run", self.run.run_id, "Active", "Suspended", "SuspendRequested")
        self._control_event(ctx, "RunSuspended", reason)
        self._audit(ctx, "run-suspended", reason=reason, run_state=str(self.run.state))

    def resume(self, ctx: CommandContext, reason: str) -> None:
        """Lift the suspension; what is due is dispatched by the same command (the grain)."""
        reason = _control_reason(reason)
        self._controllable("resume")
        if self.run.suspended_at is None:
            raise errors.RunNotSuspended("the run is not suspended")
        self.run.suspended_at = None
        self._journal(ctx, "Run", self.run.run_id, "Suspended", "Active", "ResumeRequested")
        self._control_event(ctx, "RunResumed", reason)
        self._audit(ctx, "run-resumed", reason=reason, run_state=str(self.run.state))

    def retry_step(self, ctx: CommandContext, step_id: UUID, reason: str) -> Step:
        """Dispatch a new attempt of a step whose last attempt Failed, TimedOut or settled
        Uncertain and which waits for its retry: the backoff is skipped. The attempt is
        dispatched by the same command (the grain), or, while the run is suspended, by the
        resume; its lease carries a new fencing token."""
        reason = _control_reason(reason)
        step = self.step(step_id)
        self._controllable("retry a step of")
        if self.run.state is not RunState.RUNNING:
            raise errors.IllegalTransition(
                f"no retry while the run is {self.run.state}", run_state=str(self.run.state)
            )
        previous = self.attempts_of(step)
        last = previous[-1] if previous else None
        retryable = (AttemptState.FAILED, AttemptState.TIMED_OUT, AttemptState.UNCERTAIN)
        if step.state is not StepState.PENDING or last is None or last.state not in retryable:
            raise errors.IllegalTransition(
                f"step {step.name!r} is {step.state}: only a step waiting for its retry after "
                "a Failed, TimedOut or Uncertain attempt can be retried",
                step_id=str(step_id),
                step_state=str(step.state),
            )
        step.not_before = None
        self._changes.steps[step.step_id] = step
        self._journal(ctx, "Step", step.step_id, step.state, step.state, "RetryRequested")
        self._control_event(
            ctx,
            "StepRetryRequested",
            reason,
            stepId=str(step.step_id),
            nextAttemptNumber=last.number + 1,
            step_id=step.step_id,
        )
        self._audit(ctx, "step-retry", reason=reason, step_id=step.step_id, after=last.number)
        return step

    def resolve_attempt(
        self,
        ctx: CommandContext,
        attempt_id: UUID,
        outcome: AttemptOutcome,
        reason: str,
        options: Options,
    ) -> Attempt:
        """Settle an Uncertain attempt as Succeeded or Failed, the operator having found out
        whether its side effect happened. When its step waits for the retry this attempt
        scheduled (a live run), the step settles as the normal path would: Succeeded moves the
        run on (the next step, or Completed); Failed keeps the scheduled retry. Otherwise (a
        finished run, or a later attempt already carries the step) only the attempt's record
        changes."""
        reason = _control_reason(reason)
        if outcome not in (AttemptOutcome.SUCCEEDED, AttemptOutcome.FAILED):
            raise errors.ValidationFailed("an Uncertain attempt resolves as Succeeded or Failed")
        attempt = self.attempt(attempt_id)
        if attempt.state is not AttemptState.UNCERTAIN:
            raise errors.IllegalTransition(
                f"the attempt is {attempt.state}: only an Uncertain attempt can be resolved",
                attempt_id=str(attempt_id),
                attempt_state=str(attempt.state),
            )
        step = self.step(attempt.step_id)
        awaited = (
            self.run.state is RunState.RUNNING
            and step.state is StepState.PENDING
            and self.attempts_of(step)[-1].attempt_id == attempt_id
        )
        cause = check("Attempt", ATTEMPT_RESOLUTIONS, attempt.state, outcome.attempt_state)
        attempt.state = outcome.attempt_state
        self._changes.attempts[attempt.attempt_id] = attempt
        self._journal(ctx, "Attempt", attempt_id, AttemptState.UNCERTAIN, attempt.state, cause)
        attempt.outcome = outcome
        attempt.failure_class = _failure_class_for(outcome, None)
        self._control_event(
            ctx,
            "AttemptOutcomeResolved",
            reason,
            stepId=str(step.step_id),
            attemptId=str(attempt_id),
            fromOutcome=str(AttemptOutcome.UNCERTAIN),
            outcome=str(outcome),
            step_id=step.step_id,
            attempt_id=attempt_id,
        )
        self._audit(
            ctx, "attempt-resolved", reason=reason, attempt_id=attempt_id, outcome=str(outcome)
        )
        if awaited and outcome is AttemptOutcome.SUCCEEDED:
            step.not_before = None
            self._after_settled(ctx, attempt, options)
        return attempt

    def _controllable(self, what: str) -> None:
        if self.run.state.terminal:
            raise errors.RunTerminal(
                f"cannot {what} a {self.run.state} run: rerun it instead",
                run_state=str(self.run.state),
            )
        if self.run.state is RunState.CANCELLING:
            raise errors.IllegalTransition(
                f"cannot {what} a run being cancelled", run_state=str(self.run.state)
            )

    def _control_event(
        self,
        ctx: CommandContext,
        event_type: str,
        reason: str,
        *,
        step_id: UUID | None = None,
        attempt_id: UUID | None = None,
        **payload: Any,
    ) -> None:
        self._emit(
            ctx,
            event_type,
            {
                "runId": str(self.run.run_id),
                "tenantId": self.run.tenant_id,
                "state": str(self.run.state),
                "suspended": self.run.suspended_at is not None,
                **payload,
                "requestedBy": ctx.actor,
                "reason": reason,
            },
            step_id=step_id,
            attempt_id=attempt_id,
        )

    def record_rerun(self, ctx: CommandContext, rerun_of: UUID, release: str, reason: str) -> None:
        """On a new run: it reruns the finished run ``rerun_of`` (``release``: ``pinned`` or
        ``current``, the release it was given). Recorded on the new run, in its accepting
        statement: the finished run is never written again."""
        reason = _control_reason(reason)
        self.run.rerun_of = rerun_of
        self._changes.run_dirty = True
        self._journal(ctx, "Run", self.run.run_id, None, self.run.state, "RerunRequested")
        self._control_event(
            ctx,
            "RunRerun",
            reason,
            rerunOf=str(rerun_of),
            release=release,
            releaseId=self.run.release_id,
        )
        self._audit(
            ctx,
            "run-rerun",
            reason=reason,
            rerun_of=rerun_of,
            release=release,
            release_id=self.run.release_id,
        )

    # ------------------------------------------------------------------ restore from backup

    def settle_restored_leases(self, ctx: CommandContext, options: Options) -> list[UUID]:
        """After the store was restored from a backup (spec, failure and recovery: "runs with
        open leases are reconciled as Uncertain and surfaced to operators"): a lease open in
        the backup may have been acted on after it was taken, by transitions the restore lost.
        Each such lease is revoked and audited, and its attempt settles ``Uncertain`` (cause
        ``restored-from-backup``); the run then goes on by its rules (invariant 6: a
        shared-write step is not retried, it fails the run for an operator). A pending approval
        of the attempt is cancelled with it. Answers the attempts settled (none: no change)."""
        settled: list[UUID] = []
        for attempt_id, lease in list(self.leases.items()):
            attempt = self.attempts.get(attempt_id)
            if self.run.state.terminal or attempt is None:
                break
            if attempt.state is not AttemptState.LEASED:
                continue
            detail = {
                "attemptId": str(attempt_id),
                "leaseId": str(lease.lease_id),
                "holder": lease.holder,
                "fencingToken": lease.fencing_token,
                "reason": RESTORED_FROM_BACKUP,
            }
            self._audit(
                ctx,
                RESTORED_FROM_BACKUP,
                attempt_id=attempt_id,
                lease_id=lease.lease_id,
                holder=lease.holder,
                fencing_token=lease.fencing_token,
            )
            self._emit(ctx, "LeaseRevoked", detail, step_id=attempt.step_id, attempt_id=attempt_id)
            for approval in self.pending_approvals():
                if approval.attempt_id == attempt_id:
                    self._move_approval(
                        ctx, approval, ApprovalState.CANCELLED, RESTORED_FROM_BACKUP
                    )
                    self._emit_approval_decided(ctx, approval)
            if self.run.state is RunState.WAITING_FOR_APPROVAL and not self.pending_approvals():
                self._move_run(ctx, RunState.RUNNING, RESTORED_FROM_BACKUP)
            self._settle(
                ctx,
                attempt,
                AttemptOutcome.UNCERTAIN,
                FailureClass.UNCERTAIN,
                None,
                settled_by=RESTORE_CHECK,
                cause=RESTORED_FROM_BACKUP,
            )
            self._after_settled(ctx, attempt, options)
            settled.append(attempt_id)
        return settled


def _control_reason(reason: str) -> str:
    if not reason or not reason.strip():
        raise errors.ValidationFailed("an operator control needs a reason")
    return reason


def _claim_answer(call: ToolCall, now: datetime) -> ToolCallClaim:
    """What a repeat claim of ``call`` answers (never ``proceed``)."""
    if call.state is ToolCallState.COMPLETED:
        status = ToolCallStatus.COMPLETED
    elif call.state is ToolCallState.EXPIRED or now >= call.expires_at:
        status = ToolCallStatus.EXPIRED  # past its timeout: closed by the next reminder
    else:
        status = ToolCallStatus.IN_PROGRESS
    error = call.error
    if status is ToolCallStatus.EXPIRED and error is None:
        error = CLAIM_TIMED_OUT
    return ToolCallClaim(call.tool_call_id, call.call_id, status, call.result_hash, error)


def _failure_class_for(
    outcome: AttemptOutcome, failure_class: FailureClass | None
) -> FailureClass | None:
    if outcome is AttemptOutcome.SUCCEEDED:
        return None
    if outcome is AttemptOutcome.UNCERTAIN:
        return FailureClass.UNCERTAIN
    if outcome is AttemptOutcome.CANCELLED:
        return FailureClass.CANCELLATION
    if outcome is AttemptOutcome.TIMED_OUT:
        return FailureClass.TRANSIENT
    return failure_class or FailureClass.TRANSIENT
