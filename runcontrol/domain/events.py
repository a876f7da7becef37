"""The run's events, one frozen dataclass per type: the one definition of each payload.

A class names its type (the class name), its topic and its schema version; its fields are the
payload's, in snake_case. ``to_payload`` gives the JSON object the outbox stores (camelCase
keys, ids and times as strings, enums by value): consumers of the outbox, the per-run and
tenant feeds and webhooks read exactly that, and ``payload_schema`` describes it as JSON Schema
(served at ``GET /factory/schemas/events``). A payload never changes meaning under a version:
a new meaning is a new ``schema_version``.

Every key is always present (a value may be null), so the schema requires them all.

A new event type is a class here (``topic`` set, fields typed) and the aggregate's
``self._emit(ctx, NewEvent(...))``: the registry, ``TOPICS``, the stored payload and the schema
follow from the class.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar, TypeVar
from uuid import UUID

from .states import (
    ApprovalState,
    AttemptOutcome,
    FailureClass,
    RunState,
    SideEffectClass,
    ToolCallState,
)

PRODUCER = "runcontrol"
Encode = Callable[[Any], Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class EventBody:
    """The typed payload of one event. Subclasses set ``topic`` (and ``schema_version``)."""

    topic: ClassVar[str]
    schema_version: ClassVar[int] = 1
    # (attribute, JSON key, encoder or None): filled by ``_register`` for each type.
    _codec: ClassVar[tuple[tuple[str, str, Encode | None], ...]] = ()

    @classmethod
    def event_type(cls) -> str:
        return cls.__name__

    def to_payload(self) -> dict[str, Any]:
        """The stored JSON object (camelCase keys; None stays null)."""
        payload: dict[str, Any] = {}
        for attr, key, encode in self._codec:
            value = getattr(self, attr)
            payload[key] = value if encode is None or value is None else encode(value)
        return payload

    @classmethod
    def payload_schema(cls) -> dict[str, Any]:
        """The JSON Schema (draft 2020-12) of ``to_payload``'s object."""
        hints = typing.get_type_hints(cls)
        properties = {key: _schema(hints[attr]) for attr, key, _ in cls._codec}
        return {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": f"urn:runcontrol:event:{cls.topic}",
            "title": cls.event_type(),
            "description": (cls.__doc__ or "").strip(),
            "type": "object",
            "properties": properties,
            "required": list(properties),
            "additionalProperties": False,
        }


# ---------------------------------------------------------------------- the run


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEventBody(EventBody):
    """A payload that names its run (all but the lease reconcilers')."""

    run_id: UUID


@dataclass(frozen=True, slots=True, kw_only=True)
class RunAccepted(RunEventBody):
    """The run was accepted and pinned to its release, policy revision and model profile."""

    topic = "run-control.runs.v1.run-accepted"
    tenant_id: str
    project_id: str
    workflow_id: str
    release_id: str
    policy_revision: str
    model_profile_id: str
    requested_by: str
    # A child run's parent run and step (issue 32); null for a run a client submitted.
    parent_run_id: UUID | None = None
    parent_step_id: UUID | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunStateChanged(RunEventBody):
    """The run moved from one state to another; ``cause`` is the transition's."""

    topic = "run-control.runs.v1.run-state-changed"
    tenant_id: str
    from_state: RunState
    to_state: RunState
    cause: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCompleted(RunEventBody):
    """Every step succeeded; ``outcomeHash`` hashes the steps' outcome hashes in order;
    ``resultHash`` is the run's result's (its final step's), null when it sent none."""

    topic = "run-control.runs.v1.run-completed"
    tenant_id: str
    outcome_hash: str | None
    result_hash: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class RunFailed(RunEventBody):
    """The run ended Failed."""

    topic = "run-control.runs.v1.run-failed"
    tenant_id: str
    failure_class: FailureClass
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCancelled(RunEventBody):
    """The run ended Cancelled: every attempt settled."""

    topic = "run-control.runs.v1.run-cancelled"
    tenant_id: str
    reason: str | None
    requested_by: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CancellationRequested(RunEventBody):
    """The intent to cancel was recorded (before anything settles)."""

    topic = "run-control.runs.v1.cancellation-requested"
    requested_by: str
    reason: str


# ---------------------------------------------------------------------- attempts and leases


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptDispatched(RunEventBody):
    """A step's attempt is claimable; its lease and token come with the claim (null here)."""

    topic = "run-control.attempts.v1.attempt-dispatched"
    step_id: UUID
    attempt_id: UUID
    lease_id: UUID | None = None
    fencing_token: int | None = None
    agent_id: str
    skill_id: str | None
    attempt_number: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseGranted(RunEventBody):
    """A worker holds the attempt's lease, fenced by ``fencingToken``."""

    topic = "run-control.leases.v1.lease-granted"
    step_id: UUID
    attempt_id: UUID
    lease_id: UUID
    fencing_token: int
    holder: str
    expires_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptParked(RunEventBody):
    """The attempt waits for an approval decision, holding no lease."""

    topic = "run-control.attempts.v1.attempt-parked"
    step_id: UUID
    attempt_id: UUID
    approval_id: UUID
    lease_id: UUID | None
    fencing_token: int | None
    holder: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptResumed(RunEventBody):
    """After the decision the parked attempt is claimable again (a new lease, a new token)."""

    topic = "run-control.attempts.v1.attempt-resumed"
    step_id: UUID
    attempt_id: UUID
    approval_id: UUID
    approval_state: ApprovalState
    agent_id: str
    skill_id: str | None
    attempt_number: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptOutcomeRecorded(RunEventBody):
    """The attempt's one outcome."""

    topic = "run-control.attempts.v1.attempt-outcome-recorded"
    step_id: UUID
    attempt_id: UUID
    outcome: AttemptOutcome
    failure_class: FailureClass | None
    outcome_hash: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRetryScheduled(RunEventBody):
    """The step's next attempt is due at ``notBefore`` (backoff with jitter)."""

    topic = "run-control.steps.v1.step-retry-scheduled"
    step_id: UUID
    next_attempt_number: int
    not_before: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class StepWaiting(RunEventBody):
    """A step no worker executes started to wait: ``kind`` ``wait`` for its timer, until
    ``until``; ``signal`` for the signal named ``signal``, until ``until`` (its timeout; null:
    no timeout). The run stays Running; the wait holds no worker."""

    topic = "run-control.steps.v1.step-waiting"
    step_id: UUID
    kind: str
    signal: str | None
    until: datetime | None


@dataclass(frozen=True, slots=True, kw_only=True)
class StepWaitEnded(RunEventBody):
    """The step's wait ended (``cause``: ``timer-fired``, ``signal-received``, or
    ``signal-timed-out``: the step then succeeded with its default, or failed the run)."""

    topic = "run-control.steps.v1.step-wait-ended"
    step_id: UUID
    cause: str


@dataclass(frozen=True, slots=True, kw_only=True)
class StepSkipped(RunEventBody):
    """The step will not run (issue 32): ``cause`` ``ConditionFalse`` (its ``when`` was
    false) or ``DependenciesSkipped`` (every step it depends on was skipped)."""

    topic = "run-control.steps.v1.step-skipped"
    step_id: UUID
    cause: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildRunStarted(RunEventBody):
    """The run step started its child run ``childRunId`` of ``workflowId`` (its ``number``th:
    a retry starts the next); the child is submitted after this commits."""

    topic = "run-control.children.v1.child-run-started"
    step_id: UUID
    child_run_id: UUID
    workflow_id: str
    number: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ChildRunEnded(RunEventBody):
    """The run step's child run ended ``state`` (Completed: its result is the step's)."""

    topic = "run-control.children.v1.child-run-ended"
    step_id: UUID
    child_run_id: UUID
    state: str
    reason: str | None
    result_hash: str | None  # the child's result's hash when Completed (never the result)
    failure_class: FailureClass | None  # what the step fails with, when not Completed
    child_state: str | None  # the child run's state; None: its submission was refused


@dataclass(frozen=True, slots=True, kw_only=True)
class SignalReceived(RunEventBody):
    """A signal for the step arrived from ``sentBy``; ``delivered``: the step was waiting and
    took it now (otherwise it is kept until the step waits). The body is not in the event."""

    topic = "run-control.signals.v1.signal-received"
    step_id: UUID
    signal_id: UUID
    name: str
    sent_by: str
    delivered: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseExpired(EventBody):
    """The lease passed its expiry and grace without a renewal; the attempt settles next."""

    topic = "run-control.leases.v1.lease-expired"
    attempt_id: UUID
    lease_id: UUID
    holder: str
    fencing_token: int


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseHandedBack(EventBody):
    """The lease holder gave its attempt back before its lease ended; the attempt settles
    next, as an expired lease's would."""

    topic = "run-control.leases.v1.lease-handed-back"
    attempt_id: UUID
    lease_id: UUID
    holder: str
    fencing_token: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseRevoked(EventBody):
    """The lease was revoked (after a restore from backup: it may have been acted on)."""

    topic = "run-control.leases.v1.lease-revoked"
    attempt_id: UUID
    lease_id: UUID
    holder: str
    fencing_token: int
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ProgressReported(RunEventBody):
    """One progress message of the lease holder, in its attempt's sequence."""

    topic = "run-control.attempts.v1.progress-reported"
    step_id: UUID
    attempt_id: UUID
    seq: int
    text: str | None
    payload: dict[str, Any] | None


@dataclass(frozen=True, slots=True, kw_only=True)
class CallRecorded(RunEventBody):
    """A journaled call's value (or final error) was stored under (step, ``name``,
    ``occurrence``): every later execution of the step gets it back. Its hash and size only,
    never its content."""

    topic = "run-control.attempts.v1.call-recorded"
    step_id: UUID
    attempt_id: UUID
    name: str
    occurrence: int
    value_hash: str
    bytes: int
    failed: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class RateLimitConsumed(RunEventBody):
    """The lease holder reported using ``units`` of the named rate limit ``name`` (its
    tenant's bucket ``bucket`` moved by them: later dispatches drawing on it wait)."""

    topic = "run-control.attempts.v1.rate-limit-consumed"
    step_id: UUID
    attempt_id: UUID
    name: str
    bucket: str
    units: float


# ---------------------------------------------------------------------- approvals


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalRequested(EventBody):
    """A human must decide on this exact proposal."""

    topic = "run-control.approvals.v1.approval-requested"
    approval_id: UUID
    run_id: UUID
    step_id: UUID
    tenant_id: str
    action_class: SideEffectClass
    proposal_hash: str
    approver_rule: str
    expires_at: datetime


@dataclass(frozen=True, slots=True, kw_only=True)
class ApprovalDecided(EventBody):
    """The request left Pending (decided, expired, stale or cancelled)."""

    topic = "run-control.approvals.v1.approval-decided"
    approval_id: UUID
    run_id: UUID
    tenant_id: str
    state: ApprovalState
    decided_by: str | None
    reason: str | None


# ---------------------------------------------------------------------- tool calls


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallEventBody(RunEventBody):
    """What every tool call event carries: the call as it now is."""

    attempt_id: UUID
    tool_call_id: UUID
    call_id: str
    request_hash: str
    state: ToolCallState
    result_hash: str | None
    error: str | None


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallClaimed(ToolCallEventBody):
    """The call was claimed before its side effect: the claimer may execute it, once."""

    topic = "run-control.tool-calls.v1.tool-call-claimed"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallCompleted(ToolCallEventBody):
    """The call's result hash is stored; a repeat claim gets it."""

    topic = "run-control.tool-calls.v1.tool-call-completed"


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolCallExpired(ToolCallEventBody):
    """No result within the claim timeout: closed, never executed again."""

    topic = "run-control.tool-calls.v1.tool-call-expired"


# ---------------------------------------------------------------------- operator controls


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlEventBody(RunEventBody):
    """What every operator control records: the run's state after it, who asked and why."""

    tenant_id: str
    state: RunState
    suspended: bool
    requested_by: str
    reason: str


@dataclass(frozen=True, slots=True, kw_only=True)
class RunSuspended(ControlEventBody):
    """An operator suspended the run: nothing new is dispatched or leased."""

    topic = "run-control.runs.v1.run-suspended"


@dataclass(frozen=True, slots=True, kw_only=True)
class RunResumed(ControlEventBody):
    """An operator lifted the suspension."""

    topic = "run-control.runs.v1.run-resumed"


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRetryRequested(ControlEventBody):
    """An operator skipped the step's backoff: its next attempt is dispatched now."""

    topic = "run-control.steps.v1.step-retry-requested"
    step_id: UUID
    next_attempt_number: int


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptOutcomeResolved(ControlEventBody):
    """An operator resolved an Uncertain attempt as Succeeded or Failed."""

    topic = "run-control.attempts.v1.attempt-outcome-resolved"
    step_id: UUID
    attempt_id: UUID
    from_outcome: AttemptOutcome
    outcome: AttemptOutcome


@dataclass(frozen=True, slots=True, kw_only=True)
class RunRerun(ControlEventBody):
    """This run reruns the finished run ``rerunOf`` (``release``: pinned or current)."""

    topic = "run-control.runs.v1.run-rerun"
    rerun_of: UUID
    release: str
    release_id: str


# ---------------------------------------------------------------------- the registry

B = TypeVar("B", bound=type[EventBody])


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _encoder(hint: Any) -> Encode | None:
    """How a non-null field value becomes JSON: ids by ``str``, times by ISO 8601, enums by
    value; anything else is JSON already."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        hint = args[0]
    if hint is UUID or (isinstance(hint, type) and issubclass(hint, StrEnum)):
        return str
    if hint is datetime:
        return datetime.isoformat
    return None


def _schema(hint: Any) -> dict[str, Any]:
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [_schema(a) for a in typing.get_args(hint) if a is not type(None)]
        if len(options) == 1 and type(None) in typing.get_args(hint):
            return {"anyOf": [*options, {"type": "null"}]}
        return {"anyOf": options}
    if hint is UUID:
        return {"type": "string", "format": "uuid"}
    if hint is datetime:
        return {"type": "string", "format": "date-time"}
    if isinstance(hint, type) and issubclass(hint, StrEnum):
        return {"type": "string", "enum": [m.value for m in hint]}
    if hint is bool:
        return {"type": "boolean"}
    if hint is int:
        return {"type": "integer"}
    if hint is float:
        return {"type": "number"}
    if hint is str:
        return {"type": "string"}
    if origin is dict:
        return {"type": "object"}
    raise TypeError(f"no JSON Schema for {hint!r}")


def _register(*classes: type[EventBody]) -> Mapping[str, type[EventBody]]:
    registry: dict[str, type[EventBody]] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        cls._codec = tuple((f.name, _camel(f.name), _encoder(hints[f.name])) for f in fields(cls))
        cls.payload_schema()  # fails here, at import, for a field type without a schema
        if cls.event_type() in registry:
            raise TypeError(f"event type {cls.event_type()} is defined twice")
        if f".v{cls.schema_version}." not in cls.topic:
            raise TypeError(
                f"{cls.event_type()}: topic {cls.topic} is not schema version {cls.schema_version}"
            )
        registry[cls.event_type()] = cls
    return registry


# Every event class of this module with a topic of its own (the abstract bases have none), in
# the order they are defined: defining the class is registering it.
EVENT_TYPES: Mapping[str, type[EventBody]] = _register(
    *(
        c
        for c in list(globals().values())
        if isinstance(c, type) and issubclass(c, EventBody) and "topic" in vars(c)
    )
)

# event type -> topic (derived: the classes are the one definition)
TOPICS: Mapping[str, str] = {name: cls.topic for name, cls in EVENT_TYPES.items()}


# The events that end a run's stream: nothing follows them.
TERMINAL_EVENTS: frozenset[str] = frozenset(
    cls.event_type() for cls in (RunCompleted, RunFailed, RunCancelled)
)


def payload_schemas() -> dict[str, dict[str, Any]]:
    """Every event type's topic, schema version and payload schema, by type."""
    return {
        name: {
            "topic": cls.topic,
            "schemaVersion": cls.schema_version,
            "payload": cls.payload_schema(),
        }
        for name, cls in EVENT_TYPES.items()
    }
