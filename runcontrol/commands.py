"""Commands as typed messages, each declared once: one class per command a run's grain
handles, its fields under its ``declare(...)`` line (which makes it a frozen dataclass). A
lease holder's commands share ``Fenced`` (the attempt, the holder, the token), an operator's
``Control`` (the principal and the reason).

Every command names the run it is for (``tenant_id``, ``run_id``: a host routes on them) and
carries a ``command_id``, made by the client when the caller does not give one. The grain
stores a committed command's answer with its effect, keyed by (tenant, run, command id), so a
resend (a Ray retry, a lost reply, a client retry) gets the stored answer, never a second
effect (``runcontrol.grain``, DESIGN 4). ``Command[R]`` says what the command answers.

``declare`` (``runcontrol.declaration``) names the rest once: who sends it, the rule of the
run aggregate that decides it (``runcontrol.domain.run``), whether its statement dispatches
what became due, its after-commit effect, its gRPC method. From ``DECLARATIONS`` come the
grain's handler table (``grain.handlers``), the stored answer types (``store.answers``) and the
RPC table's command rows (``rpc.table``). Which run states admit a command is the
``RUN_COMMANDS`` table beside the state machines (``domain.machines``), checked by the rule.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Generic, TypeVar
from uuid import UUID

from .declaration import (
    JSON_VALUE,
    LEASE_HOLDER,
    OPERATOR,
    REVIEWER,
    SUBMITTER,
    AfterCommit,
    Declaration,
    caller,
    declare,
    declared,
    fingerprint,
    system,
)
from .domain import (
    ApprovalRequest,
    Attempt,
    AttemptOutcome,
    Decision,
    FailureClass,
    LeaseGrant,
    Limits,
    Principal,
    ProgressAck,
    ProgressMessage,
    RateConsumed,
    RecordedCall,
    RunAggregate,
    SideEffectClass,
    ToolCallClaim,
)
from .domain.output import OutputAck, OutputChunk
from .domain.replay import ReplayApprovals
from .domain.run import (
    RESTORE_CHECK,
    approvals,
    cancellation,
    children,
    controls,
    journaled_calls,
    leases,
    outcomes,
    progress,
    restore,
    tool_calls,
    usage,
    waits,
)

R = TypeVar("R")


def new_command_id() -> str:
    return str(uuid.uuid4())


@dataclass(frozen=True, slots=True, kw_only=True)
class Command(Generic[R]):
    """A message to one run's grain that answers an ``R``."""

    tenant_id: str
    run_id: UUID
    command_id: str = field(default_factory=new_command_id)


@dataclass(frozen=True, slots=True, kw_only=True)
class Fenced(Command[R]):
    """A lease holder's command on its attempt: fenced by its lease's token (and by the lease
    itself when it names one, ``lease_id``)."""

    attempt_id: UUID
    holder: str
    fencing_token: int


# ---------------------------------------------------------------------- answers


@dataclass(frozen=True, slots=True)
class SubmitResult:
    run_id: UUID
    state: str
    release_id: str
    policy_revision: str
    snapshot_id: UUID
    created: bool


@dataclass(frozen=True, slots=True)
class WakeResult:
    """What a reminder found due and did (counted by the events it recorded, not by this)."""

    started: bool = False
    leases_expired: int = 0
    approvals_expired: int = 0
    dispatched: bool = False
    # wall-clock-exceeded / lifetime-exceeded (a cancellation recorded), stop-timeout (open
    # attempts settled Uncertain), or None
    stopped: str | None = None
    tool_calls_expired: int = 0


# ---------------------------------------------------------------------- runs


@dataclass(frozen=True, slots=True)
class ParentRef:
    """The run and step a child run is started by, and the child's depth."""

    run_id: UUID
    step_id: UUID
    depth: int


@dataclass(frozen=True, slots=True)
class TemplateRef:
    """The template version a run is submitted from (issue 44): its pre-approvals apply."""

    template_id: str
    version: int


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
    priority: int = 3  # 1-5 (issue 21); above 3 needs the runs.priority scope
    # A child run's (issue 32: set by its parent's grain, never by a client): the run and
    # step that start it; its depth is the parent's + 1. Not in the canonical payload.
    parent: ParentRef | None = None
    template: TemplateRef | None = None  # its input already merged and checked (issue 44)

    def canonical_payload(self) -> dict[str, Any]:
        payload: dict[str, Any] = {
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
        if self.priority != 3:  # absent at the default: older submissions keep their hash
            payload["priority"] = self.priority
        if self.template is not None:  # absent without one: older submissions keep their hash
            payload["template"] = [self.template.template_id, self.template.version]
        return payload


@declare(SUBMITTER)
class SubmitRun(Command[SubmitResult]):
    """SubmitRun: accept (idempotent on tenant + project + key), reserve budget, dispatch.
    ``run_id`` is the id the run gets if this submission creates it."""

    principal: Principal
    request: SubmitRequest


@declare(system("run-dispatcher"))
class StartRun(Command[None]):
    """Reserve the budget of an Accepted run and dispatch its first step (safe to repeat)."""


@declare(system("run-dispatcher"))
class DispatchRun(Command[Attempt | None]):
    """RunDispatcher: dispatch the next due Pending step if capacity allows."""


@declare(
    caller("requested_by"),
    cancellation.cancel,
    answer=lambda run, c, cancelled, _: str(run.run.state),  # the state observed after it
)
class CancelRun(Command[str]):
    """Record the cancellation intent; answers the run's state observed after it."""

    requested_by: str
    reason: str


@dataclass(frozen=True, slots=True)
class SignalResult:
    """What a signal answers: the step it is for and whether that step took it now (else it
    is kept until the step waits), and the run's state after it."""

    run_id: UUID
    step_id: UUID
    name: str
    delivered: bool
    state: str


def signal_result(
    run: RunAggregate, command: SendSignal, step: Any, dispatched: Attempt | None
) -> SignalResult:
    """The step the signal is for, whether it took it now, and the run's state after it."""
    return SignalResult(
        run_id=run.run.run_id,
        step_id=step.step_id,
        name=command.name,
        delivered=step.state.terminal,
        state=str(run.run.state),
    )


@declare(caller("sent_by"), waits.receive_signal, dispatches=True, answer=signal_result)
class SendSignal(Command[SignalResult]):
    """An input from outside for the run's signal step named ``name``; ``body`` (JSON)
    becomes its result. ``sent_by`` is the verified caller (audited)."""

    name: str
    body: Any
    sent_by: str


@declare(system(children.CHILD_RUN), children.child_ended, dispatches=True)
class ChildRunEnded(Command[str]):
    """To a parent run: its step ``step_id``'s child run ``child_run_id`` ended ``state``
    (with its ``result`` when Completed, its failure otherwise). Sent by the child's grain
    after its terminal commit (and again when the parent asks, ``ReportToParent``); its id
    names the child, so a resend is answered once. Answers the step's state after it."""

    step_id: UUID
    child_run_id: UUID
    state: str
    result: Any = field(default=None, metadata=JSON_VALUE)
    failure_class: str | None = None
    reason: str | None = None


@declare(system(children.CHILD_RUN))
class ReportToParent(Command[bool]):
    """To a child run: if it has ended, send its parent its end (``ChildRunEnded``). A
    parent's reminder asks it until the end is recorded; a run not there yet is
    ``RunNotFound`` (the parent then submits it). Answers whether it had ended."""


@declare(system("reminder"))
class WakeRun(Command[WakeResult]):
    """The reminder: expire leases and approvals that are due, dispatch due retries."""


@declare(system("run-host"))
class OpenAttempts(Command[list[UUID]]):
    """A read of the activation: ids of the run's non-terminal attempts (changes nothing)."""


# ---------------------------------------------------------------------- workers


@declare(LEASE_HOLDER, leases.acquire_lease, rpc="AcquireLease")
class AcquireLease(Command[LeaseGrant]):
    attempt_id: UUID
    holder: str


@declare(LEASE_HOLDER, leases.renew_lease, rpc="AcquireLease")
class RenewLease(Fenced[LeaseGrant]):
    lease_id: UUID | None = None  # when given, it must be the current lease


@declare(LEASE_HOLDER, outcomes.report_outcome, dispatches=True, rpc="ReportAttemptOutcome")
class ReportOutcome(Fenced[Attempt]):
    """The attempt's one outcome. ``result``: what it produced, as JSON (at most
    ``RunControl:Results:MaxInlineBytes`` of canonical JSON), or ``result_ref`` ``{uri,
    sha256, bytes}`` for a larger artifact; the server hashes what it stores as the
    ``outcome_hash`` (one sent must equal it). Neither: ``outcome_hash`` is the caller's."""

    outcome: AttemptOutcome
    failure_class: FailureClass | None = None
    outcome_hash: str | None = None
    lease_id: UUID | None = None
    # data of the run: never in a log line (repr) or a span
    result: Any = field(default=None, repr=False, metadata=JSON_VALUE)
    result_ref: dict[str, Any] | None = None


@declare(LEASE_HOLDER, approvals.request_approval, rpc="RequestApproval")
class RequestApproval(Fenced[ApprovalRequest | None]):
    proposal_hash: str
    action_class: SideEffectClass | None = None
    lease_id: UUID | None = None
    # The proposal itself (any JSON, hashing to proposal_hash): what a template's proposal
    # constraint is checked against (issue 44). None: only an unconstrained one applies.
    proposal: Any = None


@declare(LEASE_HOLDER, progress.report_progress, refuse=progress.gap_refusal, rpc="ReportProgress")
class ReportProgress(Fenced[ProgressAck]):
    """The lease holder's progress messages, in sequence (at most ``PROGRESS_BATCH_MAX``):
    answers the cumulative ack; a gap is refused as ``errors.ProgressGap`` after the messages
    before it are stored."""

    messages: tuple[ProgressMessage, ...]
    lease_id: UUID | None = None


@declare(
    LEASE_HOLDER,
    usage.consume_rate,
    after_commit=AfterCommit.MOVE_RATE_BUCKET,
    rpc="ConsumeRateLimit",
)
class ConsumeRateLimit(Fenced[RateConsumed]):
    """The lease holder used ``units`` of the named rate limit ``name`` (model tokens, say):
    the tenant's bucket of it moves by units / rate, so later dispatches drawing on it wait.
    Fenced: only the current lease holder's report counts."""

    name: str
    units: float
    lease_id: UUID | None = None


@declare(LEASE_HOLDER, outcomes.hand_back, dispatches=True, rpc="HandBackAttempt")
class HandBackAttempt(Fenced[Attempt]):
    """The lease holder gives its attempt back now, for ``reason``: it settles as an expired
    lease's would (``TimedOut``, or ``Uncertain`` for a side-effecting step) and its step is
    retried under its policy, without waiting for the lease's expiry plus grace."""

    reason: str
    lease_id: UUID | None = None


@declare(LEASE_HOLDER, rpc="AppendOutput")
class AppendOutput(Fenced[OutputAck]):
    """The lease holder's streamed output (``step.stream``), numbered per lease from 1: its
    own fenced insert beside the run's commits, not a turn of the grain (docs/streaming.md);
    chunks at or below the lease's last stored one are resends and dropped."""

    chunks: tuple[OutputChunk, ...]
    lease_id: UUID | None = None


@declare(LEASE_HOLDER, tool_calls.claim_tool_call, rpc="ClaimToolCall")
class ClaimToolCall(Fenced[ToolCallClaim]):
    """Claim ``call_id`` before its side effect; execute only if the answer says ``proceed``."""

    call_id: str
    request_hash: str
    lease_id: UUID | None = None


@declare(LEASE_HOLDER, tool_calls.complete_tool_call, rpc="CompleteToolCall")
class CompleteToolCall(Fenced[ToolCallClaim]):
    """Store the result of a call this attempt claimed and executed: its hash, and the
    result itself when sent (JSON, at most ``RunControl:Results:MaxInlineBytes``), which a
    repeat claim then answers."""

    call_id: str
    result_hash: str
    lease_id: UUID | None = None
    # data of the run: never in a log line (repr) or a span
    result: Any = field(default=None, repr=False, metadata=JSON_VALUE)


@declare(LEASE_HOLDER, journaled_calls.record_call, rpc="RecordCall")
class RecordCall(Fenced[RecordedCall]):
    """Store the value of a journaled call (``step.run``): the ``occurrence``-th call named
    ``name`` in an execution of the attempt's step; ``value`` (JSON, at most
    ``RunControl:Results:MaxInlineBytes``) or its final ``error`` {type, message,
    failure_class}. A value stored under the key already is answered instead (use it, not
    yours). ``read_only``: store nothing, answer the stored value (in a replay: the
    original's, docs/replay.md). ``request_hash``: the hash of the call's arguments."""

    name: str
    occurrence: int
    # data of the run: never in a log line (repr) or a span
    value: Any = field(default=None, repr=False, metadata=JSON_VALUE)
    error: dict[str, Any] | None = field(default=None, repr=False)
    read_only: bool = False
    lease_id: UUID | None = None
    request_hash: str | None = None


# ---------------------------------------------------------------------- people


@declare(REVIEWER, approvals.decide_approval, dispatches=True)
class DecideApproval(Command[ApprovalRequest]):
    approval_id: UUID
    principal: Principal
    decision: Decision
    version: int
    proposal_hash: str
    reason: str | None = None


# ---------------------------------------------------------------------- operator controls


@dataclass(frozen=True, slots=True)
class ControlResult:
    """What an operator control answers: the run as the control left it."""

    run_id: UUID
    state: str
    suspended: bool
    step_id: UUID | None = None
    attempt_id: UUID | None = None  # retry: the new attempt (if dispatched); resolve: its own
    attempt_state: str | None = None
    attempt_number: int | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Control(Command[R]):
    """An operator's control of the run: who asks (a principal of the run's tenant) and why."""

    principal: Principal
    reason: str


def control_result(
    agg: RunAggregate, attempt: Attempt | None = None, step_id: UUID | None = None
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


@declare(OPERATOR, controls.suspend, answer=lambda run, c, _, __: control_result(run))
class SuspendRun(Control[ControlResult]):
    """Hold the run: nothing new is dispatched or leased; leases in hand may finish."""


@declare(
    OPERATOR, controls.resume, dispatches=True, answer=lambda run, c, _, __: control_result(run)
)
class ResumeRun(Control[ControlResult]):
    """Lift a suspension and dispatch what is due."""


@declare(
    OPERATOR,
    controls.retry_step,
    dispatches=True,
    answer=lambda run, c, step, attempt: control_result(run, attempt, step.step_id),
)
class RetryStep(Control[ControlResult]):
    """Dispatch a new attempt now of a step waiting for its retry (a live run only)."""

    step_id: UUID


@declare(
    OPERATOR,
    controls.resolve_attempt,
    dispatches=True,
    answer=lambda run, c, attempt, _: control_result(run, attempt),
)
class ResolveAttempt(Control[ControlResult]):
    """Settle an Uncertain attempt as Succeeded or Failed."""

    attempt_id: UUID
    outcome: AttemptOutcome


class RerunRelease(StrEnum):
    """Which release a rerun runs: the one the finished run pinned, or what the alias names now."""

    PINNED = "pinned"
    CURRENT = "current"


@declare(OPERATOR)
class RerunRun(Control[SubmitResult]):
    """Submit a new run (``run_id``, the new id) with the input of the finished run
    ``rerun_of``, linked to it. ``release``: the old run's pinned release, or the one
    ``release_alias`` names now. Idempotent on the command id (it makes the new run's key)."""

    rerun_of: UUID
    release: RerunRelease = RerunRelease.PINNED
    release_alias: str = "latest"


@declare(OPERATOR)
class ReplayRun(Control[SubmitResult]):
    """Submit a replay (``run_id``, the new id) of the finished run ``replay_of`` on the release
    ``release_alias`` names now, with its input: its journaled calls answered from the
    original's journal (docs/replay.md). ``live_calls``: a call the original did not make is
    made live (model requests; never a side effect), else the step fails replay-diverged;
    ``approvals``: a proposal the original never had approved waits for a human (``park``)
    or fails the step (``fail``). Idempotent on the command id."""

    replay_of: UUID
    release_alias: str = "latest"
    live_calls: bool = False
    approvals: ReplayApprovals = ReplayApprovals.PARK


# ---------------------------------------------------------------------- operations


@declare(
    system(RESTORE_CHECK),
    restore.settle_restored_leases,
    answer=lambda run, c, settled, _: [str(attempt) for attempt in settled],
)
class SettleRestoredLeases(Command[list[str]]):
    """restore-check, after the store was restored from a backup: revoke the run's open
    leases and settle their attempts Uncertain; answers the ids of the attempts settled."""


# Every command, declared (the grain's handlers, the stored answer types and the RPC table's
# command rows are derived from it).
DECLARATIONS: Mapping[type[Command[Any]], Declaration] = declared()

__all__ = [
    "DECLARATIONS",
    "AcquireLease",
    "AppendOutput",
    "CancelRun",
    "ChildRunEnded",
    "ParentRef",
    "ClaimToolCall",
    "Command",
    "CompleteToolCall",
    "ConsumeRateLimit",
    "Control",
    "ControlResult",
    "Fenced",
    "DecideApproval",
    "DispatchRun",
    "HandBackAttempt",
    "OpenAttempts",
    "RenewLease",
    "RecordCall",
    "ReportOutcome",
    "ReportProgress",
    "RequestApproval",
    "RerunRelease",
    "RerunRun",
    "ReplayRun",
    "ResolveAttempt",
    "ResumeRun",
    "RetryStep",
    "SendSignal",
    "SettleRestoredLeases",
    "SignalResult",
    "StartRun",
    "SubmitRequest",
    "SubmitResult",
    "SubmitRun",
    "SuspendRun",
    "TemplateRef",
    "WakeResult",
    "ReportToParent",
    "WakeRun",
    "control_result",
    "fingerprint",
    "new_command_id",
    "signal_result",
]

_undeclared = {c.__name__ for c in DECLARATIONS} - set(__all__)
if _undeclared:
    raise TypeError(f"commands.__all__ lacks {sorted(_undeclared)}")
