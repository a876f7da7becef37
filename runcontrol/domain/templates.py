"""Run templates with pre-approved action classes (issue 44): a reviewed, standing answer to
"runs of workflow W, with input inside these bounds, may do action class C, until this date,
at most N times".

A template version is immutable content (``content``, hashed: ``content_hash``) and a state:
``Proposed`` -> ``Active`` (decided by a Reviewer or WorkspaceAdmin other than its author,
bound to its version and its content hash: the rules of a run's approval) or ``Rejected``;
``Active`` -> ``Revoked`` at once; an edit is a new version (``Proposed``) and the one it
replaces is ``Superseded``. ``pre_approval`` is the rule a run's approval request consults.
Pure: no I/O; times come in as arguments.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from . import conditions, errors, json_schema
from .decisions import bound_to, outside_rule
from .hashing import canonical_hash
from .limits import name
from .states import Decision, Role, SideEffectClass

TEMPLATE_DECIDER = "template:"  # how a decision by a template is named: template:{id}@{version}
APPROVER_ROLES = frozenset({Role.REVIEWER, Role.WORKSPACE_ADMIN})
PROPOSAL_ROOTS = ("proposal",)
FIELDS = frozenset(
    {"workflowId", "releaseAlias", "defaultInput", "limits", "inputSchema", "preApprovals"}
)
LIMITS = ("maxCostUsd", "maxMinutes")  # a run's limits a template gives (the run's names)
PRE_APPROVAL_FIELDS = frozenset(
    {"actionClass", "proposalSchema", "proposalWhen", "expiresAt", "maxUses", "approverRole"}
)


class TemplateState(StrEnum):
    PROPOSED = "Proposed"
    ACTIVE = "Active"
    REJECTED = "Rejected"
    REVOKED = "Revoked"
    SUPERSEDED = "Superseded"


@dataclass(frozen=True, slots=True)
class PreApproval:
    """One action class a template's runs may do without a human, and its bounds."""

    action_class: SideEffectClass
    expires_at: datetime
    max_uses: int
    approver_role: Role
    proposal_schema: Mapping[str, Any] | bool | None = None
    proposal_when: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "actionClass": str(self.action_class),
            "expiresAt": self.expires_at.isoformat(),
            "maxUses": self.max_uses,
            "approverRole": str(self.approver_role),
            "proposalSchema": self.proposal_schema,
            "proposalWhen": self.proposal_when,
        }

    def fits(self, proposal: Any) -> bool:
        """Whether the proposal satisfies the constraint (no constraint: any proposal)."""
        if self.proposal_schema is not None and (
            json_schema.first_error(self.proposal_schema, proposal, "proposal") is not None
        ):
            return False
        if self.proposal_when is not None:
            node = conditions.parse(self.proposal_when, "proposalWhen", PROPOSAL_ROOTS)
            return conditions.holds_over(node, {"proposal": proposal})
        return True

    @property
    def constrained(self) -> bool:
        return self.proposal_schema is not None or self.proposal_when is not None


@dataclass(slots=True)
class Template:
    """One version of a template: its content never changes, its state does."""

    tenant_id: str
    project_id: str
    template_id: str
    version: int
    workflow_id: str
    release_alias: str
    default_input: Mapping[str, Any]
    limits: Mapping[str, Any]
    input_schema: Mapping[str, Any] | bool | None
    pre_approvals: tuple[PreApproval, ...]
    created_by: str
    created_at: datetime
    content_hash: str = ""
    state: TemplateState = TemplateState.PROPOSED
    decided_by: str | None = None
    decided_at: datetime | None = None
    reason: str | None = None
    break_glass: bool = False

    def content(self) -> dict[str, Any]:
        """What a decision is bound to (with the version: an edit is another decision)."""
        return {"templateId": self.template_id, "version": self.version, **self.document()}

    def document(self) -> dict[str, Any]:
        """What its author wrote, as ``from_dict`` reads it back."""
        return {
            "workflowId": self.workflow_id,
            "releaseAlias": self.release_alias,
            "defaultInput": dict(self.default_input),
            "limits": dict(self.limits),
            "inputSchema": self.input_schema,
            "preApprovals": [p.to_dict() for p in self.pre_approvals],
        }

    @property
    def reference(self) -> str:
        """How a decision names it: ``template:{id}@{version}``."""
        return f"{TEMPLATE_DECIDER}{self.template_id}@{self.version}"


@dataclass(frozen=True, slots=True)
class Pinned:
    """A run's template version as its grain reads it: the version and the uses so far of
    each of its pre-approvals (in their order; one not counted yet has none)."""

    template: Template
    uses: Sequence[int] = ()


def from_dict(
    doc: Any,
    *,
    tenant_id: str,
    project_id: str,
    template_id: str,
    version: int,
    author: str,
    now: datetime,
    stored: bool = False,
) -> Template:
    """A new version from its document; ``ValidationFailed`` (a 422) names the first fault.
    ``stored``: a version read back (its expiries may have passed since)."""
    if not isinstance(doc, Mapping):
        raise errors.ValidationFailed("a template is an object")
    unknown = sorted(set(doc) - FIELDS)
    if unknown:
        raise errors.ValidationFailed(f"unknown field {unknown[0]!r}")
    name(template_id, "templateId")
    workflow_id = name(doc.get("workflowId"), "workflowId")
    alias = name(doc.get("releaseAlias", "latest"), "releaseAlias")
    default_input = _object(doc.get("defaultInput", {}), "defaultInput")
    limits = _object(doc.get("limits", {}), "limits")
    for key, value in limits.items():
        if key not in LIMITS:
            raise errors.ValidationFailed(f"limits: unknown field {key!r}")
        kind = int | float if key == "maxCostUsd" else int
        if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
            raise errors.ValidationFailed(f"limits.{key}: a positive number")
    input_schema = doc.get("inputSchema")
    if input_schema is not None:
        json_schema.check_schema(input_schema, "inputSchema")
    raw = doc.get("preApprovals", [])
    if not isinstance(raw, list):
        raise errors.ValidationFailed("preApprovals: a list")
    pre = tuple(
        _pre_approval(p, f"preApprovals[{i}]", None if stored else now) for i, p in enumerate(raw)
    )
    template = Template(
        tenant_id=tenant_id,
        project_id=project_id,
        template_id=template_id,
        version=version,
        workflow_id=workflow_id,
        release_alias=alias,
        default_input=default_input,
        limits=limits,
        input_schema=input_schema,
        pre_approvals=pre,
        created_by=author,
        created_at=now,
    )
    template.content_hash = canonical_hash(template.content())
    return template


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, Mapping):
        raise errors.ValidationFailed(f"{where}: an object")
    canonical_hash(value)  # JSON only: refuses NaN, non-string keys
    return dict(value)


def _pre_approval(doc: Any, where: str, now: datetime | None) -> PreApproval:
    if not isinstance(doc, Mapping):
        raise errors.ValidationFailed(f"{where}: an object")
    unknown = sorted(set(doc) - PRE_APPROVAL_FIELDS)
    if unknown:
        raise errors.ValidationFailed(f"{where}: unknown field {unknown[0]!r}")
    try:
        action = SideEffectClass(str(doc.get("actionClass")))
    except ValueError:
        choices = ", ".join(str(c) for c in SideEffectClass)
        raise errors.ValidationFailed(f"{where}.actionClass: one of {choices}") from None
    try:
        role = Role(doc.get("approverRole", Role.REVIEWER))
    except ValueError:
        role = None
    if role not in APPROVER_ROLES:
        raise errors.ValidationFailed(f"{where}.approverRole: Reviewer or WorkspaceAdmin")
    expires_at = doc.get("expiresAt")
    if isinstance(expires_at, str):
        try:
            expires_at = datetime.fromisoformat(expires_at)
        except ValueError:
            expires_at = None
    if not isinstance(expires_at, datetime) or expires_at.tzinfo is None:
        raise errors.ValidationFailed(f"{where}.expiresAt: a date-time with its offset")
    if now is not None and expires_at <= now:
        raise errors.ValidationFailed(f"{where}.expiresAt: in the future")
    max_uses = doc.get("maxUses")
    if not isinstance(max_uses, int) or isinstance(max_uses, bool) or not 1 <= max_uses <= 2**31:
        raise errors.ValidationFailed(f"{where}.maxUses: an integer from 1")
    schema = doc.get("proposalSchema")
    if schema is not None:
        json_schema.check_schema(schema, f"{where}.proposalSchema")
    when = doc.get("proposalWhen")
    if when is not None:
        conditions.parse(when, f"{where}.proposalWhen", PROPOSAL_ROOTS)
    return PreApproval(action, expires_at, max_uses, role, schema, when)


def edit(template: Template, doc: Any, author: str, now: datetime) -> Template:
    """The next version (``Proposed``: it needs its own decision); this one is Superseded."""
    if template.state in (TemplateState.REVOKED, TemplateState.SUPERSEDED):
        raise errors.IllegalTransition(f"template version is {template.state}")
    new = from_dict(
        doc,
        tenant_id=template.tenant_id,
        project_id=template.project_id,
        template_id=template.template_id,
        version=template.version + 1,
        author=author,
        now=now,
    )
    template.state = TemplateState.SUPERSEDED
    return new


def decide(
    template: Template,
    subject: str,
    roles: frozenset[Role],
    decision: Decision,
    version: int,
    content_hash: str,
    reason: str | None,
    now: datetime,
) -> None:
    """A run approval's rules for a template: the version and content hash it was read at,
    never its author, a Reviewer or WorkspaceAdmin (a PlatformAdmin only as break-glass
    with a reason)."""
    if template.state is not TemplateState.PROPOSED:
        raise errors.ApprovalAlreadyDecided(f"the template version is {template.state}")
    bound_to(version, template.version, content_hash, template.content_hash, "template")
    if subject == template.created_by:
        raise errors.SeparationOfDuties("the author of a template may never decide it")
    break_glass = outside_rule(
        bool(roles & APPROVER_ROLES),
        roles,
        reason,
        "deciding a template needs Reviewer or WorkspaceAdmin",
    )
    if decision is Decision.APPROVE:
        template.state = TemplateState.ACTIVE
    elif decision is Decision.REJECT:
        template.state = TemplateState.REJECTED
    else:
        raise errors.ValidationFailed("a template is approved or rejected")
    template.decided_by, template.decided_at = subject, now
    template.reason, template.break_glass = reason, break_glass


def revoke(template: Template, reason: str | None) -> None:
    """Immediate: from now on the template pre-approves nothing."""
    if template.state not in (TemplateState.PROPOSED, TemplateState.ACTIVE):
        raise errors.IllegalTransition(f"the template version is {template.state}")
    template.state = TemplateState.REVOKED
    template.reason = reason


def submission_input(template: Template, given: Mapping[str, Any] | None) -> dict[str, Any]:
    """The run's input: ``given`` merged onto the defaults (top-level keys), checked against
    the input constraints; ``ValidationFailed`` names the rule it breaks."""
    merged = {**template.default_input, **(given or {})}
    if template.input_schema is not None:
        error = json_schema.first_error(template.input_schema, merged, "input")
        if error:
            raise errors.ValidationFailed(f"the template's input constraint: {error}")
    return merged


def used(uses: Sequence[int], index: int) -> int:
    """How many times the pre-approval at ``index`` has been used (none counted yet: 0)."""
    return uses[index] if index < len(uses) else 0


def pre_approval(
    template: Template,
    uses: Sequence[int],
    action_class: SideEffectClass,
    proposal: Any,
    requester: str,
    now: datetime,
) -> tuple[int, PreApproval] | str:
    """The pre-approval that decides this request at once (its index in the template, and
    itself), or why none does (it waits for a human): the template Active, a pre-approval of
    this class or one above it, unexpired, under its uses (``uses``: how many times each has
    been used, in their order; one not counted yet has none), the proposal inside its
    constraint, and a requester who is neither the template's author nor its approver. The
    use is counted by the decision's own statement, guarded (``runcontrol_template_use``): a
    use this read did not see refuses it, and the request is decided again on fresh uses."""
    if template.state is not TemplateState.ACTIVE:
        return f"the template is {template.state}"
    if requester in (template.created_by, template.decided_by):
        return "the requester authored or approved the template"
    covering = [
        (i, p)
        for i, p in enumerate(template.pre_approvals)
        if p.action_class.at_least(action_class)
    ]
    if not covering:
        return f"no pre-approval covers {action_class}"
    for index, pre in covering:
        if now >= pre.expires_at:
            continue
        if used(uses, index) >= pre.max_uses:
            continue
        if pre.constrained and (proposal is None or not pre.fits(proposal)):
            continue
        return index, pre
    return "no pre-approval is unexpired, under its uses and satisfied by the proposal"
