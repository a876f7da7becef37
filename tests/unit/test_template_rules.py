"""Run templates (issue 44), pure: creation's checks, the template's own approval, and the
pre-approval rule a run's approval request consults."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runcontrol.domain import errors
from runcontrol.domain.states import Decision, Role, SideEffectClass
from runcontrol.domain.templates import (
    Template,
    TemplateState,
    decide,
    edit,
    from_dict,
    pre_approval,
    revoke,
    submission_input,
)

T0 = datetime(2026, 12, 1, tzinfo=UTC)
REVIEWER = frozenset({Role.REVIEWER})
SHARED = SideEffectClass.SHARED_WRITE


def document(**changes: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "workflowId": "deps-bump",
        "releaseAlias": "latest",
        "defaultInput": {"branch": "main", "dryRun": False},
        "inputSchema": {
            "type": "object",
            "properties": {"branch": {"type": "string", "pattern": "^(main|release-.+)$"}},
            "required": ["branch"],
        },
        "preApprovals": [
            {
                "actionClass": "shared-write",
                "proposalSchema": {
                    "type": "object",
                    "properties": {"files": {"type": "integer", "maximum": 3}},
                },
                "proposalWhen": "proposal.target == 'deps'",
                "expiresAt": (T0 + timedelta(days=30)).isoformat(),
                "maxUses": 2,
                "approverRole": "Reviewer",
            }
        ],
    }
    doc.update(changes)
    return doc


def made(doc: dict[str, Any] | None = None, author: str = "ann") -> Template:
    return from_dict(
        document() if doc is None else doc,
        tenant_id="acme",
        project_id="default",
        template_id="nightly",
        version=1,
        author=author,
        now=T0,
    )


def active() -> Template:
    template = made()
    decide(template, "bob", REVIEWER, Decision.APPROVE, 1, template.content_hash, None, T0)
    return template


FITS = {"target": "deps", "files": 2}


def test_an_active_template_pre_approves_a_fitting_proposal_of_another_requester():
    template = active()
    assert template.state is TemplateState.ACTIVE
    assert template.reference == "template:nightly@1"
    pre = pre_approval(template, [0], SHARED, FITS, "cid", T0)
    assert not isinstance(pre, str)
    assert pre == (0, template.pre_approvals[0])
    assert pre[1].approver_role is Role.REVIEWER


@pytest.mark.parametrize(
    "proposal",
    [{"target": "deps", "files": 4}, {"target": "infra", "files": 1}, None],
    ids=["schema", "expression", "absent"],
)
def test_a_proposal_outside_the_constraint_waits(proposal):
    assert isinstance(pre_approval(active(), [0], SHARED, proposal, "cid", T0), str)


def test_the_author_and_the_approver_never_ride_on_it():
    template = active()
    assert isinstance(pre_approval(template, [0], SHARED, FITS, "ann", T0), str)
    assert isinstance(pre_approval(template, [0], SHARED, FITS, "bob", T0), str)


def test_uses_expiry_and_class_bound_it():
    template = active()
    assert not isinstance(pre_approval(template, [1], SHARED, FITS, "cid", T0), str)
    assert isinstance(pre_approval(template, [2], SHARED, FITS, "cid", T0), str)
    late = T0 + timedelta(days=30)
    assert isinstance(pre_approval(template, [0], SHARED, FITS, "cid", late), str)
    above = SideEffectClass.EXTERNAL_IRREVERSIBLE
    assert isinstance(pre_approval(template, [0], above, FITS, "cid", T0), str)
    below = SideEffectClass.LOCAL_WRITE
    assert not isinstance(pre_approval(template, [0], below, FITS, "cid", T0), str)


def test_each_pre_approval_counts_its_own_uses():
    doc = document()
    second = {**doc["preApprovals"][0], "maxUses": 1, "proposalSchema": None}
    doc["preApprovals"] = [doc["preApprovals"][0], second]
    template = made(doc)
    decide(template, "bob", REVIEWER, Decision.APPROVE, 1, template.content_hash, None, T0)
    assert pre_approval(template, [], SHARED, FITS, "cid", T0) == (0, template.pre_approvals[0])
    assert pre_approval(template, [2], SHARED, FITS, "cid", T0) == (1, template.pre_approvals[1])
    assert isinstance(pre_approval(template, [2, 1], SHARED, FITS, "cid", T0), str)


def test_proposed_and_revoked_pre_approve_nothing():
    template = made()
    assert pre_approval(template, [0], SHARED, FITS, "cid", T0) == "the template is Proposed"
    template = active()
    revoke(template, "no longer trusted")
    assert template.state is TemplateState.REVOKED
    assert isinstance(pre_approval(template, [0], SHARED, FITS, "cid", T0), str)


def test_the_decision_keeps_a_run_approvals_rules():
    template = made()
    content = template.content_hash
    with pytest.raises(errors.SeparationOfDuties):
        decide(template, "ann", REVIEWER, Decision.APPROVE, 1, content, None, T0)
    with pytest.raises(errors.Forbidden):
        decide(template, "bob", frozenset({Role.OPERATOR}), Decision.APPROVE, 1, content, "", T0)
    with pytest.raises(errors.ApprovalVersionMismatch):
        decide(template, "bob", REVIEWER, Decision.APPROVE, 2, content, None, T0)
    with pytest.raises(errors.ProposalHashMismatch):
        decide(template, "bob", REVIEWER, Decision.APPROVE, 1, "sha256:" + "0" * 64, None, T0)
    admin = frozenset({Role.PLATFORM_ADMIN})
    with pytest.raises(errors.BreakGlassReasonRequired):
        decide(template, "pat", admin, Decision.APPROVE, 1, content, " ", T0)
    decide(template, "pat", admin, Decision.APPROVE, 1, content, "incident 7", T0)
    assert template.break_glass and template.decided_by == "pat"
    with pytest.raises(errors.ApprovalAlreadyDecided):
        decide(template, "bob", REVIEWER, Decision.APPROVE, 1, content, None, T0)


def test_an_edit_is_a_new_version_needing_a_new_decision():
    template = active()
    new = edit(template, document(releaseAlias="stable"), "ann", T0)
    assert (new.version, new.state) == (2, TemplateState.PROPOSED)
    assert template.state is TemplateState.SUPERSEDED
    assert new.content_hash != template.content_hash
    assert isinstance(pre_approval(new, [0], SHARED, FITS, "cid", T0), str)
    assert isinstance(pre_approval(template, [0], SHARED, FITS, "cid", T0), str)


def test_the_same_content_hashes_alike():
    assert made().content_hash == made().content_hash


def test_submission_input_merges_onto_the_defaults_and_names_the_broken_rule():
    template = active()
    assert submission_input(template, {"branch": "release-1"}) == {
        "branch": "release-1",
        "dryRun": False,
    }
    with pytest.raises(errors.ValidationFailed, match="input.branch: pattern"):
        submission_input(template, {"branch": "feature"})


@pytest.mark.parametrize(
    "changes, fault",
    [
        ({"inputSchema": {"type": "object", "$ref": "#/x"}}, "unsupported keyword '\\$ref'"),
        ({"inputSchema": {"type": "thing"}}, "inputSchema.type"),
        ({"inputSchema": {"pattern": "("}}, "inputSchema.pattern"),
        ({"workflowId": 7}, "workflowId"),
        ({"colour": "red"}, "unknown field 'colour'"),
    ],
)
def test_a_bad_document_is_refused(changes, fault):
    with pytest.raises(errors.ValidationFailed, match=fault):
        made(document(**changes))


@pytest.mark.parametrize(
    "pre, fault",
    [
        ({"proposalWhen": "results.x == 1"}, "unknown name 'results'"),
        ({"proposalWhen": "proposal.a =="}, "proposalWhen"),
        ({"actionClass": "delete-everything"}, "actionClass"),
        ({"approverRole": "Operator"}, "approverRole"),
        ({"expiresAt": T0.isoformat()}, "in the future"),
        ({"expiresAt": "2027-01-01T00:00:00"}, "offset"),
        ({"maxUses": 0}, "maxUses"),
        ({"proposalSchema": {"minimum": "x"}}, "minimum"),
    ],
)
def test_a_bad_pre_approval_is_refused(pre, fault):
    base = document()["preApprovals"][0]
    with pytest.raises(errors.ValidationFailed, match=fault):
        made(document(preApprovals=[{**base, **pre}]))


def test_the_decisions_metric_names_who_decided():
    from actors.metrics import decided_by

    assert decided_by(active().reference) == "template"
    assert decided_by("approval-expiry-reconciler") == "expiry"
    assert decided_by("rita") == "human"
    assert decided_by(f"replay:{T0:%Y}") == "replay"
