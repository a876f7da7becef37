"""HTTP request and response models (pydantic v2). JSON field names are the spec's camelCase.

Requests are checked for what the store cannot hold (NUL characters, lone surrogates, numbers
beyond a column's range) so that such input is a 422 here and never a database error later.
Unknown request fields are ignored: in particular a ``tenantId`` in a body has no effect.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator
from pydantic.alias_generators import to_camel

from runcontrol.domain import Decision
from runcontrol.edge.storable import (
    MAX_BIGINT,
    MAX_COST_USD,
    MAX_MINUTES,
    MAX_NAME,
    MAX_REASON,
    storable,
    storable_json,
)

Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME), AfterValidator(storable)]
Reason = Annotated[str, Field(min_length=1, max_length=MAX_REASON), AfterValidator(storable)]
JsonObject = Annotated[dict[str, Any], AfterValidator(storable_json)]


class RequestModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, extra="ignore", allow_inf_nan=False)


class ResponseModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


# ---------------------------------------------------------------------- runs


class LimitsIn(RequestModel):
    max_cost_usd: float | None = Field(None, ge=0, le=MAX_COST_USD)
    max_minutes: int | None = Field(None, ge=1, le=MAX_MINUTES)


class SubmitRunRequest(RequestModel):
    """SubmitRun. ``releaseAlias`` or ``releaseId`` pins the release (default alias: latest)."""

    workflow_id: Name
    release_alias: Name | None = None
    release_id: Name | None = None
    model_profile_id: Name
    input: JsonObject = Field(default_factory=dict)
    limits: LimitsIn = Field(default_factory=LimitsIn)
    environment_id: Name | None = None
    priority: int = Field(
        3,
        ge=1,
        le=5,
        description="1-5 (default 3): orders the run among its tenant's held dispatches and "
        "waiting attempts; above 3 needs the factory.runs.operate scope (docs/flow-control.md).",
    )

    @model_validator(mode="after")
    def _one_release(self) -> SubmitRunRequest:
        if self.release_alias is not None and self.release_id is not None:
            raise ValueError("give releaseAlias or releaseId, not both")
        return self


class SubmitRunResponse(ResponseModel):
    run_id: UUID
    state: str
    release_id: str
    policy_revision: str
    snapshot_id: UUID


class CancelRunRequest(RequestModel):
    reason: Reason


class CancelRunResponse(ResponseModel):
    run_id: UUID
    state: str = Field(description="The state observed after recording the intent.")


class LimitsOut(ResponseModel):
    max_cost_usd: float | None = None
    max_minutes: int | None = None


class RunSummary(ResponseModel):
    run_id: UUID
    tenant_id: str
    project_id: str
    environment_id: str | None = None
    workflow_id: str
    release_id: str
    release_hash: str
    policy_revision: str
    model_profile_id: str
    snapshot_id: UUID
    budget_reservation_id: UUID | None = None
    state: str
    input_hash: str
    requested_by: str
    failure_class: str | None = None
    failure_reason: str | None = None
    outcome_hash: str | None = None
    limits: LimitsOut
    version: int
    last_event_seq: int
    created_at: datetime
    updated_at: datetime
    suspended: bool = Field(
        False, description="An operator suspended the run: nothing new starts until resumed."
    )
    suspended_at: datetime | None = None
    rerun_of: UUID | None = Field(None, description="The finished run this run reruns.")
    result_hash: str | None = Field(
        None,
        description="The canonical hash of the run's result (its final step's), once Completed; "
        "null when that step reported none.",
    )
    result_bytes: int | None = Field(
        None,
        description="The size of the run's result (canonical JSON, or the referenced artifact).",
    )
    priority: int = Field(3, description="1-5, pinned at submission (docs/flow-control.md).")


class LeaseView(ResponseModel):
    lease_id: UUID
    holder: str
    fencing_token: int
    expires_at: datetime


class AttemptView(ResponseModel):
    attempt_id: UUID
    number: int
    state: str
    outcome: str | None = None
    outcome_hash: str | None = None
    failure_class: str | None = None
    dispatched_at: datetime
    settled_at: datetime | None = None
    holder: str | None = None
    lease: LeaseView | None = None


class StepView(ResponseModel):
    step_id: UUID
    ordinal: int
    name: str
    agent_id: str
    skill_id: str | None = None
    state: str
    max_attempts: int
    gate: str
    side_effect_class: str
    not_before: datetime | None = None
    # The steps it waits for (a graph's ``dependsOn``); null on a run accepted before graphs:
    # the step before it.
    depends_on: list[str] | None = None
    kind: str = Field("agent", description="agent | wait (a timer) | signal (input from outside)")
    wait: dict[str, Any] | None = Field(
        None, description="What a wait or signal step waits for: {seconds|until} or {signal, ...}"
    )
    due_at: datetime | None = Field(
        None, description="While it waits: when its timer fires, or its signal times out."
    )
    held: dict[str, Any] | None = Field(
        None,
        description="While Pending: why it is held, a concurrency key's slot {kind: "
        "concurrency|capacity, name, key, limit, holders, strategy, since}, or a rate limit's "
        "reservation {kind: rate-limit, bucket, until} (admitted at `until`; "
        "docs/flow-control.md).",
    )
    held_reason: str | None = Field(
        None,
        description="The hold in words: `concurrency-key repo-x 1/1`, "
        "`rate-limit agent:planner until ...`.",
    )
    attempts: list[AttemptView]


class ApprovalView(ResponseModel):
    approval_id: UUID
    run_id: UUID
    step_id: UUID
    attempt_id: UUID
    tenant_id: str
    action_class: str
    proposal_hash: str
    policy_revision: str
    approver_rule: str
    required_approvals: int
    requested_by: str
    state: str
    decided_by: str | None = None
    decided_at: datetime | None = None
    reason: str | None = None
    version: int
    created_at: datetime
    expires_at: datetime


class RunView(RunSummary):
    """GetRun: the run with its steps, attempts, current leases and pending approvals."""

    input: dict[str, Any] | None = None
    result: Any = Field(
        None,
        description="The run's result (any JSON value), once Completed; kept as long as the "
        "event history (RunControl:Outbox:RetentionDays), then null while resultHash stays.",
    )
    result_ref: dict[str, Any] | None = Field(
        None, description="Instead of result: a reference {uri, sha256, bytes} to the artifact."
    )
    steps: list[StepView]
    pending_approvals: list[ApprovalView]


class RunPage(ResponseModel):
    items: list[RunSummary]
    next_cursor: str | None = Field(None, description="Opaque; pass as ?cursor= for more.")
    as_of: datetime = Field(description="When this page was read (its freshness).")


# ---------------------------------------------------------------------- approvals


class DecisionRequest(RequestModel):
    decision: Decision
    version: int = Field(ge=1, le=MAX_BIGINT, description="The request version decided on.")
    proposal_hash: Name
    reason: Reason | None = None


class ApprovalPage(ResponseModel):
    items: list[ApprovalView]
    next_cursor: str | None = None
    as_of: datetime


# ---------------------------------------------------------------------- policy


class PolicyRequest(RequestModel):
    """An approval policy revision (``runcontrol policy FILE`` takes the same JSON)."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", allow_inf_nan=False)

    approval_required_for: list[str] = Field(
        default=["shared-write", "external-irreversible"],
        description="Side-effect classes that need a decision (a step's `gate` adds its own).",
    )
    approver_roles: list[str] = Field(default=["Reviewer", "WorkspaceAdmin"], min_length=1)
    required_approvals: int = Field(default=1, ge=1, le=20, description="Distinct approvers.")
    assignees: list[Name] = Field(
        default=[], max_length=100, description="When set, only these subjects decide."
    )
    expiry_hours: float | None = Field(default=None, gt=0, le=24 * 365)
    expiry_action: str = Field(
        default="fail", description="fail | reject | auto-approve | re-request"
    )
    max_re_requests: int = Field(default=3, ge=0, le=100)
    rate_limits: dict[str, Any] | None = Field(
        default=None,
        description="Token buckets (rate limits) the revision's runs draw on: "
        '`{"tenant": {"perSecond", "burst"}, "agents": {agentId: {...}}, '
        '"named": {name: {...}}}`; a release step names its named limits (`rateLimits`).',
    )


class PolicyView(ResponseModel):
    policy_id: str
    revision: str
    document: dict[str, Any]


# ---------------------------------------------------------------------- flow control


class QueueView(ResponseModel):
    """One concurrency key (or the tenant's cap on open attempts) with holders or waiters."""

    tenant_id: str
    kind: str = Field(description="concurrency | capacity (the tenant's max open attempts)")
    name: str | None = Field(
        None, description="The key's family: its limit's name, or the workflow id."
    )
    key: str = Field(description="The key the run input gave (e.g. a repository).")
    limit: int
    holders: int = Field(description="Runs or attempts holding a slot now.")
    promoted: int = Field(description="Waiters given a freed slot, their dispatch under way.")
    waiting: int = Field(description="Held runs queued for a slot (priority, then arrival).")
    oldest_waiting_seconds: float | None = Field(None, description="The oldest waiter's age.")


class QueuesView(ResponseModel):
    items: list[QueueView]
    as_of: datetime


# ---------------------------------------------------------------------- the workflow catalog


class PublishReleaseRequest(RequestModel):
    """A workflow definition to publish (``runcontrol release FILE`` sends the file as
    ``definition``) and the aliases to move to it."""

    definition: JsonObject = Field(
        description="`{workflowId, steps: [{name, agentId, dependsOn?, gate?, ...}]}`, checked "
        "as the CLI checks it: an unknown dependency or a cycle is a 422 naming it."
    )
    aliases: list[Name] = Field(default=["latest"], max_length=20)


class MoveAliasRequest(RequestModel):
    release_id: Name


class GraphNode(ResponseModel):
    name: str
    agent_id: str
    depends_on: list[str]


class GraphEdge(ResponseModel):
    model_config = ConfigDict(populate_by_name=True)

    from_: str = Field(alias="from")
    to: str


class ReleaseGraph(ResponseModel):
    nodes: list[GraphNode]
    edges: list[GraphEdge]


class ReleaseView(ResponseModel):
    release_id: str
    workflow_id: str
    content_hash: str
    published_by: str | None = None
    published_at: datetime | None = None
    aliases: list[str] = []
    definition: dict[str, Any]
    graph: ReleaseGraph


class WorkflowView(ResponseModel):
    workflow_id: str
    aliases: dict[str, str] = Field(description="alias -> the release id it points at")
    releases: list[ReleaseView]


class WorkflowSummary(ResponseModel):
    workflow_id: str
    aliases: dict[str, str]
    release_count: int
    last_published_at: datetime


class WorkflowPage(ResponseModel):
    items: list[WorkflowSummary]


class RunGraphNode(ResponseModel):
    step_id: UUID
    name: str
    agent_id: str
    state: str
    kind: str = "agent"
    due_at: datetime | None = None
    depends_on: list[str]
    attempts: list[AttemptView]


class RunGraph(ResponseModel):
    run_id: UUID
    state: str
    release_id: str
    nodes: list[RunGraphNode]
    edges: list[GraphEdge]


class SignalResponse(ResponseModel):
    run_id: UUID
    step_id: UUID
    name: str
    delivered: bool = Field(description="False: kept until the step waits for it.")
    state: str


# ---------------------------------------------------------------------- events


class EventEnvelope(ResponseModel):
    """One committed per-run event with the ADR-0014 envelope; ``seq`` is the SSE id."""

    event_id: UUID
    seq: int
    type: str
    topic: str
    run_id: UUID
    tenant_id: str
    project_id: str
    step_id: UUID | None = None
    attempt_id: UUID | None = None
    correlation_id: str | None = None
    causation_id: str | None = None
    producer: str
    schema_version: int
    occurred_at: datetime
    payload: dict[str, Any]


class FeedEvent(EventEnvelope):
    """One event of the tenant feed (``/factory/events``): the envelope plus its tenant-wide
    ``position``, the feed's SSE id and a webhook redelivery cursor."""

    position: int


# ---------------------------------------------------------------------- webhooks

Url = Annotated[str, Field(min_length=8, max_length=2000), AfterValidator(storable)]


class WebhookCreateRequest(RequestModel):
    url: Url
    description: Reason | None = None
    max_attempts: int | None = Field(
        None, ge=1, le=100, description="Attempts per event before it is dead-lettered."
    )


class DeliveryCounts(ResponseModel):
    pending: int
    delivered: int
    dead_lettered: int


class WebhookView(ResponseModel):
    subscription_id: UUID
    tenant_id: str
    url: str
    description: str | None = None
    max_attempts: int
    created_by: str
    created_at: datetime
    starts_after: int = Field(description="Events after this feed position are delivered.")
    disabled_at: datetime | None = None
    deliveries: DeliveryCounts | None = None


class WebhookCreated(WebhookView):
    secret: str = Field(description="The HMAC-SHA256 signing secret; shown only here.")


class WebhookPage(ResponseModel):
    items: list[WebhookView]


class DeliveryView(ResponseModel):
    subscription_id: UUID
    position: int
    event_id: UUID
    type: str
    run_id: UUID
    seq: int
    state: str
    attempts: int
    next_attempt_at: datetime
    last_status: int | None = None
    last_error: str | None = None
    delivered_at: datetime | None = None
    updated_at: datetime


class DeliveryPage(ResponseModel):
    items: list[DeliveryView]
    next_after: int | None = Field(None, description="Pass as ?after= for more.")


class RedeliverRequest(RequestModel):
    after: int = Field(ge=0, le=MAX_BIGINT, description="Feed position: redeliver after it.")


class RedeliverResponse(ResponseModel):
    subscription_id: UUID
    after: int
    queued: int


# ---------------------------------------------------------------------- health


class Health(ResponseModel):
    status: str
    checks: dict[str, str] = Field(default_factory=dict)


class StalledAgent(ResponseModel):
    """One agent of the caller's tenant whose dispatched attempts wait with no worker."""

    agent_id: str
    waiting: int
    oldest_dispatched_at: datetime


class WorkersHealth(ResponseModel):
    """``stalled`` when an agent's attempts have waited over ``stallSeconds`` with none of
    them claimed: no worker of that agent is taking the tenant's work."""

    status: str
    stall_seconds: float | None
    stalled: list[StalledAgent] = Field(default_factory=list)


# ---------------------------------------------------------------------- operator controls


class ControlRequest(RequestModel):
    """Suspend, resume, retry: the reason is required (it is audited with the caller)."""

    reason: Reason


class ResolveRequest(ControlRequest):
    outcome: Literal["Succeeded", "Failed"]


class RerunRequest(ControlRequest):
    release: Literal["pinned", "current"] = Field(
        "pinned",
        description="`pinned`: the release the finished run ran; `current`: the release "
        "`releaseAlias` names now.",
    )
    release_alias: Name = Field("latest", description="The alias `current` resolves.")


class ControlResponse(ResponseModel):
    run_id: UUID
    state: str
    suspended: bool
    step_id: UUID | None = None
    attempt_id: UUID | None = Field(
        None, description="retry: the new attempt (when dispatched); resolve: the attempt."
    )
    attempt_state: str | None = None
    attempt_number: int | None = None


class RerunResponse(SubmitRunResponse):
    rerun_of: UUID
    release: str = Field(description="`pinned` or `current`: which release the rerun runs.")
    created: bool = Field(description="False when this Idempotency-Key already made the rerun.")
