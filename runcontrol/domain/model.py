"""Entities and value objects of a run, as plain dataclasses (no I/O).

Field names are the spec's, in snake_case; the API edge maps them to camelCase.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from .events import PRODUCER, EventBody
from .states import (
    ApprovalState,
    AttemptOutcome,
    AttemptState,
    Decision,
    FailureClass,
    RunState,
    SideEffectClass,
    StepState,
    ToolCallState,
    ToolCallStatus,
)


@dataclass(frozen=True, slots=True)
class ReleaseRef:
    release_id: str
    hash: str


@dataclass(frozen=True, slots=True)
class PolicyRef:
    policy_id: str
    revision: str


@dataclass(frozen=True, slots=True)
class Limits:
    max_cost_usd: float | None = None
    max_minutes: int | None = None


@dataclass(slots=True)
class Run:
    run_id: UUID
    tenant_id: str
    project_id: str
    idempotency_key: str
    workflow_id: str
    release: ReleaseRef
    policy: PolicyRef
    model_profile_id: str
    state: RunState
    input_hash: str
    snapshot_id: UUID
    requested_by: str
    created_at: datetime
    updated_at: datetime
    environment_id: str | None = None
    budget_reservation_id: UUID | None = None
    limits: Limits = field(default_factory=Limits)
    deadline_at: datetime | None = None
    failure_class: FailureClass | None = None
    failure_reason: str | None = None
    outcome_hash: str | None = None
    correlation_id: str | None = None
    input: dict[str, Any] | None = None
    version: int = 1
    event_seq: int = 0
    journal_seq: int = 0
    fencing_seq: int = 0
    # Operator controls: when an operator suspended the run (None: not suspended), and the
    # finished run this one reruns.
    suspended_at: datetime | None = None
    rerun_of: UUID | None = None
    # The run's result (its final step's, ``RunAggregate.run_result``): its hash and size,
    # set when the run completes; the content is that step's ``AttemptResult``.
    result_hash: str | None = None
    result_bytes: int | None = None
    # Flow control (issue 21): the run's priority (1-5; it orders the queues it waits in) and
    # its workflow-wide concurrency keys, evaluated on its input at acceptance (pinned):
    # [{"name", "key", "limit", "strategy", "scope": "run"}].
    priority: int = 3
    flow: list[dict[str, Any]] | None = None
    # Child runs (issue 32, 0024): the run and step that started this one (None: a run a
    # client submitted) and how deep it is (0 for a client's, its parent's + 1; None: a
    # client's run an older host accepted); pinned.
    parent_run_id: UUID | None = None
    parent_step_id: UUID | None = None
    depth: int | None = None
    # the template it was submitted from (issue 44), pinned: its pre-approvals apply
    template_id: str | None = None
    template_version: int | None = None
    # A replay (docs/replay.md), pinned: the run it replays and how ({liveCalls, approvals});
    # never production: listed apart, no concurrency key.
    replay_of: UUID | None = None
    replay: dict[str, Any] | None = None

    @property
    def child_depth(self) -> int:
        """How deep a child of this run is."""
        return (self.depth or 0) + 1

    @property
    def release_id(self) -> str:
        return self.release.release_id

    @property
    def policy_revision(self) -> str:
        return self.policy.revision


@dataclass(slots=True)
class Step:
    step_id: UUID
    run_id: UUID
    tenant_id: str
    ordinal: int
    name: str
    agent_id: str
    state: StepState
    max_attempts: int
    side_effect_class: SideEffectClass
    gate: str = "none"
    skill_id: str | None = None
    not_before: datetime | None = None
    failure_class: FailureClass | None = None
    outcome_hash: str | None = None
    # The names of the steps this one waits for, resolved at acceptance (``workflow.
    # dependencies``); None on a row stored before graphs (0016): the step before it.
    depends_on: list[str] | None = None
    # ``agent`` (a worker executes it) or ``wait`` (no worker: its timer settles it, 0016).
    kind: str = "agent"
    # A wait step's timer, from the release: {"seconds": s} or {"until": iso}.
    wait: dict[str, Any] | None = None
    # While a wait step is Running: when its timer fires (its durable reminder); a signal
    # step's: when it stops waiting (its timeout).
    due_at: datetime | None = None
    # A signal step's signal once received, even before the step waits (kept, delivered
    # once): {"signalId", "body", "sentBy", "receivedAt"}. The body becomes its result.
    signal: dict[str, Any] | None = None
    # The step's own concurrency keys (a slot per attempt), evaluated at acceptance, and why
    # it is held while Pending (issue 21): {"kind", "name", "key", "limit", "holders",
    # "since"}; a held step is not due: the transaction that frees its slot makes it so.
    flow: list[dict[str, Any]] | None = None
    # The buckets its dispatch draws on (``rates.Draw`` dicts, from the pinned policy revision
    # and the release at acceptance, 0018); None: no rate limit, no reservation.
    rate_limits: list[dict[str, Any]] | None = None
    # Why a Pending step waits (None: it does not): a concurrency hold (0017, above), or
    # {"kind": "rate-limit", "bucket", "until", "attempt"}, the reservation its dispatch at
    # ``until`` uses (0018).
    held: dict[str, Any] | None = None
    # Its condition (the release's ``when``, 0024): false when it is ready, it is Skipped.
    condition: str | None = None
    # The result of a step no worker executes (a signal's body, when a wait ended, a child
    # run's result), as its canonical JSON text (an agent step's is its attempt's).
    result_json: str | None = field(default=None, repr=False)
    # A run step's current child (0024): {"runId", "number"} (its child runs count from 1;
    # a retry starts number + 1).
    child: dict[str, Any] | None = None


@dataclass(slots=True)
class Attempt:
    attempt_id: UUID
    step_id: UUID
    run_id: UUID
    tenant_id: str
    number: int
    state: AttemptState
    dispatched_at: datetime
    lease_id: UUID | None = None
    fencing_token: int | None = None
    holder: str | None = None
    outcome: AttemptOutcome | None = None
    outcome_hash: str | None = None
    failure_class: FailureClass | None = None
    settled_at: datetime | None = None
    settled_by: str | None = None
    # The last progress message stored for this attempt (its holder numbers them from 1).
    progress_seq: int = 0


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """What an attempt's outcome produced, stored once (insert-only): the JSON result as its
    canonical text ``result_json`` (kept as text, so every reader gets the same bytes), or a
    reference ``result_ref`` ``{uri, sha256, bytes}`` to a larger artifact kept elsewhere.
    ``outcome_hash`` is the canonical hash of the one stored (the attempt's ``outcomeHash``),
    ``bytes`` the size of its canonical JSON (of the artifact, for a reference). Data of the
    run: never logged, never put in a span."""

    attempt_id: UUID
    step_id: UUID
    run_id: UUID
    tenant_id: str
    outcome_hash: str
    bytes: int
    created_at: datetime
    result_json: str | None = field(default=None, repr=False)
    result_ref: dict[str, Any] | None = None
    # the outcome report that stored it, and what it asked (``commands.fingerprint``): set by
    # the store as it writes the row, which then answers the report's resends (0041)
    command_id: str | None = None
    fingerprint: str | None = None

    @property
    def value(self) -> Any:
        """What a dependent step receives: the result, or the reference itself."""
        if self.result_ref is not None:
            return self.result_ref
        return None if self.result_json is None else json.loads(self.result_json)


@dataclass(slots=True)
class Lease:
    lease_id: UUID
    attempt_id: UUID
    run_id: UUID
    tenant_id: str
    holder: str
    fencing_token: int
    granted_at: datetime
    expires_at: datetime
    released_at: datetime | None = None
    release_cause: str | None = None

    @property
    def current(self) -> bool:
        return self.released_at is None


@dataclass(slots=True)
class ApprovalRequest:
    approval_id: UUID
    run_id: UUID
    step_id: UUID
    attempt_id: UUID
    tenant_id: str
    action_class: SideEffectClass
    proposal_hash: str
    policy_revision: str
    approver_rule: str
    required_approvals: int
    requested_by: str
    created_at: datetime
    expires_at: datetime
    state: ApprovalState = ApprovalState.PENDING
    decided_by: str | None = None
    decided_at: datetime | None = None
    reason: str | None = None
    version: int = 1


@dataclass(frozen=True, slots=True)
class ApprovalDecision:
    """One approver's vote; a request is decided when the votes reach its quorum."""

    approval_id: UUID
    run_id: UUID
    tenant_id: str
    decided_by: str
    decision: Decision
    proposal_hash: str
    reason: str | None
    break_glass: bool
    decided_at: datetime
    # Which of the run's template's pre-approvals decided it (a template's vote only): the
    # statement that writes the vote counts that use, guarded (runcontrol_template_use).
    pre_approval: int | None = None


@dataclass(frozen=True, slots=True)
class CancellationIntent:
    intent_id: UUID
    run_id: UUID
    tenant_id: str
    requested_by: str
    reason: str
    requested_at: datetime


@dataclass(frozen=True, slots=True)
class ProgressMessage:
    """One progress message of a lease holder: ``seq`` numbers the attempt's messages from 1
    without gaps; ``text`` and ``payload`` (a JSON object) are what clients see in the event."""

    seq: int
    text: str | None = None
    payload: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class ProgressAck:
    """The answer to a progress report: the cumulative ack (the attempt's last stored seq),
    how many messages were stored and dropped as duplicates, and where a gap stopped the batch
    (None: no gap). A gap is answered as ``errors.ProgressGap`` carrying this ack."""

    attempt_id: UUID
    acked_seq: int
    stored: int
    duplicates: int
    gap_at: int | None = None


@dataclass(slots=True)
class ToolCall:
    """A tool call claimed before its side effect: one per run and ``call_id``, so the effect
    happens at most once whoever asks again (a retried attempt included)."""

    tool_call_id: UUID
    run_id: UUID
    tenant_id: str
    call_id: str
    attempt_id: UUID
    request_hash: str
    claimed_by: str
    fencing_token: int
    claimed_at: datetime
    expires_at: datetime  # no result by then: the reminder closes the claim
    state: ToolCallState = ToolCallState.CLAIMED
    result_hash: str | None = None
    completed_at: datetime | None = None
    error: str | None = None
    # the result's canonical JSON, when the completion sent it (a repeat claim gets it back)
    result_json: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class ToolCallClaim:
    """The answer to a claim (and to a completion): what the caller may do with the call."""

    tool_call_id: UUID
    call_id: str
    status: ToolCallStatus
    result_hash: str | None = None
    error: str | None = None
    # the stored result's canonical JSON, when its completion sent it
    result_json: str | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class JournaledCall:
    """The stored value of one journaled call (``step.run``), insert-only: the first value
    recorded under (run, step, ``name``, ``occurrence``: the n-th call of that name within one
    execution of the step), handed back to every later execution of the step instead of
    calling the function again. ``value_json`` is the value's canonical JSON text, or None
    when the call ended in a final error (``error``: {type, message, failureClass}).
    ``value_hash`` is the canonical hash of what is stored (the value, or ``{"error": ...}``),
    ``bytes`` the size of its canonical JSON. Data of the run: never logged, never in a span."""

    run_id: UUID
    step_id: UUID
    name: str
    occurrence: int
    tenant_id: str
    attempt_id: UUID
    fencing_token: int
    value_hash: str
    bytes: int
    recorded_at: datetime
    value_json: str | None = field(default=None, repr=False)
    error: dict[str, Any] | None = field(default=None, repr=False)
    # The canonical hash of the call's arguments (``step.run``'s, when they are JSON): what a
    # replay matches a call by, beside its name and occurrence (docs/replay.md).
    request_hash: str | None = None

    @property
    def key(self) -> tuple[UUID, str, int]:
        return (self.step_id, self.name, self.occurrence)


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """The answer to a journaled call's record: what is stored under its key. ``recorded``:
    this command's value is the one stored (its ``value_json`` is then left out: the caller
    has it); otherwise the value stored first is answered (``value_json`` or ``error``) and
    the caller uses it, not its own."""

    name: str
    occurrence: int
    value_hash: str
    bytes: int
    recorded_at: datetime
    recorded: bool
    value_json: str | None = field(default=None, repr=False)
    error: dict[str, Any] | None = field(default=None, repr=False)


@dataclass(frozen=True, slots=True)
class RecoveryJournalEntry:
    run_id: UUID
    tenant_id: str
    sequence: int
    entity: str
    entity_id: UUID
    from_state: str | None
    to_state: str
    cause: str
    actor: str
    occurred_at: datetime


# A field held in memory only (``runcontrol.store.rows`` maps no column to it).
UNSTORED: dict[str, bool] = {"stored": False}


@dataclass(frozen=True, slots=True)
class Event:
    """An outbox event with the ADR-0014 envelope; ``seq`` is gap-free per run.

    ``body`` is the typed payload (``runcontrol.domain.events``) and ``payload`` its stored
    JSON object; ``event``, a factory, makes both from the one body. ``body`` has no column:
    the outbox stores ``payload``."""

    event_id: UUID
    run_id: UUID
    tenant_id: str
    project_id: str
    seq: int
    event_type: str
    topic: str
    payload: dict[str, Any]
    occurred_at: datetime
    step_id: UUID | None = None
    attempt_id: UUID | None = None
    correlation_id: str | None = None
    causation_id: str | None = None
    producer: str = PRODUCER
    schema_version: int = 1
    body: EventBody | None = field(default=None, compare=False, repr=False, metadata=UNSTORED)


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """Evidence of a rejected or privileged command (stale token, non-holder, break-glass)."""

    tenant_id: str
    run_id: UUID
    kind: str
    actor: str
    detail: dict[str, Any]
    occurred_at: datetime
