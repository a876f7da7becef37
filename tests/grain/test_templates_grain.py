"""Run templates' pre-approvals through a real grain (issue 44): a template created by A and
approved by B lets C's run pass a shared-write step whose proposal fits, without a human, its
decision audited like a human one in the same transaction; a proposal outside waits; A's and
B's own runs wait; the (N+1)th use waits; an expired or revoked template pre-approves nothing."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import timedelta
from typing import Any

from grain_harness import SHARED, Harness
from support import SyncGrain, drive, held

from runcontrol.commands import RequestApproval, TemplateRef
from runcontrol.domain import ApprovalState, Decision, Role, RunState, StepSpec, canonical_hash
from runcontrol.domain import templates as rules
from runcontrol.store import templates as store
from runcontrol.store.tables import approval_decisions

AUTHOR, APPROVER, USER = "ann", "bob", "cid"
FITS = {"target": "deps", "files": 2}


def template(h: Harness, max_uses: int = 5, template_id: str = "nightly") -> rules.Template:
    """Created by AUTHOR, approved by APPROVER, stored in the tenant."""
    now = h.clock.now()
    doc = {
        "workflowId": "wf",
        "preApprovals": [
            {
                "actionClass": "shared-write",
                "proposalSchema": {"type": "object", "properties": {"files": {"maximum": 3}}},
                "proposalWhen": "proposal.target == 'deps'",
                "expiresAt": (now + timedelta(days=1)).isoformat(),
                "maxUses": max_uses,
            }
        ],
    }
    made = rules.from_dict(
        doc,
        tenant_id=h.tenant,
        project_id="proj-1",
        template_id=template_id,
        version=1,
        author=AUTHOR,
        now=now,
    )
    rules.decide(
        made,
        APPROVER,
        frozenset({Role.REVIEWER}),
        Decision.APPROVE,
        1,
        made.content_hash,
        None,
        now,
    )
    with h.db.tenant(h.tenant) as conn:
        store.insert(conn, made, now)
    return made


def asking(
    h: Harness, requester: str = USER, proposal: Any = FITS, t: str = "nightly"
) -> tuple[SyncGrain, RequestApproval]:
    """A run of the template's workflow by ``requester``, its shared-write step leased, and
    its request for approval of ``proposal``."""
    request = dataclasses.replace(h.request(), template=TemplateRef(t, 1))
    grain, _ = h.submit(request, requester)
    grant = h.lease(grain)
    return grain, RequestApproval(
        proposal_hash=canonical_hash(proposal), proposal=proposal, **held(grain, grant, {})
    )


def asks(h: Harness, requester: str = USER, proposal: Any = FITS, t: str = "nightly") -> Any:
    """``asking``, sent: answers the request and the run's grain."""
    grain, command = asking(h, requester, proposal, t)
    return grain.execute(command), grain


def test_a_fitting_proposal_of_another_requester_is_approved_by_the_template(h: Harness):
    h.publish(StepSpec("write", "agent-a", side_effect_class=SHARED))
    made = template(h)
    approval, grain = asks(h)
    assert approval.state is ApprovalState.APPROVED
    assert approval.decided_by == "template:nightly@1"
    assert h.load(grain.run_id).run.state is RunState.RUNNING
    (vote,) = h.rows(approval_decisions, grain.run_id)
    assert (vote.decided_by, vote.decision) == ("template:nightly@1", "approve")
    assert APPROVER in vote.reason
    # Audited like a human decision: the journal entry, the event and the audit, committed
    # with the decision.
    journal = [(j.entity, j.to_state, j.cause) for j in h.journal(grain.run_id)]
    assert ("ApprovalRequest", "Approved", "PreApprovedByTemplate") in journal
    assert h.event_types(grain.run_id)[-2:] == ["ApprovalRequested", "ApprovalDecided"]
    (audit,) = h.audits(grain.run_id, "template-pre-approval")
    assert audit.detail["approver"] == APPROVER
    with h.db.tenant(h.tenant) as conn:
        assert store.latest(conn, made.template_id) is not None
        assert store.latest(conn, made.template_id)[1] == 1  # type: ignore[index]


def test_what_a_template_does_not_cover_waits_for_a_human(h: Harness):
    h.publish(StepSpec("write", "agent-a", side_effect_class=SHARED))
    template(h, max_uses=1)
    outside, _ = asks(h, proposal={"target": "deps", "files": 9})
    assert outside.state is ApprovalState.PENDING
    for requester in (AUTHOR, APPROVER):  # the requester-never-approves rule, kept
        own, _ = asks(h, requester)
        assert own.state is ApprovalState.PENDING
    first, _ = asks(h)
    assert first.state is ApprovalState.APPROVED
    second, grain = asks(h)  # the (N+1)th use
    assert second.state is ApprovalState.PENDING
    assert h.load(grain.run_id).run.state is RunState.WAITING_FOR_APPROVAL
    (declined,) = h.audits(grain.run_id, "template-pre-approval-declined")
    assert "uses" in declined.detail["reason"]


def test_an_expired_or_revoked_template_pre_approves_nothing(h: Harness):
    h.publish(StepSpec("write", "agent-a", side_effect_class=SHARED))
    made = template(h)
    revoked = template(h, template_id="revoked")
    rules.revoke(revoked, "no")
    with h.db.tenant(h.tenant) as conn:
        store.save_state(conn, revoked, h.clock.now())
    assert asks(h, t="revoked")[0].state is ApprovalState.PENDING
    h.clock.advance(timedelta(days=1).total_seconds())
    assert asks(h, t=made.template_id)[0].state is ApprovalState.PENDING


def test_runs_deciding_at_once_never_pass_a_pre_approvals_max_uses(h: Harness):
    """Each run's grain reads the template's uses before it decides, without a lock: three
    runs asking at once all read none used. The statement writing a template's vote counts
    the use only under maxUses; the others' statements fail, they decide again on fresh uses
    and wait for a human."""
    h.publish(StepSpec("write", "agent-a", side_effect_class=SHARED))
    made = template(h, max_uses=1)
    racers = [asking(h) for _ in range(3)]

    async def at_once() -> list[Any]:
        return await asyncio.gather(*(g.grain.execute(c) for g, c in racers))

    answers = drive(at_once())
    states = sorted(str(a.state) for a in answers)
    assert states == ["Approved", "Pending", "Pending"]
    with h.db.tenant(h.tenant) as conn:
        assert store.latest(conn, made.template_id)[1] == 1  # type: ignore[index]
    for (grain, _), answer in zip(racers, answers, strict=True):
        if answer.state is ApprovalState.PENDING:
            assert h.load(grain.run_id).run.state is RunState.WAITING_FOR_APPROVAL
            assert not h.rows(approval_decisions, grain.run_id)
