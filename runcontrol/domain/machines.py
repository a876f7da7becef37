"""The state machines, as tables of legal (from, to) pairs with the cause the spec names.

Anything not in a table is illegal and raises ``IllegalTransition``.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import TypeVar

from .errors import IllegalTransition
from .states import ApprovalState, AttemptState, RunState, StepState, ToolCallState

S = TypeVar("S", bound=StrEnum)

R = RunState
RUN_TRANSITIONS: Mapping[tuple[RunState, RunState], str] = {
    (R.ACCEPTED, R.RUNNING): "FirstAttemptDispatched",
    (R.RUNNING, R.WAITING_FOR_APPROVAL): "ApprovalRequested",
    (R.WAITING_FOR_APPROVAL, R.RUNNING): "ApprovalGranted",
    (R.WAITING_FOR_APPROVAL, R.FAILED): "ApprovalRejectedOrExpired",
    (R.ACCEPTED, R.CANCELLED): "CancelRequestedBeforeDispatch",
    (R.RUNNING, R.CANCELLING): "CancelRequested",
    (R.WAITING_FOR_APPROVAL, R.CANCELLING): "CancelRequested",
    (R.CANCELLING, R.CANCELLED): "AllAttemptsSettled",
    (R.RUNNING, R.COMPLETED): "LastStepSucceeded",
    (R.RUNNING, R.FAILED): "StepFailedTerminally",
    # Not drawn in the spec's diagram, but required by its BudgetReservationDenied handler
    # ("terminate the run as Failed (policy-denied)") for a run that never dispatched.
    (R.ACCEPTED, R.FAILED): "BudgetReservationDenied",
}

St = StepState
STEP_TRANSITIONS: Mapping[tuple[StepState, StepState], str] = {
    (St.PENDING, St.RUNNING): "AttemptDispatched",
    (St.RUNNING, St.PENDING): "RetryScheduled",
    (St.RUNNING, St.SUCCEEDED): "AttemptSucceeded",
    (St.RUNNING, St.FAILED): "AttemptFailedTerminally",
    (St.RUNNING, St.CANCELLED): "RunCancelled",
    (St.PENDING, St.CANCELLED): "RunEnded",
    # An operator resolved the Uncertain attempt the step awaited its retry after as Succeeded.
    (St.PENDING, St.SUCCEEDED): "OperatorResolved",
}

A = AttemptState
ATTEMPT_TRANSITIONS: Mapping[tuple[AttemptState, AttemptState], str] = {
    (A.DISPATCHED, A.LEASED): "LeaseGranted",
    (A.DISPATCHED, A.CANCELLED): "CancelledBeforeLease",
    (A.LEASED, A.SUCCEEDED): "OutcomeReported",
    (A.LEASED, A.FAILED): "OutcomeReported",
    (A.LEASED, A.UNCERTAIN): "OutcomeReported",
    (A.LEASED, A.CANCELLED): "OutcomeReported",
    (A.LEASED, A.TIMED_OUT): "LeaseExpired",
    (A.LEASED, A.PARKED): "ParkedForApproval",
    (A.PARKED, A.DISPATCHED): "ApprovalDecided",
    (A.PARKED, A.CANCELLED): "CancelledWhileParked",
}

# Invariant 6 surfaces an Uncertain attempt to an operator, who may find out whether its side
# effect happened. That is a correction of the attempt's record, not a move of its machine
# (whose terminal states keep no exits): the only corrections there are.
ATTEMPT_RESOLUTIONS: Mapping[tuple[AttemptState, AttemptState], str] = {
    (A.UNCERTAIN, A.SUCCEEDED): "OperatorResolved",
    (A.UNCERTAIN, A.FAILED): "OperatorResolved",
}

Ap = ApprovalState
APPROVAL_TRANSITIONS: Mapping[tuple[ApprovalState, ApprovalState], str] = {
    (Ap.PENDING, Ap.APPROVED): "Approve",
    (Ap.PENDING, Ap.REJECTED): "Reject",
    (Ap.PENDING, Ap.EXPIRED): "ExpiryReminder",
    (Ap.PENDING, Ap.STALE): "ProposalChanged",
    (Ap.PENDING, Ap.CANCELLED): "RunCancelled",
}

T = ToolCallState
TOOL_CALL_TRANSITIONS: Mapping[tuple[ToolCallState, ToolCallState], str] = {
    (T.CLAIMED, T.COMPLETED): "ToolCallCompleted",
    (T.CLAIMED, T.EXPIRED): "ClaimTimeout",
}


def check(entity: str, table: Mapping[tuple[S, S], str], current: S, target: S) -> str:
    """Return the spec's cause for ``current -> target`` or raise ``IllegalTransition``."""
    cause = table.get((current, target))
    if cause is None:
        raise IllegalTransition(
            f"{entity} cannot move from {current} to {target}",
            entity=entity,
            from_state=str(current),
            to_state=str(target),
        )
    return cause
