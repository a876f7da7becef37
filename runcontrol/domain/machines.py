"""The state machines, as tables of legal (from, to) pairs with the cause the spec names, and
which command a run's state admits.

Anything not in a transition table is illegal and raises ``IllegalTransition``; a command the
run's state does not admit (``RUN_COMMANDS``) is refused with its table's error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import TypeVar

from .errors import (
    IllegalTransition,
    LeaseRejected,
    RunControlError,
    RunTerminal,
    ToolCallRefused,
)
from .states import (
    ApprovalState,
    AttemptState,
    RunState,
    StepState,
    Suspension,
    ToolCallState,
)

S = TypeVar("S", bound=StrEnum)


def machine(states: type[S]) -> Callable[[str], Mapping[tuple[S, S], str]]:
    """A machine's table from its rows, one a line: ``from -> to  Cause``, the states by their
    values (as the spec draws them), the cause the spec's name; ``#`` begins a comment. A
    state that does not exist or a pair given twice fails here, at import."""

    def rows(text: str) -> Mapping[tuple[S, S], str]:
        table: dict[tuple[S, S], str] = {}
        for line in text.splitlines():
            words = line.split("#", 1)[0].split()
            if not words:
                continue
            current, arrow, target, cause = words
            if arrow != "->" or (states(current), states(target)) in table:
                raise ValueError(f"{states.__name__}: row {line.strip()!r}")
            table[states(current), states(target)] = cause
        return table

    return rows


RUN_TRANSITIONS = machine(RunState)("""
    Accepted           -> Running             FirstAttemptDispatched
    Running            -> WaitingForApproval  ApprovalRequested
    WaitingForApproval -> Running             ApprovalGranted
    WaitingForApproval -> Failed              ApprovalRejectedOrExpired
    Accepted           -> Cancelled           CancelRequestedBeforeDispatch
    Running            -> Cancelling          CancelRequested
    WaitingForApproval -> Cancelling          CancelRequested
    Cancelling         -> Cancelled           AllAttemptsSettled
    # Not in the spec's diagram: a graph's step failed terminally while siblings were held;
    # they were asked to stop as for a cancel, and the run fails once they all settled.
    Cancelling         -> Failed              SiblingsSettledAfterFailure
    Running            -> Completed           LastStepSucceeded
    Running            -> Failed              StepFailedTerminally
    # Not drawn in the spec's diagram, but required by its BudgetReservationDenied handler
    # ("terminate the run as Failed (policy-denied)") for a run that never dispatched.
    Accepted           -> Failed              BudgetReservationDenied
""")

STEP_TRANSITIONS = machine(StepState)("""
    Pending -> Running    AttemptDispatched
    Running -> Pending    RetryScheduled
    Running -> Succeeded  AttemptSucceeded
    Running -> Failed     AttemptFailedTerminally
    Running -> Cancelled  RunCancelled
    Pending -> Cancelled  RunEnded
    # An operator resolved the Uncertain attempt the step awaited its retry after as Succeeded.
    Pending -> Succeeded  OperatorResolved
    # Issue 32: a ready step whose condition is false, or whose dependencies were all skipped,
    # never runs (its cause says which).
    Pending -> Skipped    ConditionFalse
""")

# An operator's retry skips the Pending step's backoff: the step stays Pending (a journaled
# self-loop, kept out of the machine, which has none).
STEP_CONTROLS = machine(StepState)("""
    Pending -> Pending  RetryRequested
""")

# An operator's suspension holds a live run in whatever state it is in (``Run.suspended_at``):
# a machine of its own beside the run's.
SUSPENSION_TRANSITIONS = machine(Suspension)("""
    Active    -> Suspended  SuspendRequested
    Suspended -> Active     ResumeRequested
""")

ATTEMPT_TRANSITIONS = machine(AttemptState)("""
    Dispatched -> Leased      LeaseGranted
    Dispatched -> Cancelled   CancelledBeforeLease
    Leased     -> Succeeded   OutcomeReported
    Leased     -> Failed      OutcomeReported
    Leased     -> Uncertain   OutcomeReported
    Leased     -> Cancelled   OutcomeReported
    Leased     -> TimedOut    LeaseExpired
    Leased     -> Parked      ParkedForApproval
    Parked     -> Dispatched  ApprovalDecided
    Parked     -> Cancelled   CancelledWhileParked
""")

# Invariant 6 surfaces an Uncertain attempt to an operator, who may find out whether its side
# effect happened. That is a correction of the attempt's record, not a move of its machine
# (whose terminal states keep no exits): the only corrections there are.
ATTEMPT_RESOLUTIONS = machine(AttemptState)("""
    Uncertain -> Succeeded  OperatorResolved
    Uncertain -> Failed     OperatorResolved
""")

APPROVAL_TRANSITIONS = machine(ApprovalState)("""
    Pending -> Approved   Approve
    Pending -> Rejected   Reject
    Pending -> Expired    ExpiryReminder
    Pending -> Stale      ProposalChanged
    Pending -> Cancelled  RunCancelled
""")

TOOL_CALL_TRANSITIONS = machine(ToolCallState)("""
    Claimed -> Completed  ToolCallCompleted
    Claimed -> Expired    ClaimTimeout
""")


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


# ---------------------------------------------------------------------- commands by run state


class RunCommand(StrEnum):
    """What the aggregate's commands check against the run's state (``RUN_COMMANDS``)."""

    DISPATCH = "DispatchRun"
    ACQUIRE_LEASE = "AcquireLease"
    REQUEST_APPROVAL = "RequestApproval"
    CANCEL = "CancelRun"
    SUSPEND = "SuspendRun"
    RESUME = "ResumeRun"
    RETRY_STEP = "RetryStep"
    USE_TOOL_CALL = "ToolCall"  # claim or complete one
    START_TOOL_CALL = "StartToolCall"  # the first claim of a call id: a new side effect
    ENFORCE_DEADLINES = "EnforceDeadlines"  # the reminder
    EXPIRE_LEASE = "ExpireLease"  # the reminder; also whether a lease's clock runs
    SIGNAL = "SendSignal"  # an input from outside for a signal step


@dataclass(frozen=True, slots=True)
class Refusal:
    """How a command is refused: ``message`` is formatted with the run's ``{state}``;
    ``detailed``: the error's details name the run's state."""

    error: type[RunControlError]
    message: str
    detailed: bool = True

    def __call__(self, state: RunState) -> RunControlError:
        message = self.message.format(state=state)
        return self.error(message, run_state=str(state)) if self.detailed else self.error(message)


@dataclass(frozen=True, slots=True)
class Guard:
    """The run states that admit a command; in any other, ``refusals[state]`` or ``refusal``.
    A reminder's guard is only asked ``allows``: elsewhere it quietly does nothing."""

    allowed: frozenset[RunState]
    refusal: Refusal = Refusal(IllegalTransition, "not while the run is {state}")
    refusals: Mapping[RunState, Refusal] = field(default_factory=dict)


R = RunState
LIVE = frozenset(s for s in RunState if not s.terminal)


def _control(verb: str) -> dict[RunState, Refusal]:
    """An operator control: a finished run is rerun, never reopened; nor is a cancelling one."""
    finished = Refusal(RunTerminal, f"cannot {verb} a {{state}} run: rerun it instead")
    return {
        **{s: finished for s in RunState if s.terminal},
        R.CANCELLING: Refusal(IllegalTransition, f"cannot {verb} a run being cancelled"),
    }


RUN_COMMANDS: Mapping[RunCommand, Guard] = {
    # Invariant 4: no dispatch while WaitingForApproval or Cancelling.
    RunCommand.DISPATCH: Guard(
        frozenset({R.ACCEPTED, R.RUNNING}),
        Refusal(IllegalTransition, "no dispatch while the run is {state}"),
    ),
    RunCommand.ACQUIRE_LEASE: Guard(
        frozenset({R.RUNNING}), Refusal(LeaseRejected, "no lease while the run is {state}")
    ),
    RunCommand.REQUEST_APPROVAL: Guard(
        frozenset({R.RUNNING, R.WAITING_FOR_APPROVAL}),
        Refusal(IllegalTransition, "no approval request while the run is {state}"),
    ),
    # Cancelling twice, or a finished run, records nothing (the answer is the state).
    RunCommand.CANCEL: Guard(LIVE - {R.CANCELLING}),
    RunCommand.SUSPEND: Guard(
        frozenset({R.RUNNING, R.WAITING_FOR_APPROVAL}),
        refusals={
            **_control("suspend"),
            R.ACCEPTED: Refusal(
                IllegalTransition, "the run has not started: cancel it, or suspend it once it runs"
            ),
        },
    ),
    RunCommand.RESUME: Guard(
        frozenset({R.ACCEPTED, R.RUNNING, R.WAITING_FOR_APPROVAL}), refusals=_control("resume")
    ),
    RunCommand.RETRY_STEP: Guard(
        frozenset({R.RUNNING}),
        Refusal(IllegalTransition, "no retry while the run is {state}"),
        _control("retry a step of"),
    ),
    # After a hard stop nothing may execute, and no late result is recorded.
    RunCommand.USE_TOOL_CALL: Guard(LIVE, Refusal(RunTerminal, "the run is {state}")),
    RunCommand.START_TOOL_CALL: Guard(
        LIVE - {R.CANCELLING},
        Refusal(
            ToolCallRefused, "the run is being cancelled: start no new side effect", detailed=False
        ),
    ),
    # A human decision is never cut short by the run's clock, nor a suspended lease expired.
    RunCommand.ENFORCE_DEADLINES: Guard(LIVE - {R.WAITING_FOR_APPROVAL}),
    RunCommand.EXPIRE_LEASE: Guard(frozenset(RunState) - {R.WAITING_FOR_APPROVAL}),
    # A finished run takes no signal (it would be lost); nor does one being cancelled.
    RunCommand.SIGNAL: Guard(
        LIVE - {R.CANCELLING},
        refusals={
            **{
                s: Refusal(RunTerminal, "the run is {state}: it takes no more signals")
                for s in RunState
                if s.terminal
            },
            R.CANCELLING: Refusal(RunTerminal, "the run is being cancelled: it takes no signal"),
        },
    ),
}


def allows(command: RunCommand, state: RunState) -> bool:
    return state in RUN_COMMANDS[command].allowed


def refusal(command: RunCommand, state: RunState) -> RunControlError | None:
    """The error refusing ``command`` in ``state``, or None when the state admits it."""
    guard = RUN_COMMANDS[command]
    if state in guard.allowed:
        return None
    return guard.refusals.get(state, guard.refusal)(state)


def require(command: RunCommand, state: RunState) -> None:
    """Raise the refusal of ``command`` in ``state``, if it is refused."""
    error = refusal(command, state)
    if error is not None:
        raise error
