"""Commands as typed messages, each declared once: one frozen dataclass per command a run's
grain handles, with its ``declare(...)`` line.

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

import dataclasses
import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Generic, TypeVar
from uuid import UUID

from .declaration import (
    LEASE_HOLDER,
    OPERATOR,
    REVIEWER,
    SUBMITTER,
    AfterCommit,
    Declaration,
    caller,
    declare,
    declared,
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
    canonical_hash,
)
from .domain.output import OutputAck, OutputChunk
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
from .json_dumps import dumps

R = TypeVar("R")


def new_command_id() -> str:
    return str(uuid.uuid4())


def _plain(value: Any) -> Any:
    if isinstance(value, frozenset | set):
        return sorted(str(v.value if isinstance(v, Enum) else v) for v in value)
    return str(value)


# A field holding any JSON value (a result): fingerprinted by its canonical hash (orjson cannot
# write every JSON number, and the document would be as large as the value).
JSON_VALUE: dict[str, bool] = {"json": True}


_FINGERPRINTED: dict[type[Any], tuple[tuple[str, bool], ...]] = {}


def _fingerprinted(cls: type[Any]) -> tuple[tuple[str, bool], ...]:
    """The fields a command of ``cls`` is fingerprinted by, each with whether it is a JSON
    value (read once per class: every command is fingerprinted, issue 33)."""
    found = _FINGERPRINTED.get(cls)
    if found is None:
        found = _FINGERPRINTED[cls] = tuple(
            (f.name, bool(f.metadata.get("json")))
            for f in dataclasses.fields(cls)
            if f.name != "command_id"
        )
    return found


def fingerprint(command: Command[Any]) -> str:
    """A hash of what the command asks (its type and fields, not its id): a command id reused
    for a different command is told apart from a resend of the same one."""
    fields: dict[str, Any] = {}
    for name, json_value in _fingerprinted(type(command)):
        value = getattr(command, name)
        fields[name] = canonical_hash(value) if json_value and value is not None else value
    body = dumps([type(command).__name__, fields], _plain, sort_keys=True)
    return hashlib.sha256(body).hexdigest()


@dataclass(frozen=True, slots=True, kw_only=True)
class Command(Generic[R]):
    """A message to one run's grain that answers an ``R``."""

    tenant_id: str
    run_id: UUID
    command_id: str = field(default_factory=new_command_id)


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
        return payload


@declare(SUBMITTER)
@dataclass(frozen=True, slots=True, kw_only=True)
class SubmitRun(Command[SubmitResult]):
    """SubmitRun: accept (idempotent on tenant + project + key), reserve budget, dispatch.
    ``run_id`` is the id the run gets if this submission creates it."""

    principal: Principal
    request: SubmitRequest


@declare(system("run-dispatcher"))
@dataclass(frozen=True, slots=True, kw_only=True)
class StartRun(Command[None]):
    """Reserve the budget of an Accepted run and dispatch its first step (safe to repeat)."""


@declare(system("run-dispatcher"))
@dataclass(frozen=True, slots=True, kw_only=True)
class DispatchRun(Command[Attempt | None]):
    """RunDispatcher: dispatch the next due Pending step if capacity allows."""


@declare(
    caller("requested_by"),
    cancellation.cancel,
    answer=lambda run, c, cancelled, _: str(run.run.state),  # the state observed after it
)
@dataclass(frozen=True, slots=True, kw_only=True)
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
@dataclass(frozen=True, slots=True, kw_only=True)
class SendSignal(Command[SignalResult]):
    """An input from outside for the run's signal step named ``name``; ``body`` (JSON)
    becomes its result. ``sent_by`` is the verified caller (audited)."""

    name: str
    body: Any
    sent_by: str


@declare(system(children.CHILD_RUN), children.child_ended, dispatches=True)
@dataclass(frozen=True, slots=True, kw_only=True)
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
@dataclass(frozen=True, slots=True, kw_only=True)
class ReportToParent(Command[bool]):
    """To a child run: if it has ended, send its parent its end (``ChildRunEnded``). A
    parent's reminder asks it until the end is recorded; a run not there yet is
    ``RunNotFound`` (the parent then submits it). Answers whether it had ended."""


@declare(system("reminder"))
@dataclass(frozen=True, slots=True, kw_only=True)
class WakeRun(Command[WakeResult]):
    """The reminder: expire leases and approvals that are due, dispatch due retries."""


@declare(system("run-host"))
@dataclass(frozen=True, slots=True, kw_only=True)
class OpenAttempts(Command[list[UUID]]):
    """A read of the activation: ids of the run's non-terminal attempts (changes nothing)."""


# ---------------------------------------------------------------------- workers


@declare(LEASE_HOLDER, leases.acquire_lease, rpc="AcquireLease")
@dataclass(frozen=True, slots=True, kw_only=True)
class AcquireLease(Command[LeaseGrant]):
    attempt_id: UUID
    holder: str


@declare(LEASE_HOLDER, leases.renew_lease, rpc="AcquireLease")
@dataclass(frozen=True, slots=True, kw_only=True)
class RenewLease(Command[LeaseGrant]):
    attempt_id: UUID
    holder: str
    fencing_token: int
    lease_id: UUID | None = None  # when given, it must be the current lease


@declare(LEASE_HOLDER, outcomes.report_outcome, dispatches=True, rpc="ReportAttemptOutcome")
@dataclass(frozen=True, slots=True, kw_only=True)
class ReportOutcome(Command[Attempt]):
    """The attempt's one outcome. ``result``: what it produced, as JSON (at most
    ``RunControl:Results:MaxInlineBytes`` of canonical JSON), or ``result_ref`` ``{uri,
    sha256, bytes}`` for a larger artifact; the server hashes what it stores as the
    ``outcome_hash`` (one sent must equal it). Neither: ``outcome_hash`` is the caller's."""

    attempt_id: UUID
    holder: str
    fencing_token: int
    outcome: AttemptOutcome
    failure_class: FailureClass | None = None
    outcome_hash: str | None = None
    lease_id: UUID | None = None
    # data of the run: never in a log line (repr) or a span
    result: Any = field(default=None, repr=False, metadata=JSON_VALUE)
    result_ref: dict[str, Any] | None = None


@declare(LEASE_HOLDER, approvals.request_approval, rpc="RequestApproval")
@dataclass(frozen=True, slots=True, kw_only=True)
class RequestApproval(Command[ApprovalRequest | None]):
    attempt_id: UUID
    holder: str
    fencing_token: int
    proposal_hash: str
    action_class: SideEffectClass | None = None
    lease_id: UUID | None = None


@declare(LEASE_HOLDER, progress.report_progress, refuse=progress.gap_refusal, rpc="ReportProgress")
@dataclass(frozen=True, slots=True, kw_only=True)
class ReportProgress(Command[ProgressAck]):
    """The lease holder's progress messages, in sequence (at most ``PROGRESS_BATCH_MAX``):
    answers the cumulative ack; a gap is refused as ``errors.ProgressGap`` after the messages
    before it are stored."""

    attempt_id: UUID
    holder: str
    fencing_token: int
    messages: tuple[ProgressMessage, ...]
    lease_id: UUID | None = None


@declare(
    LEASE_HOLDER,
    usage.consume_rate,
    after_commit=AfterCommit.MOVE_RATE_BUCKET,
    rpc="ConsumeRateLimit",
)
@dataclass(frozen=True, slots=True, kw_only=True)
class ConsumeRateLimit(Command[RateConsumed]):
    """The lease holder used ``units`` of the named rate limit ``name`` (model tokens, say):
    the tenant's bucket of it moves by units / rate, so later dispatches drawing on it wait.
    Fenced: only the current lease holder's report counts."""

    attempt_id: UUID
    holder: str
    fencing_token: int
    name: str
    units: float
    lease_id: UUID | None = None


@declare(LEASE_HOLDER, outcomes.hand_back, dispatches=True, rpc="HandBackAttempt")
@dataclass(frozen=True, slots=True, kw_only=True)
class HandBackAttempt(Command[Attempt]):
    """The lease holder gives its attempt back now, for ``reason``: it settles as an expired
    lease's would (``TimedOut``, or ``Uncertain`` for a side-effecting step) and its step is
    retried under its policy, without waiting for the lease's expiry plus grace."""

    attempt_id: UUID
    holder: str
    fencing_token: int
    reason: str
    lease_id: UUID | None = None


@declare(LEASE_HOLDER, rpc="AppendOutput")
@dataclass(frozen=True, slots=True, kw_only=True)
class AppendOutput(Command[OutputAck]):
    """The lease holder's streamed output (``step.stream``), numbered per lease from 1: its
    own fenced insert beside the run's commits, not a turn of the grain (docs/streaming.md);
    chunks at or below the lease's last stored one are resends and dropped."""

    attempt_id: UUID
    holder: str
    fencing_token: int
    chunks: tuple[OutputChunk, ...]
    lease_id: UUID | None = None


@declare(LEASE_HOLDER, tool_calls.claim_tool_call, rpc="ClaimToolCall")
@dataclass(frozen=True, slots=True, kw_only=True)
class ClaimToolCall(Command[ToolCallClaim]):
    """Claim ``call_id`` before its side effect; execute only if the answer says ``proceed``."""

    attempt_id: UUID
    holder: str
    fencing_token: int
    call_id: str
    request_hash: str
    lease_id: UUID | None = None


@declare(LEASE_HOLDER, tool_calls.complete_tool_call, rpc="CompleteToolCall")
@dataclass(frozen=True, slots=True, kw_only=True)
class CompleteToolCall(Command[ToolCallClaim]):
    """Store the result of a call this attempt claimed and executed: its hash, and the
    result itself when sent (JSON, at most ``RunControl:Results:MaxInlineBytes``), which a
    repeat claim then answers."""

    attempt_id: UUID
    holder: str
    fencing_token: int
    call_id: str
    result_hash: str
    lease_id: UUID | None = None
    # data of the run: never in a log line (repr) or a span
    result: Any = field(default=None, repr=False, metadata=JSON_VALUE)


@declare(LEASE_HOLDER, journaled_calls.record_call, rpc="RecordCall")
@dataclass(frozen=True, slots=True, kw_only=True)
class RecordCall(Command[RecordedCall]):
    """Store the value of a journaled call (``step.run``): the ``occurrence``-th call named
    ``name`` in an execution of the attempt's step; ``value`` (JSON, at most
    ``RunControl:Results:MaxInlineBytes``) or its final ``error`` {type, message,
    failure_class}. A value stored under the key already is answered instead (use it, not
    yours). ``read_only``: store nothing, answer the stored value."""

    attempt_id: UUID
    holder: str
    fencing_token: int
    name: str
    occurrence: int
    # data of the run: never in a log line (repr) or a span
    value: Any = field(default=None, repr=False, metadata=JSON_VALUE)
    error: dict[str, Any] | None = field(default=None, repr=False)
    read_only: bool = False
    lease_id: UUID | None = None


# ---------------------------------------------------------------------- people


@declare(REVIEWER, approvals.decide_approval, dispatches=True)
@dataclass(frozen=True, slots=True, kw_only=True)
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
@dataclass(frozen=True, slots=True, kw_only=True)
class SuspendRun(Command[ControlResult]):
    """Hold the run: nothing new is dispatched or leased; leases in hand may finish."""

    principal: Principal
    reason: str


@declare(
    OPERATOR, controls.resume, dispatches=True, answer=lambda run, c, _, __: control_result(run)
)
@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeRun(Command[ControlResult]):
    """Lift a suspension and dispatch what is due."""

    principal: Principal
    reason: str


@declare(
    OPERATOR,
    controls.retry_step,
    dispatches=True,
    answer=lambda run, c, step, attempt: control_result(run, attempt, step.step_id),
)
@dataclass(frozen=True, slots=True, kw_only=True)
class RetryStep(Command[ControlResult]):
    """Dispatch a new attempt now of a step waiting for its retry (a live run only)."""

    principal: Principal
    reason: str
    step_id: UUID


@declare(
    OPERATOR,
    controls.resolve_attempt,
    dispatches=True,
    answer=lambda run, c, attempt, _: control_result(run, attempt),
)
@dataclass(frozen=True, slots=True, kw_only=True)
class ResolveAttempt(Command[ControlResult]):
    """Settle an Uncertain attempt as Succeeded or Failed."""

    principal: Principal
    reason: str
    attempt_id: UUID
    outcome: AttemptOutcome


class RerunRelease(StrEnum):
    """Which release a rerun runs: the one the finished run pinned, or what the alias names now."""

    PINNED = "pinned"
    CURRENT = "current"


@declare(OPERATOR)
@dataclass(frozen=True, slots=True, kw_only=True)
class RerunRun(Command[SubmitResult]):
    """Submit a new run (``run_id``, the new id) with the input of the finished run
    ``rerun_of``, linked to it. ``release``: the old run's pinned release, or the one
    ``release_alias`` names now. Idempotent on the command id (it makes the new run's key)."""

    principal: Principal
    reason: str
    rerun_of: UUID
    release: RerunRelease = RerunRelease.PINNED
    release_alias: str = "latest"


# ---------------------------------------------------------------------- operations


@declare(
    system(RESTORE_CHECK),
    restore.settle_restored_leases,
    answer=lambda run, c, settled, _: [str(attempt) for attempt in settled],
)
@dataclass(frozen=True, slots=True, kw_only=True)
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
    "ControlResult",
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
