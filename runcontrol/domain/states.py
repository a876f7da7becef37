"""State vocabularies of runs, steps, attempts and approvals, and the value classes."""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    ACCEPTED = "Accepted"
    RUNNING = "Running"
    WAITING_FOR_APPROVAL = "WaitingForApproval"
    CANCELLING = "Cancelling"
    COMPLETED = "Completed"
    FAILED = "Failed"
    CANCELLED = "Cancelled"

    @property
    def terminal(self) -> bool:
        return self in _TERMINAL_RUN


_TERMINAL_RUN = frozenset({RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED})


class Suspension(StrEnum):
    """Whether an operator holds a live run (``Run.suspended_at``), beside its state."""

    ACTIVE = "Active"
    SUSPENDED = "Suspended"


class StepState(StrEnum):
    PENDING = "Pending"
    RUNNING = "Running"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    CANCELLED = "Cancelled"
    # Its condition (``when``) was false, or every dependency was skipped (issue 32): it
    # never ran; its dependants treat it as settled without a result (docs/graphs.md).
    SKIPPED = "Skipped"

    @property
    def terminal(self) -> bool:
        return self in (
            StepState.SUCCEEDED,
            StepState.FAILED,
            StepState.CANCELLED,
            StepState.SKIPPED,
        )

    @property
    def settled_for_dependants(self) -> bool:
        """Whether a dependant may start after this step: it succeeded, or was skipped."""
        return self in (StepState.SUCCEEDED, StepState.SKIPPED)


class AttemptState(StrEnum):
    DISPATCHED = "Dispatched"
    LEASED = "Leased"
    # Waiting for a human decision on its proposal: no lease, no worker capacity held; the
    # decision puts it back to Dispatched for any worker to claim (docs/approvals.md).
    PARKED = "Parked"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    TIMED_OUT = "TimedOut"
    UNCERTAIN = "Uncertain"
    CANCELLED = "Cancelled"

    @property
    def terminal(self) -> bool:
        return self not in (AttemptState.DISPATCHED, AttemptState.LEASED, AttemptState.PARKED)


class AttemptOutcome(StrEnum):
    """What a lease holder (or a reconciler) records as the single outcome of an attempt."""

    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    TIMED_OUT = "TimedOut"
    UNCERTAIN = "Uncertain"
    CANCELLED = "Cancelled"

    @property
    def attempt_state(self) -> AttemptState:
        return AttemptState(self.value)


class ApprovalState(StrEnum):
    PENDING = "Pending"
    APPROVED = "Approved"
    REJECTED = "Rejected"
    EXPIRED = "Expired"
    STALE = "Stale"
    CANCELLED = "Cancelled"

    @property
    def terminal(self) -> bool:
        return self is not ApprovalState.PENDING


class ToolCallState(StrEnum):
    """A tool call claimed before its side effect (at most once per run and ``call_id``)."""

    CLAIMED = "Claimed"  # the claimer may be executing it; no result yet
    COMPLETED = "Completed"  # its result hash (and result, if sent) is stored; a repeat gets it
    EXPIRED = "Expired"  # no result within the claim timeout: closed, never executed again

    @property
    def terminal(self) -> bool:
        return self is not ToolCallState.CLAIMED


class ToolCallStatus(StrEnum):
    """What a claim answers: whether the caller may execute the call."""

    PROCEED = "proceed"  # the first claim: execute, then complete with the result hash
    IN_PROGRESS = "in-progress"  # claimed before and still without a result: do not execute
    COMPLETED = "completed"  # executed before: use the stored result hash, do not execute
    EXPIRED = "expired"  # closed without a result: never execute


class ExpiryAction(StrEnum):
    """What the control plane does when an approval request expires without a decision
    (per policy revision)."""

    FAIL = "fail"  # the request Expired, the run Failed (the default)
    REJECT = "reject"  # the request Rejected by the reconciler, the run Failed policy-denied
    AUTO_APPROVE = "auto-approve"  # the request Approved by the reconciler, the run resumes
    RE_REQUEST = "re-request"  # the request Expired and asked again (up to a limit), then fail


class Decision(StrEnum):
    APPROVE = "approve"
    REJECT = "reject"
    REQUEST_CHANGES = "request-changes"


class FailureClass(StrEnum):
    TRANSIENT = "transient"
    PERMANENT = "permanent"
    POLICY_DENIED = "policy-denied"
    VALIDATION = "validation"
    CANCELLATION = "cancellation"
    UNCERTAIN = "uncertain"
    REPLAY_DIVERGED = "replay-diverged"  # a replay met what the original did not do

    @property
    def retryable(self) -> bool:
        return self is FailureClass.TRANSIENT


class SideEffectClass(StrEnum):
    """Ordered by how much a repeated execution could harm: read < ... < external-irreversible."""

    READ = "read"
    LOCAL_WRITE = "local-write"
    SHARED_WRITE = "shared-write"
    EXTERNAL_IRREVERSIBLE = "external-irreversible"

    @property
    def rank(self) -> int:
        return _SIDE_EFFECT_ORDER.index(self)

    def at_least(self, other: SideEffectClass) -> bool:
        return self.rank >= other.rank


_SIDE_EFFECT_ORDER = (
    SideEffectClass.READ,
    SideEffectClass.LOCAL_WRITE,
    SideEffectClass.SHARED_WRITE,
    SideEffectClass.EXTERNAL_IRREVERSIBLE,
)


class Role(StrEnum):
    REQUESTER = "Requester"
    REVIEWER = "Reviewer"
    OPERATOR = "Operator"
    WORKSPACE_ADMIN = "WorkspaceAdmin"
    PLATFORM_ADMIN = "PlatformAdmin"
    OBSERVER = "Observer"
    WORKER = "Worker"
