"""Workflow definitions (what a release pins) and policy documents (what a revision pins)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from .errors import ValidationFailed
from .hashing import canonical_hash
from .states import ExpiryAction, Role, SideEffectClass

GATES = ("none", "approval")


@dataclass(frozen=True, slots=True)
class StepSpec:
    name: str
    agent_id: str
    skill_id: str | None = None
    max_attempts: int | None = None
    gate: str = "none"
    side_effect_class: SideEffectClass = SideEffectClass.READ

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "agentId": self.agent_id,
            "skillId": self.skill_id,
            "maxAttempts": self.max_attempts,
            "gate": self.gate,
            "sideEffectClass": str(self.side_effect_class),
        }


@dataclass(frozen=True, slots=True)
class WorkflowDefinition:
    workflow_id: str
    steps: tuple[StepSpec, ...]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> WorkflowDefinition:
        try:
            workflow_id = data["workflowId"]
            raw_steps = data["steps"]
        except (KeyError, TypeError) as exc:
            raise ValidationFailed(f"workflow definition lacks {exc}") from None
        if not isinstance(workflow_id, str):
            raise ValidationFailed("workflowId must be a string")
        if not workflow_id or not isinstance(raw_steps, list) or not raw_steps:
            raise ValidationFailed("a workflow needs an id and at least one step")
        steps = []
        names = set()
        for i, raw in enumerate(raw_steps):
            if not isinstance(raw, dict) or not raw.get("agentId"):
                raise ValidationFailed(f"steps[{i}]: agentId is required")
            name = str(raw.get("name") or f"step-{i + 1}")
            if name in names:
                raise ValidationFailed(f"steps[{i}]: duplicate step name {name!r}")
            names.add(name)
            gate = raw.get("gate", "none") or "none"
            if gate not in GATES:
                raise ValidationFailed(f"steps[{i}]: gate must be one of {GATES}")
            max_attempts = raw.get("maxAttempts")
            valid_int = isinstance(max_attempts, int) and not isinstance(max_attempts, bool)
            if max_attempts is not None and (not valid_int or max_attempts < 1):
                raise ValidationFailed(f"steps[{i}]: maxAttempts must be a positive integer")
            try:
                side_effect = SideEffectClass(raw.get("sideEffectClass", "read"))
            except ValueError:
                raise ValidationFailed(
                    f"steps[{i}]: sideEffectClass must be one of "
                    f"{[str(c) for c in SideEffectClass]}"
                ) from None
            steps.append(
                StepSpec(
                    name=name,
                    agent_id=str(raw["agentId"]),
                    skill_id=raw.get("skillId"),
                    max_attempts=max_attempts,
                    gate=gate,
                    side_effect_class=side_effect,
                )
            )
        return cls(workflow_id=workflow_id, steps=tuple(steps))

    def to_dict(self) -> dict[str, Any]:
        return {"workflowId": self.workflow_id, "steps": [s.to_dict() for s in self.steps]}

    @property
    def content_hash(self) -> str:
        return canonical_hash(self.to_dict())


class Named(Protocol):
    @property
    def name(self) -> str: ...


def dependencies(steps: Sequence[Named], step: str) -> tuple[str, ...]:
    """The names of the steps whose results step ``step`` receives in its grant.

    ``steps``: the workflow's steps in order (a definition's ``StepSpec``s, or a run's steps by
    ordinal). Until steps declare ``dependsOn``, a step depends on the step before it (the
    first on none). The one place that says so: a step graph changes only this function."""
    names = [s.name for s in steps]
    index = names.index(step)
    return (names[index - 1],) if index > 0 else ()


def final_step(steps: Sequence[Named]) -> str:
    """The step whose result is the run's result: the last one (with ``dependsOn``, the one
    step nothing depends on)."""
    return steps[-1].name


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
