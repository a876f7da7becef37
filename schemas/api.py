"""HTTP request and response models (pydantic v2). JSON field names are the spec's camelCase.

An id or a name holds the characters ``domain.limits.name`` states (``id_check``). Requests
are checked for what the store cannot hold (NUL characters, lone surrogates, numbers
beyond a column's range: ``runcontrol.edge.storable``) so that such input is a 422 here and
never a database error later. Unknown request fields are ignored: in particular a
``tenantId`` in a body has no effect.

A view of a domain object takes its fields from the object's dataclass (``shows``): the class
statement names only what the view adds or shows otherwise.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Literal, TypeVar, cast
from uuid import UUID

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    create_model,
    model_validator,
)
from pydantic.alias_generators import to_camel

from runcontrol.commands import ControlResult, ReplayRun, RerunRun, SignalResult, SubmitResult
from runcontrol.domain import (
    ApprovalRequest,
    Attempt,
    Decision,
    Event,
    JournaledCall,
    Lease,
    Limits,
    Run,
    Step,
    limits,
)
from runcontrol.domain.errors import ValidationFailed
from runcontrol.domain.limits import (
    INT8_MAX,
    MAX_APPROVALS,
    MAX_ASSIGNEES,
    MAX_COST_USD,
    MAX_EXPIRY_HOURS,
    MAX_MINUTES,
    MAX_NAME,
    MAX_RE_REQUESTS,
    MAX_REASON,
)
from runcontrol.domain.templates import Template
from runcontrol.edge.storable import storable, storable_json


def id_check(*, segment: bool = False) -> AfterValidator:
    """The id character set (``domain.limits.name``; ``segment``: an id that is a URL's path
    segment) as a pydantic check: a request's id, in a body or a path, outside it is a 422."""

    def check(value: str) -> str:
        try:
            return limits.name(value, "an id", segment=segment)
        except ValidationFailed as exc:
            raise ValueError(str(exc)) from None

    return AfterValidator(check)


Name = Annotated[str, Field(min_length=1, max_length=MAX_NAME), id_check()]
Reason = Annotated[str, Field(min_length=1, max_length=MAX_REASON), AfterValidator(storable)]
JsonObject = Annotated[dict[str, Any], AfterValidator(storable_json)]


class RequestModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, extra="ignore", allow_inf_nan=False)


class ResponseModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True)


V = TypeVar("V", bound=ResponseModel)


def _shown(hint: Any) -> Any:
    """A domain field's type as a view shows it: an enum as its value (a string)."""
    if isinstance(hint, type) and issubclass(hint, Enum):
        return str
    args = typing.get_args(hint)
    if type(None) in args:
        (inner,) = (a for a in args if a is not type(None))
        return _shown(inner) | None
    return hint


def shows(
    source: type[Any],
    *shown: str,
    without: tuple[str, ...] = (),
    rename: Mapping[str, str] | None = None,
    described: Mapping[str, str] | None = None,
) -> Callable[[type[V]], type[V]]:
    """A view of the domain dataclass ``source``: the decorated model with, before its own
    fields, the fields ``shown`` of ``source`` (all but ``without``, in its order, when none
    are named) under their names or those ``rename`` gives, with the domain's types (an enum
    as its value). A field whose type admits None is optional (null when absent), any other
    required, whatever its default in the domain; ``described`` documents them. A field the
    class declares itself (a default of its own) takes the place of the derived one."""

    def view(cls: type[V]) -> type[V]:
        base: type[ResponseModel] = cls.__bases__[0]
        hints = typing.get_type_hints(source)
        names = shown or tuple(f.name for f in dataclasses.fields(source) if f.name not in without)
        fields: dict[str, Any] = {}
        for name in names:
            kind = _shown(hints[name])
            default = None if type(None) in typing.get_args(kind) else ...
            description = (described or {}).get(name)
            fields[(rename or {}).get(name, name)] = (kind, Field(default, description=description))
        for name, info in cls.model_fields.items():
            if name not in base.model_fields:
                fields[name] = (info.annotation, info)
        model: type[ResponseModel] = create_model(
            cls.__name__, __base__=base, __doc__=cls.__doc__, __module__=cls.__module__, **fields
        )
        return cast(type[V], model)

    return view


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


class SubmitRunBody(SubmitRunRequest):
    """``POST /factory/runs``: a submission, or one from a run template (a schedule's run names
    none)."""

    template_id: Name | None = Field(
        None,
        description="Submit from this run template's Active version (docs/templates.md): the "
        "input merged onto its defaults and checked against its constraints (422 naming the "
        "rule); its pre-approvals apply to the run's approvals.",
    )


@shows(SubmitResult, "run_id", "state", "release_id", "policy_revision", "snapshot_id")
class SubmitRunResponse(ResponseModel):
    pass


class CancelRunRequest(RequestModel):
    reason: Reason


class CancelRunResponse(ResponseModel):
    run_id: UUID
    state: str = Field(description="The state observed after recording the intent.")


class BulkOutcome(ResponseModel):
    """One item's outcome: ``decided`` / ``accepted`` with the single call's answer, or its
    refusal (``stale``, ``expired``, ``forbidden``, ``conflict``, ``not-found``, ``invalid``,
    ``rate-limited``, ``unavailable``) with the problem code, status and detail the single
    call would have answered."""

    outcome: str
    code: str | None = None
    status: int | None = None
    detail: str | None = None


class BulkCancelRequest(RequestModel):
    run_ids: list[UUID] = Field(min_length=1, max_length=500)
    reason: Reason


class BulkCancelOutcome(BulkOutcome):
    run_id: UUID
    state: str | None = Field(None, description="With `accepted`: the state observed.")


class BulkCancelResponse(ResponseModel):
    items: list[BulkCancelOutcome]
    counts: dict[str, int]


@shows(Limits)
class LimitsOut(ResponseModel):
    pass


@shows(
    Run,
    *("run_id", "tenant_id", "project_id", "environment_id", "workflow_id", "model_profile_id"),
    *("snapshot_id", "budget_reservation_id", "state", "input_hash", "requested_by"),
    *("failure_class", "failure_reason", "outcome_hash", "version", "created_at", "updated_at"),
    *("suspended_at", "rerun_of", "result_hash", "result_bytes", "priority"),
    *("parent_run_id", "parent_step_id", "depth", "template_id", "template_version"),
    *("replay_of", "replay"),
    described={
        "replay_of": "The run this one replays (docs/replay.md); null for a production run.",
        "replay": "A replay's options: liveCalls, approvals.",
        "template_id": "The run template it was submitted from (docs/templates.md).",
        "rerun_of": "The finished run this run reruns.",
        "parent_run_id": "A child run's parent: the run whose run step started it "
        "(docs/child-runs.md); null for a run a client submitted.",
        "parent_step_id": "The parent's step that started it.",
        "result_hash": "The canonical hash of the run's result (its final step's), once "
        "Completed; null when that step reported none.",
        "result_bytes": "The size of the run's result (canonical JSON, or the referenced "
        "artifact).",
    },
)
class RunSummary(ResponseModel):
    """A run as the list shows it: its pins (the release flattened), state and freshness."""

    release_id: str
    release_hash: str
    policy_revision: str
    limits: LimitsOut
    last_event_seq: int
    suspended: bool = Field(
        False, description="An operator suspended the run: nothing new starts until resumed."
    )
    priority: int = Field(3, description="1-5, pinned at submission (docs/flow-control.md).")
    depth: int | None = Field(
        0, description="0 for a client's run (null: accepted before 0024); a child's parent's + 1."
    )


@shows(Lease, "lease_id", "holder", "fencing_token", "expires_at")
class LeaseView(ResponseModel):
    pass


@shows(
    Attempt,
    *("attempt_id", "number", "state", "outcome", "outcome_hash", "failure_class"),
    *("dispatched_at", "settled_at", "holder"),
)
class AttemptView(ResponseModel):
    lease: LeaseView | None = None


@shows(
    JournaledCall,
    *("name", "occurrence", "value_hash", "bytes", "recorded_at", "attempt_id"),
    described={
        "occurrence": "The n-th call of this name in an execution of the step, from 1.",
        "value_hash": "The canonical hash of the stored value (or of {error} for a failed call).",
        "bytes": "The size of the stored value's canonical JSON.",
        "attempt_id": "The attempt whose execution recorded it.",
    },
)
class CallView(ResponseModel):
    """A journaled call of a step (``step.run``): the first value recorded under its name and
    occurrence, which every later execution of the step gets back."""

    failed: bool = Field(description="The call ended in a final error (stored in its place).")


@shows(
    Step,
    *("step_id", "ordinal", "name", "agent_id", "skill_id", "state", "max_attempts", "gate"),
    *("side_effect_class", "not_before", "depends_on", "kind", "wait", "due_at", "held"),
    *("condition", "child"),
    described={
        "condition": "Its `when`: false when it is ready, it ends Skipped (docs/graphs.md).",
        "child": "A run step's current child run {runId, number} (docs/child-runs.md).",
        "depends_on": "The steps it waits for (a graph's `dependsOn`); null on a run accepted "
        "before graphs: the step before it.",
        "wait": "What a wait or signal step waits for: {seconds|until} or {signal, ...}",
        "due_at": "While it waits: when its timer fires, or its signal times out.",
        "held": "While Pending: why it is held, a concurrency key's slot {kind: "
        "concurrency|capacity, name, key, limit, holders, strategy, since}, or a rate limit's "
        "reservation {kind: rate-limit, bucket, until} (admitted at `until`; "
        "docs/flow-control.md).",
    },
)
class StepView(ResponseModel):
    kind: str = Field(
        "agent",
        description="agent | wait (a timer) | signal (input from outside) | run (a child run)",
    )
    result: Any = Field(
        None,
        description="The result of a step no worker executes: a signal's body, when a wait "
        "ended, a child run's result (an agent step's is its attempt's).",
    )
    calls: list[CallView] = Field(
        default_factory=list,
        description="Its journaled calls (`step.run`), oldest first: their hash and size, "
        "never their content.",
    )
    held_reason: str | None = Field(
        None,
        description="The hold in words: `concurrency-key repo-x 1/1`, "
        "`rate-limit agent:planner until ...`.",
    )
    attempts: list[AttemptView]


@shows(ApprovalRequest)
class ApprovalView(ResponseModel):
    pass


@shows(Run, "run_id", "parent_step_id", "workflow_id", "state", "created_at")
class ChildRunView(ResponseModel):
    """A child run as its parent's GET shows it (issue 32)."""

    release_id: str


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
    children: list[ChildRunView] = Field(
        default_factory=list, description="The child runs its run steps started, oldest first."
    )
    pending_approvals: list[ApprovalView]


class RunPage(ResponseModel):
    items: list[RunSummary]
    next_cursor: str | None = Field(None, description="Opaque; pass as ?cursor= for more.")
    as_of: datetime = Field(description="When this page was read (its freshness).")


# ---------------------------------------------------------------------- approvals


class DecisionRequest(RequestModel):
    decision: Decision
    version: int = Field(ge=1, le=INT8_MAX, description="The request version decided on.")
    proposal_hash: Name
    reason: Reason | None = None


class BulkDecisionItem(DecisionRequest):
    approval_id: UUID


class BulkDecisionRequest(RequestModel):
    """Many decisions in one call: each item is the single decision's body and its request."""

    items: list[BulkDecisionItem] = Field(min_length=1, max_length=500)


class BulkDecisionOutcome(BulkOutcome):
    approval_id: UUID
    approval: ApprovalView | None = None


class BulkDecisionResponse(ResponseModel):
    items: list[BulkDecisionOutcome]
    counts: dict[str, int] = Field(description="How many items had each outcome.")


class ApprovalPage(ResponseModel):
    items: list[ApprovalView]
    next_cursor: str | None = None
    as_of: datetime


# ---------------------------------------------------------------------- policy


class PolicyRequest(RequestModel):
    """An approval policy revision (``runcontrol policy FILE`` takes the same JSON)."""

    # strict: a number for a count, a string for a name; nothing converted (issue 34)
    model_config = ConfigDict(
        alias_generator=to_camel, extra="forbid", allow_inf_nan=False, strict=True
    )

    approval_required_for: list[str] = Field(
        default=["shared-write", "external-irreversible"],
        description="Side-effect classes that need a decision (a step's `gate` adds its own).",
    )
    approver_roles: list[str] = Field(default=["Reviewer", "WorkspaceAdmin"], min_length=1)
    required_approvals: int = Field(
        default=1, ge=1, le=MAX_APPROVALS, description="Distinct approvers."
    )
    assignees: list[Name] = Field(
        default=[], max_length=MAX_ASSIGNEES, description="When set, only these subjects decide."
    )
    expiry_hours: float | None = Field(default=None, gt=0, le=MAX_EXPIRY_HOURS)
    expiry_action: str = Field(
        default="fail", description="fail | reject | auto-approve | re-request"
    )
    max_re_requests: int = Field(default=3, ge=0, le=MAX_RE_REQUESTS)
    rate_limits: dict[str, Any] | None = Field(
        default=None,
        description="Token buckets (rate limits) the revision's runs draw on: "
        '`{"tenant": {"perSecond", "burst"}, "agents": {agentId: {...}}, '
        '"named": {name: {...}}}`; a release step names its named limits (`rateLimits`).',
    )
    mcp_decisions: bool = Field(
        default=False,
        description="Whether MCP clients may decide approvals (the MCP server's "
        "`decide_approval` tool, docs/mcp.md); off by default.",
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


@shows(SignalResult, described={"delivered": "False: kept until the step waits for it."})
class SignalResponse(ResponseModel):
    pass


# ---------------------------------------------------------------------- events


# ``body``, the typed payload, is memory only: the envelope carries the payload it serialises to.
@shows(Event, without=("body",), rename={"event_type": "type"})
class EventEnvelope(ResponseModel):
    """One committed per-run event with the ADR-0014 envelope; ``seq`` is the SSE id."""


class FeedEvent(EventEnvelope):
    """One event of the tenant feed (``/factory/events``): the envelope plus its tenant-wide
    ``position``, the feed's SSE id and a webhook redelivery cursor."""

    position: int


class OutputChunkView(ResponseModel):
    """One stored chunk of a step's streamed output (docs/streaming.md): ``position`` (the
    run's, from 1, gap-free: the SSE id and the cursor), the attempt's ``seq``, and ``text`` or
    ``data`` (any JSON value)."""

    position: int
    attempt_id: UUID
    step_id: UUID
    seq: int
    text: str | None = None
    data: Any = None
    written_at: datetime


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
    after: int = Field(ge=0, le=INT8_MAX, description="Feed position: redeliver after it.")


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


@shows(
    ControlResult,
    described={"attempt_id": "retry: the new attempt (when dispatched); resolve: the attempt."},
)
class ControlResponse(ResponseModel):
    pass


@shows(
    RerunRun,
    "rerun_of",
    "release",
    described={"release": "`pinned` or `current`: which release the rerun runs."},
)
class RerunResponse(SubmitRunResponse):
    created: bool = Field(description="False when this Idempotency-Key already made the rerun.")


class ReplayRequest(ControlRequest):
    """``POST /factory/runs/{runId}/replays`` (docs/replay.md)."""

    release_alias: Name = Field("latest", description="The release the replay runs.")
    live_calls: bool = Field(
        False,
        description="A call the original did not make is made live (model requests only, "
        "never a side effect); false: the step fails `replay-diverged`.",
    )
    approvals: Literal["park", "fail"] = Field(
        "park",
        description="A proposal the original never had approved: `park` waits for a human, "
        "`fail` fails the step `replay-diverged`.",
    )


@shows(ReplayRun, "replay_of", "release_alias", "live_calls", "approvals")
class ReplayResponse(SubmitRunResponse):
    created: bool = Field(description="False when this Idempotency-Key already made the replay.")


class ReplayReport(ResponseModel):
    """A replay's divergence report against its original (docs/replay.md)."""

    original_run_id: UUID
    replay_run_id: UUID
    original_state: str
    replay_state: str
    diverged: bool = Field(description="Whether anything differs from the original.")
    steps: list[dict[str, Any]] = Field(
        description="Per step name: `equal`, `originalHash`, `replayHash`, a `diff` of small "
        "results ({path, before, after}), the replay's `replayFailureClass`."
    )
    calls_not_in_original: list[dict[str, Any]] = Field(
        description="The replay's journaled calls the original did not make (or made with "
        "other arguments, or with another value)."
    )
    original_calls_not_made: list[dict[str, Any]]
    approvals_changed: list[dict[str, Any]] = Field(
        description="Approvals of a proposal the original never had in that step."
    )
    replay: dict[str, Any] | None = Field(description="The replay's options.")


# ---------------------------------------------------------------------- schedules


class ScheduleTiming(RequestModel):
    """When a schedule fires (docs/schedules.md): ``cron`` in ``timeZone``, or every
    ``intervalSeconds``; the bounds of each are ``domain.schedules``'."""

    cron: str | None = Field(
        None,
        min_length=9,
        max_length=200,
        pattern=r"^[0-9A-Za-z*/,\- ]+$",
        description="5 fields (minute hour day month weekday; 0 or 7 is Sunday), or 6 with "
        "seconds first.",
    )
    time_zone: Name = Field("UTC", description="An IANA zone: cron fields are its wall time.")
    interval_seconds: float | None = Field(None, description="Instead of cron: every N s.")
    jitter_seconds: float = Field(0.0, description="Each fire time delayed by 0 to N s.")
    start_at: AwareDatetime | None = None
    end_at: AwareDatetime | None = None
    overlap: Literal["skip", "buffer-one", "allow-all", "cancel-other"] = "skip"
    catch_up_window_seconds: float = Field(
        300.0, description="A fire time found later than this after it was due is missed."
    )


class ScheduleRequest(ScheduleTiming):
    """CreateSchedule: the run it submits (the body of SubmitRun), and when. An unknown field
    is refused (422), as UpdateSchedule's are: a misspelt timing is not silently the default
    (``run`` keeps SubmitRun's own rules)."""

    model_config = ConfigDict(extra="forbid")

    run: SubmitRunRequest
    paused: bool = False
    note: Reason | None = None


class SchedulePatch(BaseModel):
    """UpdateSchedule: only the fields given change. ``paused`` with a ``note`` pauses or
    resumes; a new ``run`` makes the caller the schedule's owner."""

    model_config = ConfigDict(alias_generator=to_camel, extra="forbid", allow_inf_nan=False)

    paused: bool | None = None
    note: Reason | None = None
    run: SubmitRunRequest | None = None
    cron: str | None = Field(None, min_length=9, max_length=200, pattern=r"^[0-9A-Za-z*/,\- ]+$")
    time_zone: Name | None = None
    interval_seconds: float | None = None
    jitter_seconds: float | None = None
    start_at: AwareDatetime | None = None
    end_at: AwareDatetime | None = None
    overlap: Literal["skip", "buffer-one", "allow-all", "cancel-other"] | None = None
    catch_up_window_seconds: float | None = None


class ScheduleFire(ResponseModel):
    nominal_at: datetime
    kind: str
    outcome: str
    run_id: UUID | None = None
    run_state: str | None = None
    submitted_at: datetime | None = None
    cancels: list[UUID] | None = None
    error: str | None = None
    recorded_at: datetime


class ScheduleView(ResponseModel):
    schedule_id: UUID
    project_id: str
    owner: str = Field(description="The subject whose runs the schedule starts.")
    run: dict[str, Any]
    cron: str | None = None
    time_zone: str
    interval_seconds: float | None = None
    jitter_seconds: float
    start_at: datetime | None = None
    end_at: datetime | None = None
    overlap: str
    catch_up_window_seconds: float
    paused: bool
    note: str | None = None
    last_nominal_at: datetime | None = None
    next_fire_at: datetime | None = Field(
        None, description="None: no fire time is left, or the schedule is paused."
    )
    buffered_at: datetime | None = None
    started: int
    skipped: int
    missed: int
    created_at: datetime
    updated_at: datetime
    next_fire_times: list[datetime] = Field(default_factory=list)
    last_fires: list[ScheduleFire] = Field(default_factory=list)


class SchedulePage(ResponseModel):
    items: list[ScheduleView]
    next_cursor: str | None = None


class BackfillRequest(RequestModel):
    start_at: AwareDatetime
    end_at: AwareDatetime
    overlap: Literal["skip", "buffer-one", "allow-all", "cancel-other"] | None = Field(
        None, description="This backfill's overlap policy (default: the schedule's)."
    )


PausedAnyway = Annotated[
    bool,
    Field(
        description="The schedule is paused: a trigger or backfill, an operator's explicit "
        "act, fires through the pause (the schedule's own fire times stay unfired)."
    ),
]


class BackfillResponse(ResponseModel):
    started: int
    skipped: int
    buffered: int
    already_fired: int
    paused: PausedAnyway


class TriggerResponse(ResponseModel):
    nominal_at: datetime
    outcome: str | None = Field(description="None: that instant was fired already.")
    paused: PausedAnyway


# ---------------------------------------------------------------------- run templates


class TemplateRequest(RequestModel):
    """A run template's content (issue 44, docs/templates.md): checked by
    ``domain.templates.from_dict`` (a bad schema or expression is 422, nothing stored)."""

    workflow_id: Name
    release_alias: Name = "latest"
    default_input: JsonObject = Field(default_factory=dict)
    limits: JsonObject = Field(default_factory=dict)
    input_schema: dict[str, Any] | bool | None = Field(
        None, description="A JSON Schema (the subset in docs/templates.md) the input satisfies."
    )
    pre_approvals: list[dict[str, Any]] = Field(
        default_factory=list,
        max_length=20,
        description="`{actionClass, expiresAt, maxUses, approverRole, proposalSchema?, "
        "proposalWhen?}`: what the template's runs may do without a human.",
    )


class CreateTemplateRequest(TemplateRequest):
    template_id: Name


class TemplateDecisionRequest(RequestModel):
    decision: Decision = Field(description="approve or reject")
    version: int = Field(ge=1, le=INT8_MAX, description="The template version decided on.")
    content_hash: Name
    reason: Reason | None = None


class RevokeTemplateRequest(RequestModel):
    reason: Reason | None = None


@shows(
    Template,
    "template_id",
    "version",
    "workflow_id",
    "release_alias",
    "state",
    "content_hash",
    "created_by",
    "created_at",
    "decided_by",
    "decided_at",
    "reason",
    "break_glass",
)
class TemplateView(ResponseModel):
    uses: int = Field(description="How many approvals the version has decided.")
    updated_at: datetime
    default_input: dict[str, Any]
    limits: dict[str, Any]
    input_schema: dict[str, Any] | bool | None = None
    pre_approvals: list[dict[str, Any]]


class TemplatePage(ResponseModel):
    items: list[TemplateView]
    next_cursor: datetime | None = None
