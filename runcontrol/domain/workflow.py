"""Workflow definitions (what a release pins) and policy documents (what a revision pins)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from . import conditions, limits
from .agent import AgentExposure
from .errors import ValidationFailed
from .flow import ConcurrencySpec, concurrency_specs
from .hashing import canonical_hash
from .rates import RateLimits, step_limits
from .states import ExpiryAction, Role, SideEffectClass

GATES = ("none", "approval")
AGENT = "agent"  # a worker executes it
WAIT = "wait"  # a durable timer settles it: ``seconds`` after it starts, or ``until`` an instant
SIGNAL = "signal"  # an input from outside settles it (POST /factory/runs/{runId}/signals/{name})
RUN = "run"  # a child run of another workflow settles it (docs/child-runs.md)
KINDS = (AGENT, WAIT, SIGNAL, RUN)
# Child runs (issue 32): a run started by a step is one level deeper than its parent; one
# deeper than this is refused (a cycle of workflows calling each other stops here). A run
# has at most one open child per run step, so the steps bound its open children.
MAX_CHILD_DEPTH = 5
MAX_RUN_STEPS = 20
ON_TIMEOUT = ("fail", "continue")  # a signal step's timeout: fail the run, or use ``default``
MAX_WAIT_SECONDS = 366 * 86400.0  # a run's lifetime bounds it anyway


@dataclass(frozen=True, slots=True)
class StepSpec:
    name: str
    agent_id: str
    skill_id: str | None = None
    max_attempts: int | None = None
    gate: str = "none"
    side_effect_class: SideEffectClass = SideEffectClass.READ
    # The names of the steps this one waits for; None (the key absent): the step before it.
    depends_on: tuple[str, ...] | None = None
    kind: str = AGENT
    # A wait step's timer (``kind == "wait"``): exactly one of them.
    seconds: float | None = None
    until: datetime | None = None
    # A signal step's (``kind == "signal"``): the signal's name, how long it waits (None: for
    # ever, the run's lifetime aside) and what then (``ON_TIMEOUT``; ``default``: its result).
    signal: str | None = None
    timeout_seconds: float | None = None
    on_timeout: str = "fail"
    default: Any = None
    # An agent step's concurrency limits (issue 21): a slot per attempt, dispatch to settlement.
    concurrency: tuple[ConcurrencySpec, ...] | None = None
    # The named rate limits an agent step's dispatch draws on: (name, units); None: none.
    rate_limits: tuple[tuple[str, float], ...] | None = None
    # Its condition (``conditions``): false when it is ready, it ends Skipped; None: none.
    when: str | None = None
    # A run step's (``kind == "run"``): the workflow its child runs, the alias resolved when
    # the child is accepted (None: the default), and the child's input, by field, as
    # expressions over the input and the dependencies' results (None: the parent's input).
    child_workflow_id: str | None = None
    child_alias: str | None = None
    child_input: dict[str, str] | None = None

    @property
    def wait(self) -> dict[str, Any] | None:
        """What a step no worker executes waits for, as the release and the step row hold it."""
        if self.kind == RUN:
            return {
                "workflowId": self.child_workflow_id,
                "releaseAlias": self.child_alias,
                "input": self.child_input,
            }
        if self.kind == SIGNAL:
            return {
                "signal": self.signal,
                "timeoutSeconds": self.timeout_seconds,
                "onTimeout": self.on_timeout,
                "default": self.default,
            }
        if self.kind != WAIT:
            return None
        if self.until is not None:
            return {"until": self.until.isoformat()}
        return {"seconds": self.seconds}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "agentId": self.agent_id,
            "skillId": self.skill_id,
            "maxAttempts": self.max_attempts,
            "gate": self.gate,
            "sideEffectClass": str(self.side_effect_class),
        }
        # Absent rather than null: a release published before graphs keeps its content hash
        # (and its release id) when it is published again.
        if self.depends_on is not None:
            out["dependsOn"] = list(self.depends_on)
        if self.kind != AGENT:  # likewise: an agent step's dict is as before
            out["kind"] = self.kind
            out.update(self.wait or {})
        if self.concurrency is not None:  # likewise
            out["concurrency"] = [c.to_dict() for c in self.concurrency]
        if self.rate_limits is not None:  # likewise: absent when not set
            out["rateLimits"] = [{"name": n, "units": u} for n, u in self.rate_limits]
        if self.when is not None:  # likewise
            out["when"] = self.when
        return out


@dataclass(frozen=True, slots=True)
class WorkflowDefinition:
    workflow_id: str
    steps: tuple[StepSpec, ...]
    # Workflow-wide concurrency limits (issue 21): a slot for the run's life, from its first
    # dispatch until it is terminal.
    concurrency: tuple[ConcurrencySpec, ...] | None = None
    # Exposed as an A2A agent (issue 31): opt-in; None (the key absent) is no agent.
    agent: AgentExposure | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkflowDefinition:
        try:
            workflow_id = data["workflowId"]
            raw_steps = data["steps"]
        except (KeyError, TypeError) as exc:
            raise ValidationFailed(f"workflow definition lacks {exc}") from None
        limits.name(workflow_id, "workflowId", limit=limits.MAX_WORKFLOW_ID, segment=True)
        if not isinstance(raw_steps, list) or not raw_steps:
            raise ValidationFailed("a workflow needs an id and at least one step")
        if len(raw_steps) > limits.MAX_STEPS:
            raise ValidationFailed(f"a workflow has at most {limits.MAX_STEPS} steps")
        steps = []
        names: set[str] = set()
        for i, raw in enumerate(raw_steps):
            if not isinstance(raw, dict):
                raise ValidationFailed(f"steps[{i}]: agentId is required (a step is an object)")
            kind = raw.get("kind", AGENT) or AGENT
            if kind not in KINDS:
                raise ValidationFailed(f"steps[{i}]: kind must be one of {KINDS}")
            if kind in (WAIT, SIGNAL, RUN):
                names.add(_unique(i, raw, names))
                made = {WAIT: _wait_step, SIGNAL: _signal_step, RUN: _run_step}[kind](i, raw)
                steps.append(replace(made, when=_when(i, raw)))
                continue
            if not raw.get("agentId"):
                raise ValidationFailed(f"steps[{i}]: agentId is required")
            name = _unique(i, raw, names)
            names.add(name)
            gate = raw.get("gate", "none") or "none"
            if gate not in GATES:
                raise ValidationFailed(f"steps[{i}]: gate must be one of {GATES}")
            max_attempts = _max_attempts(i, raw.get("maxAttempts"))
            skill_id = raw.get("skillId")
            try:
                side_effect = SideEffectClass(raw.get("sideEffectClass", "read"))
            except (ValueError, TypeError):
                raise ValidationFailed(
                    f"steps[{i}]: sideEffectClass must be one of "
                    f"{[str(c) for c in SideEffectClass]}"
                ) from None
            steps.append(
                StepSpec(
                    name=name,
                    agent_id=limits.name(raw["agentId"], f"steps[{i}].agentId"),
                    skill_id=None
                    if skill_id is None
                    else limits.name(skill_id, f"steps[{i}].skillId"),
                    max_attempts=max_attempts,
                    gate=gate,
                    side_effect_class=side_effect,
                    depends_on=_depends_on(i, raw),
                    concurrency=concurrency_specs(
                        raw.get("concurrency"), f"steps[{i}].concurrency"
                    ),
                    rate_limits=step_limits(i, raw.get("rateLimits")),
                    when=_when(i, raw),
                )
            )
        check_graph(steps)
        check_references(steps)
        return cls(
            workflow_id=workflow_id,
            steps=tuple(steps),
            concurrency=concurrency_specs(data.get("concurrency"), "concurrency"),
            agent=None if data.get("agent") is None else AgentExposure.from_dict(data["agent"]),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "workflowId": self.workflow_id,
            "steps": [s.to_dict() for s in self.steps],
        }
        # Absent rather than null: a release without limits keeps its content hash.
        if self.concurrency is not None:
            out["concurrency"] = [c.to_dict() for c in self.concurrency]
        if self.agent is not None:  # likewise
            out["agent"] = self.agent.to_dict()
        return out

    @property
    def content_hash(self) -> str:
        return canonical_hash(self.to_dict())


def _name(i: int, raw: Mapping[str, Any]) -> str:
    """A step's name: its ``name`` (a name, never converted), ``step-N`` when absent."""
    name = raw.get("name")
    return f"step-{i + 1}" if name in (None, "") else limits.name(name, f"steps[{i}].name")


def _unique(i: int, raw: Mapping[str, Any], names: set[str]) -> str:
    name = _name(i, raw)
    if name in names:
        raise ValidationFailed(f"steps[{i}]: duplicate step name {name!r}")
    return name


def _wait_step(i: int, raw: Mapping[str, Any]) -> StepSpec:
    """A step no worker executes: it succeeds when its timer fires (``seconds`` after its
    dependencies succeeded, or at the instant ``until``, ISO 8601 with an offset)."""
    seconds, until = raw.get("seconds"), raw.get("until")
    if (seconds is None) == (until is None):
        raise ValidationFailed(f"steps[{i}]: a wait step needs exactly one of seconds, until")
    at: datetime | None = None
    if seconds is not None:
        seconds = _seconds(i, "seconds", seconds)
    else:
        try:
            at = datetime.fromisoformat(until) if isinstance(until, str) else None
            utc = at.astimezone(UTC) if at is not None and at.tzinfo is not None else None
        except (ValueError, OverflowError):
            at = None
        if at is None:
            raise ValidationFailed(f"steps[{i}]: until must be an ISO 8601 instant") from None
        if utc is None:
            raise ValidationFailed(f"steps[{i}]: until needs a UTC offset")
    return StepSpec(
        name=_name(i, raw),
        agent_id="",
        depends_on=_depends_on(i, raw),
        kind=WAIT,
        seconds=seconds,
        until=at,
    )


def _seconds(i: int, key: str, value: Any, low: float = 0) -> float:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not low <= value <= MAX_WAIT_SECONDS:
        raise ValidationFailed(
            f"steps[{i}]: {key} must be a number from {low:g} to {MAX_WAIT_SECONDS:g}"
        )
    return float(value)


def _signal_step(i: int, raw: Mapping[str, Any]) -> StepSpec:
    """A step no worker executes: it waits for the signal ``signal`` (its name by default);
    the signal's body is its result. With ``timeoutSeconds`` it gives up after that long
    (``onTimeout``: ``fail`` the run, or ``continue`` with ``default`` as the result)."""
    name = _name(i, raw)
    signal = limits.name(raw.get("signal", name), f"steps[{i}].signal", segment=True)
    timeout = raw.get("timeoutSeconds")
    on_timeout = raw.get("onTimeout", "fail")
    if on_timeout not in ON_TIMEOUT:
        raise ValidationFailed(f"steps[{i}]: onTimeout must be one of {ON_TIMEOUT}")
    if raw.get("default") is not None and on_timeout != "continue":
        raise ValidationFailed(f"steps[{i}]: default is the result of onTimeout continue")
    return StepSpec(
        name=name,
        agent_id="",
        depends_on=_depends_on(i, raw),
        kind=SIGNAL,
        signal=signal,
        timeout_seconds=None if timeout is None else _seconds(i, "timeoutSeconds", timeout, 1),
        on_timeout=on_timeout,
        default=raw.get("default"),
    )


def _run_step(i: int, raw: Mapping[str, Any]) -> StepSpec:
    """A step no worker executes: it starts a child run of ``workflowId`` (``releaseAlias``
    resolved when the child is accepted) with ``input`` built from the parent's input and the
    dependencies' results; the child's result is its result (docs/child-runs.md)."""
    workflow_id, alias, fields = raw.get("workflowId"), raw.get("releaseAlias"), raw.get("input")
    if not isinstance(workflow_id, str) or not workflow_id or len(workflow_id) > 200:
        raise ValidationFailed(
            f"steps[{i}]: a run step's workflowId is a name of 1 to 200 characters"
        )
    if alias is not None and (not isinstance(alias, str) or not alias or len(alias) > 200):
        raise ValidationFailed(f"steps[{i}]: releaseAlias is a name of 1 to 200 characters")
    if fields is not None:
        if not isinstance(fields, dict) or not all(isinstance(k, str) and k for k in fields):
            raise ValidationFailed(f"steps[{i}]: input is an object of field: expression")
        for name, expression in fields.items():
            conditions.parse(expression, f"steps[{i}].input.{name}")
    return StepSpec(
        name=str(raw.get("name") or f"step-{i + 1}"),
        agent_id="",
        max_attempts=_max_attempts(i, raw.get("maxAttempts")),
        depends_on=_depends_on(i, raw),
        kind=RUN,
        child_workflow_id=workflow_id,
        child_alias=alias,
        child_input=None if fields is None else dict(fields),
    )


def _max_attempts(i: int, value: Any) -> int | None:
    if value is None:
        return None
    return limits.integer(value, f"steps[{i}].maxAttempts", 1, limits.MAX_ATTEMPTS)


def _when(i: int, raw: Mapping[str, Any]) -> str | None:
    when = raw.get("when")
    if when is not None:
        conditions.parse(when, f"steps[{i}].when")
    return when


def check_references(specs: Sequence[StepSpec]) -> None:
    """Publication's check of what conditions and child inputs read: ``results.<step>``
    names one of the step's dependencies (the only results it has); a release has at most
    ``MAX_RUN_STEPS`` run steps (its open children's bound)."""
    if sum(1 for s in specs if s.kind == RUN) > MAX_RUN_STEPS:
        raise ValidationFailed(
            f"a workflow has at most {MAX_RUN_STEPS} run steps (its open child runs' limit)"
        )
    for i, spec in enumerate(specs):
        deps = set(_resolved(specs, i))
        sources = {"when": spec.when} if spec.when is not None else {}
        sources.update({f"input.{k}": v for k, v in (spec.child_input or {}).items()})
        for where, text in sources.items():
            for name in conditions.result_names(conditions.parse(text, where)):
                if name not in deps:
                    raise ValidationFailed(
                        f"step {spec.name!r} ({where}) reads results.{name}, which is not "
                        "one of its dependencies",
                        step=spec.name,
                        unknown=name,
                    )


def _depends_on(i: int, raw: Mapping[str, Any]) -> tuple[str, ...] | None:
    if "dependsOn" not in raw or raw["dependsOn"] is None:
        return None
    names = raw["dependsOn"]
    if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
        raise ValidationFailed(f"steps[{i}]: dependsOn must be a list of step names")
    if len(set(names)) != len(names):
        raise ValidationFailed(f"steps[{i}]: dependsOn names a step twice")
    return tuple(names)


class Named(Protocol):
    """A step as ``dependencies`` reads it: a definition's ``StepSpec`` or a run's ``Step``."""

    @property
    def name(self) -> str: ...

    @property
    def depends_on(self) -> Sequence[str] | None: ...


def dependencies(steps: Sequence[Named], step: str) -> tuple[str, ...]:
    """The names of the steps ``step`` waits for (and whose results it receives).

    ``steps``: the workflow's steps in order (a definition's ``StepSpec``s, or a run's steps by
    ordinal). A step's ``dependsOn`` when it has one; otherwise the step before it (the first:
    none), so a release without ``dependsOn`` runs its steps in order. The one place that
    says so."""
    for i, candidate in enumerate(steps):
        if candidate.name == step:
            return _resolved(steps, i)
    raise ValidationFailed(f"the workflow has no step {step!r}", step=step)


def dependency_map(steps: Sequence[Named]) -> dict[str, tuple[str, ...]]:
    """``dependencies`` of every step at once, by step name (one pass over ``steps``)."""
    found: dict[str, tuple[str, ...]] = {}
    for i, s in enumerate(steps):
        found.setdefault(s.name, _resolved(steps, i))  # the first of a name, as ``dependencies``
    return found


def final_step(steps: Sequence[Named]) -> str:
    """The step whose result is the run's result: the last step (in order) that no step
    depends on (a linear release's last step; a graph's join)."""
    depended = {dep for i in range(len(steps)) for dep in _resolved(steps, i)}
    return next(s.name for s in reversed(steps) if s.name not in depended)


def _resolved(steps: Sequence[Named], i: int) -> tuple[str, ...]:
    explicit = steps[i].depends_on
    if explicit is not None:
        return tuple(explicit)
    return (steps[i - 1].name,) if i > 0 else ()


def graph(definition: WorkflowDefinition) -> dict[str, Any]:
    """The release's steps as a graph: nodes in the release's order, each with its resolved
    dependencies, and one edge per dependency (from the step waited for to the waiting one)."""
    specs = definition.steps
    nodes = [
        {"name": s.name, "agentId": s.agent_id, "dependsOn": list(_resolved(specs, i))}
        for i, s in enumerate(specs)
    ]
    edges = [{"from": dep, "to": n["name"]} for n in nodes for dep in n["dependsOn"]]
    return {"nodes": nodes, "edges": edges}


def check_graph(specs: Sequence[StepSpec]) -> None:
    """Publication's check of the graph: every dependency names a step of the workflow, and
    no step depends on itself through any path (the error names the unknown step or the
    cycle). Only explicit ``dependsOn`` can close a cycle: the default points backwards."""
    names = {s.name for s in specs}
    graph: dict[str, tuple[str, ...]] = {}
    for i, spec in enumerate(specs):
        deps = _resolved(specs, i)
        for dep in deps:
            if dep not in names:
                raise ValidationFailed(
                    f"step {spec.name!r} depends on {dep!r}, which is not a step of the workflow",
                    step=spec.name,
                    unknown=dep,
                )
        graph[spec.name] = deps
    # Depth first without recursion (a long linear release is a deep path): a name met again
    # on the current path closes a cycle.
    done: set[str] = set()
    for root in graph:
        if root in done:
            continue
        path: list[str] = [root]
        pending: list[list[str]] = [list(graph[root])]
        while path:
            if not pending[-1]:
                done.add(path.pop())
                pending.pop()
                continue
            dep = pending[-1].pop()
            if dep in done:
                continue
            if dep in path:
                cycle = " -> ".join([*path[path.index(dep) :], dep])
                # a string: the problem's extension members are scalars (api/problems.py)
                raise ValidationFailed(
                    f"the steps' dependencies form a cycle: {cycle}", cycle=cycle
                )
            path.append(dep)
            pending.append(list(graph[dep]))


@dataclass(frozen=True, slots=True)
class Release:
    """An immutable published workflow definition (ReleaseRef = release_id + content hash)."""

    release_id: str
    workflow_id: str
    content_hash: str
    definition: WorkflowDefinition


@dataclass(frozen=True, slots=True)
class PolicyDocument:
    """One revision of approval policy: which action classes need a human decision and from whom."""

    policy_id: str
    revision: str
    approval_required_for: frozenset[SideEffectClass] = frozenset(
        {SideEffectClass.SHARED_WRITE, SideEffectClass.EXTERNAL_IRREVERSIBLE}
    )
    approver_roles: frozenset[Role] = frozenset({Role.REVIEWER, Role.WORKSPACE_ADMIN})
    # Distinct approvers needed (one reject settles the request whatever the quorum).
    required_approvals: int = 1
    # When not empty, only these subjects decide (still needing an approver role); a
    # PlatformAdmin may break glass, with a reason, as always.
    assignees: frozenset[str] = frozenset()
    expiry_hours: float | None = None
    expiry_action: ExpiryAction = ExpiryAction.FAIL
    # With ``re-request``: how many times an expired request is asked again before failing.
    max_re_requests: int = 3
    # Token buckets every run pinned to this revision draws on (None: none configured).
    rate_limits: RateLimits | None = None
    # Whether an MCP client may decide the tenant's approvals (the MCP server's
    # decide_approval tool, docs/mcp.md); every rule of a decision holds either way.
    mcp_decisions: bool = False
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.required_approvals < 1:
            raise ValidationFailed("requiredApprovals must be at least 1")
        if self.expiry_hours is not None and self.expiry_hours <= 0:
            raise ValidationFailed("expiryHours must be positive")
        if self.max_re_requests < 0:
            raise ValidationFailed("maxReRequests must not be negative")
        if not self.approver_roles:
            raise ValidationFailed("approverRoles must name at least one role")
        if self.assignees and len(self.assignees) < self.required_approvals:
            raise ValidationFailed(
                f"{len(self.assignees)} assignees can never reach a quorum of "
                f"{self.required_approvals}"
            )

    @property
    def approver_rule(self) -> str:
        roles = "|".join(sorted(str(r) for r in self.approver_roles))
        rule = f"roles:{roles};not-requester;quorum:{self.required_approvals}"
        if self.assignees:
            rule += ";assignees:" + ",".join(sorted(self.assignees))
        return rule

    def may_decide(self, subject: str, roles: frozenset[Role]) -> bool:
        """Whether this caller is one of the policy's approvers (break-glass aside)."""
        if not roles & self.approver_roles:
            return False
        return not self.assignees or subject in self.assignees

    def needs_approval(self, action_class: SideEffectClass, gate: str) -> bool:
        return gate == "approval" or action_class in self.approval_required_for
