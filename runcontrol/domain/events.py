"""The run's events, one frozen dataclass per type: the one definition of each payload.

``@event("runs")`` declares a type: the class's name is the event type, its topic is
``run-control.<family>.v<version>.<the name in kebab-case>`` (``tests/unit/test_event_types``
pins every published one), its fields are the payload's, in snake_case; a base names what a
family of events shares (the run, the step, the attempt, the lease). ``to_payload`` gives the
JSON object the outbox stores (camelCase keys, ids and times as strings, enums by value):
consumers of the outbox, the per-run and tenant feeds and webhooks read exactly that, and
``payload_schema`` describes it as JSON Schema (served at ``GET /factory/schemas/events``). A
payload never changes meaning under a version: a new meaning is a new ``version``.

Every key is always present (a value may be null), so the schema requires them all.

A new event type is a class here (``@event(family)``, fields typed) and the aggregate's
``self._emit(ctx, NewEvent(...))``: the registry, ``TOPICS``, the stored payload and the schema
follow from the class.
"""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from datetime import datetime
from enum import StrEnum
from typing import Any, ClassVar, TypeVar, dataclass_transform
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
    """The typed payload of one event; ``@event`` sets its ``topic`` and ``schema_version``."""

    topic: ClassVar[str]
    schema_version: ClassVar[int] = 1
    # (attribute, JSON key, encoder or None): filled by ``_register`` for each type.
    _codec: ClassVar[tuple[tuple[str, str, Encode | None], ...]] = ()

    @classmethod
    def event_type(cls) -> str:
        return cls.__name__

    def to_payload(self) -> dict[str, Any]:
        """The stored JSON object (camelCase keys; None stays null). Each registered type has
        its own, compiled from its ``_codec`` (``_payload_maker``): this is the reference."""
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


B = TypeVar("B", bound=EventBody)

# The event types in the order they are declared (``EVENT_TYPES`` registers them).
_DECLARED: list[type[EventBody]] = []


@dataclass_transform(frozen_default=True, kw_only_default=True)
def event(family: str, *, version: int = 1) -> Callable[[type[B]], type[B]]:
    """Declare an event type: a frozen, slotted, keyword-only dataclass with its topic."""

    def declare(cls: type[B]) -> type[B]:
        kebab = re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower()
        cls.topic = f"run-control.{family}.v{version}.{kebab}"
        cls.schema_version = version
        body = dataclass(frozen=True, slots=True, kw_only=True)(cls)
        _DECLARED.append(body)
        return body

    return declare


# ---------------------------------------------------------------------- the run


@dataclass(frozen=True, slots=True, kw_only=True)
class RunEventBody(EventBody):
    """A payload that names its run (all but the lease reconcilers')."""

    run_id: UUID


@dataclass(frozen=True, slots=True, kw_only=True)
class StepEventBody(RunEventBody):
    """A payload that names the run's step."""

    step_id: UUID


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptEventBody(StepEventBody):
    """A payload that names the step's attempt."""

    attempt_id: UUID


@event("runs")
class RunAccepted(RunEventBody):
    """The run was accepted and pinned to its release, policy revision and model profile."""

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


@event("runs")
class RunStateChanged(RunEventBody):
    """The run moved from one state to another; ``cause`` is the transition's."""

    tenant_id: str
    from_state: RunState
    to_state: RunState
    cause: str


@event("runs")
class RunCompleted(RunEventBody):
    """Every step succeeded; ``outcomeHash`` hashes the steps' outcome hashes in order;
    ``resultHash`` is the run's result's (its final step's), null when it sent none."""

    tenant_id: str
    outcome_hash: str | None
    result_hash: str | None = None


@event("runs")
class RunFailed(RunEventBody):
    """The run ended Failed."""

    tenant_id: str
    failure_class: FailureClass
    reason: str


@event("runs")
class RunCancelled(RunEventBody):
    """The run ended Cancelled: every attempt settled."""

    tenant_id: str
    reason: str | None
    requested_by: str | None


@event("runs")
class CancellationRequested(RunEventBody):
    """The intent to cancel was recorded (before anything settles)."""

    requested_by: str
    reason: str


# ---------------------------------------------------------------------- attempts and leases


@event("attempts")
class AttemptDispatched(AttemptEventBody):
    """A step's attempt is claimable; its lease and token come with the claim (null here)."""

    lease_id: UUID | None = None
    fencing_token: int | None = None
    agent_id: str
    skill_id: str | None
    attempt_number: int


@event("leases")
class LeaseGranted(AttemptEventBody):
    """A worker holds the attempt's lease, fenced by ``fencingToken``."""

    lease_id: UUID
    fencing_token: int
    holder: str
    expires_at: datetime


@event("attempts")
class AttemptParked(AttemptEventBody):
    """The attempt waits for an approval decision, holding no lease."""

    approval_id: UUID
    lease_id: UUID | None
    fencing_token: int | None
    holder: str | None


@event("attempts")
class AttemptResumed(AttemptEventBody):
    """After the decision the parked attempt is claimable again (a new lease, a new token)."""

    approval_id: UUID
    approval_state: ApprovalState
    agent_id: str
    skill_id: str | None
    attempt_number: int


@event("attempts")
class AttemptOutcomeRecorded(AttemptEventBody):
    """The attempt's one outcome."""

    outcome: AttemptOutcome
    failure_class: FailureClass | None
    outcome_hash: str | None


@event("steps")
class StepRetryScheduled(StepEventBody):
    """The step's next attempt is due at ``notBefore`` (backoff with jitter)."""

    next_attempt_number: int
    not_before: datetime


@event("steps")
class StepWaiting(StepEventBody):
    """A step no worker executes started to wait: ``kind`` ``wait`` for its timer, until
    ``until``; ``signal`` for the signal named ``signal``, until ``until`` (its timeout; null:
    no timeout). The run stays Running; the wait holds no worker."""

    kind: str
    signal: str | None
    until: datetime | None


@event("steps")
class StepWaitEnded(StepEventBody):
    """The step's wait ended (``cause``: ``timer-fired``, ``signal-received``, or
    ``signal-timed-out``: the step then succeeded with its default, or failed the run)."""

    cause: str


@event("steps")
class StepSkipped(StepEventBody):
    """The step will not run (issue 32): ``cause`` ``ConditionFalse`` (its ``when`` was
    false) or ``DependenciesSkipped`` (every step it depends on was skipped)."""

    cause: str


@event("children")
class ChildRunStarted(StepEventBody):
    """The run step started its child run ``childRunId`` of ``workflowId`` (its ``number``th:
    a retry starts the next); the child is submitted after this commits."""

    child_run_id: UUID
    workflow_id: str
    number: int


@event("children")
class ChildRunEnded(RunEventBody):
    """The run step's child run ended ``state`` (Completed: its result is the step's)."""

    step_id: UUID
    child_run_id: UUID
    state: str
    reason: str | None
    result_hash: str | None  # the child's result's hash when Completed (never the result)
    failure_class: FailureClass | None  # what the step fails with, when not Completed
    child_state: str | None  # the child run's state; None: its submission was refused


@event("signals")
class SignalReceived(StepEventBody):
    """A signal for the step arrived from ``sentBy``; ``delivered``: the step was waiting and
    took it now (otherwise it is kept until the step waits). The body is not in the event."""

    signal_id: UUID
    name: str
    sent_by: str
    delivered: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaseEventBody(EventBody):
    """What the lease reconcilers record: the lease, its holder and its fencing token."""

    attempt_id: UUID
    lease_id: UUID
    holder: str
    fencing_token: int


@event("leases")
class LeaseExpired(LeaseEventBody):
    """The lease passed its expiry and grace without a renewal; the attempt settles next."""


@event("leases")
class LeaseHandedBack(LeaseEventBody):
    """The lease holder gave its attempt back before its lease ended; the attempt settles
    next, as an expired lease's would."""

    reason: str


@event("leases")
class LeaseRevoked(LeaseEventBody):
    """The lease was revoked (after a restore from backup: it may have been acted on)."""

    reason: str


@event("attempts")
class ProgressReported(AttemptEventBody):
    """One progress message of the lease holder, in its attempt's sequence."""

    seq: int
    text: str | None
    payload: dict[str, Any] | None


@event("attempts")
class CallRecorded(AttemptEventBody):
    """A journaled call's value (or final error) was stored under (step, ``name``,
    ``occurrence``): every later execution of the step gets it back. Its hash and size only,
    never its content."""

    name: str
    occurrence: int
    value_hash: str
    bytes: int
    failed: bool


@event("attempts")
class RateLimitConsumed(AttemptEventBody):
    """The lease holder reported using ``units`` of the named rate limit ``name`` (its
    tenant's bucket ``bucket`` moved by them: later dispatches drawing on it wait)."""

    name: str
    bucket: str
    units: float


# ---------------------------------------------------------------------- approvals


@event("approvals")
class ApprovalRequested(EventBody):
    """A human must decide on this exact proposal."""

    approval_id: UUID
    run_id: UUID
    step_id: UUID
    tenant_id: str
    action_class: SideEffectClass
    proposal_hash: str
    approver_rule: str
    expires_at: datetime


@event("approvals")
class ApprovalDecided(EventBody):
    """The request left Pending (decided, expired, stale or cancelled)."""

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


@event("tool-calls")
class ToolCallClaimed(ToolCallEventBody):
    """The call was claimed before its side effect: the claimer may execute it, once."""


@event("tool-calls")
class ToolCallCompleted(ToolCallEventBody):
    """The call's result hash is stored; a repeat claim gets it."""


@event("tool-calls")
class ToolCallExpired(ToolCallEventBody):
    """No result within the claim timeout: closed, never executed again."""


# ---------------------------------------------------------------------- operator controls


@dataclass(frozen=True, slots=True, kw_only=True)
class ControlEventBody(RunEventBody):
    """What every operator control records: the run's state after it, who asked and why."""

    tenant_id: str
    state: RunState
    suspended: bool
    requested_by: str
    reason: str


@event("runs")
class RunSuspended(ControlEventBody):
    """An operator suspended the run: nothing new is dispatched or leased."""


@event("runs")
class RunResumed(ControlEventBody):
    """An operator lifted the suspension."""


@event("steps")
class StepRetryRequested(ControlEventBody):
    """An operator skipped the step's backoff: its next attempt is dispatched now."""

    step_id: UUID
    next_attempt_number: int


@event("attempts")
class AttemptOutcomeResolved(ControlEventBody):
    """An operator resolved an Uncertain attempt as Succeeded or Failed."""

    step_id: UUID
    attempt_id: UUID
    from_outcome: AttemptOutcome
    outcome: AttemptOutcome


@event("runs")
class RunRerun(ControlEventBody):
    """This run reruns the finished run ``rerunOf`` (``release``: pinned or current)."""

    rerun_of: UUID
    release: str
    release_id: str


# ---------------------------------------------------------------------- the registry


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


def _payload_maker(cls: type[EventBody]) -> Callable[[EventBody], dict[str, Any]]:
    """``to_payload`` of ``cls`` as one function: a dict display reading each field, its
    encoder applied to a value that is not None (as ``EventBody.to_payload`` does, without
    its loop; every event is rendered once, on every command that records it: issue 42)."""
    namespace: dict[str, Any] = {}
    items = []
    for i, (attr, key, encode) in enumerate(cls._codec):
        if not attr.isidentifier():
            raise TypeError(f"{cls.__name__}: field {attr!r} is not a name")
        if encode is None:
            items.append(f"{key!r}: self.{attr}")
        else:
            namespace[f"encode{i}"] = encode
            items.append(f"{key!r}: None if (v{i} := self.{attr}) is None else encode{i}(v{i})")
    source = f"def to_payload(self):\n    return {{{', '.join(items)}}}"
    exec(compile(source, f"<payload of {cls.__name__}>", "exec"), namespace)  # noqa: S102
    maker: Callable[[EventBody], dict[str, Any]] = namespace["to_payload"]
    maker.__doc__ = EventBody.to_payload.__doc__
    return maker


def _register(*classes: type[EventBody]) -> Mapping[str, type[EventBody]]:
    registry: dict[str, type[EventBody]] = {}
    for cls in classes:
        hints = typing.get_type_hints(cls)
        cls._codec = tuple((f.name, _camel(f.name), _encoder(hints[f.name])) for f in fields(cls))
        setattr(cls, "to_payload", _payload_maker(cls))  # noqa: B010 - a method of the class
        cls.payload_schema()  # fails here, at import, for a field type without a schema
        if cls.event_type() in registry:
            raise TypeError(f"event type {cls.event_type()} is defined twice")
        registry[cls.event_type()] = cls
    return registry


# Every event type, in the order declared: declaring the class is registering it.
EVENT_TYPES: Mapping[str, type[EventBody]] = _register(*_DECLARED)
_UNDECLARED = [
    name
    for name, c in list(globals().items())
    if isinstance(c, type)
    and issubclass(c, EventBody)
    and "topic" in vars(c)
    and c not in _DECLARED
]
if _UNDECLARED:  # a topic set by hand: the class is not registered
    raise TypeError(f"events without @event: {_UNDECLARED}")

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
