"""Bulk decisions and bulk cancels over HTTP: each item is the single command, with its own
outcome, its own rules and its own audit."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from api_harness import (
    REVIEWER,
    TenantView,
    assert_problem,
    decision,
    proposal,
)
from sqlalchemy import func, select

from runcontrol.commands import RequestApproval
from runcontrol.domain import Role, errors
from runcontrol.store import Database
from runcontrol.store.tables import approval_decisions, audit_log

BULK = 200


def park_all(t: TenantView, count: int) -> None:
    """Claim ``count`` runs' attempts and ask for approval of proposal 1, a few workers at
    once; a lease lost on the way (2 s leases on a busy machine) is claimed again."""
    parked: set[uuid.UUID] = set()

    async def worker(n: int) -> None:
        while len(parked) < count:
            claim = await t.runtime.client.claim([t.agent], f"worker-{n}", 2.0)
            if claim is None:
                continue
            try:
                await t.runtime.client.send(
                    RequestApproval(**claim.fenced(), proposal_hash=proposal(1))
                )
            except errors.LeaseRejected:
                continue  # expired before it asked: dispatched again, claimed again
            parked.add(claim.run_id)

    async def every() -> None:
        await asyncio.wait_for(asyncio.gather(*(worker(n) for n in range(8))), 120)

    asyncio.run(every())


def pending(t: TenantView) -> dict[str, dict[str, Any]]:
    """The tenant's Pending approvals by run."""
    found: dict[str, dict[str, Any]] = {}
    cursor: str | None = None
    while True:
        params: dict[str, Any] = {"state": "Pending", "limit": 200}
        if cursor:
            params["cursor"] = cursor
        page = t.reviewer().get("/factory/approvals", params=params).json()
        found.update({a["runId"]: a for a in page["items"]})
        cursor = page["nextCursor"]
        if cursor is None:
            return found


def item(approval: dict[str, Any]) -> dict[str, Any]:
    return {"approvalId": approval["approvalId"], **decision(approval)}


def test_two_hundred_decisions_with_a_stale_an_expired_and_the_requesters_own(
    t: TenantView, db: Database
) -> None:
    t.publish(gate="approval")
    # The decider also requests runs: one of the 200 is its own, which it may never decide.
    decider = t.user(REVIEWER, Role.REQUESTER, Role.REVIEWER)
    t.publish_policy(expiry_hours=1 / 3600)  # one second, pinned by the next run only
    expiring = t.submit()
    t.publish_policy()
    own = t.submit(decider)
    others = [t.submit() for _ in range(BULK - 2)]
    park_all(t, BULK)
    approvals = pending(t)
    # The stale one: changes requested one by one, so its request went Stale.
    stale_run = others[0]
    changes = t.reviewer().post(
        f"/factory/approvals/{approvals[stale_run]['approvalId']}/decision",
        json=decision(approvals[stale_run], "request-changes", reason="redo"),
    )
    assert changes.status_code == 200, changes.text
    assert t.wait_state(expiring, "Failed")["failureClass"] == "cancellation"  # expired
    approvals[expiring] = (
        t.requester().get(f"/factory/runs/{expiring}/approvals").json()["items"][0]
    )
    assert set(approvals) == {expiring, own, *others}

    items = [item(approvals[run_id]) for run_id in [expiring, own, *others]]
    response = decider.post(
        "/factory/approvals/decisions", json={"items": items}, headers={"Idempotency-Key": "b1"}
    )
    assert response.status_code == 200, response.text
    body = response.json()
    outcomes = {o["approvalId"]: o for o in body["items"]}
    assert [o["approvalId"] for o in body["items"]] == [i["approvalId"] for i in items]
    assert body["counts"]["decided"] == BULK - 3
    refused = {
        run_id: outcomes[approvals[run_id]["approvalId"]] for run_id in (expiring, own, stale_run)
    }
    assert refused[expiring]["outcome"] == "expired"
    assert refused[own]["outcome"] == "forbidden"
    assert refused[own]["code"] == "separation-of-duties" and refused[own]["status"] == 403
    assert refused[stale_run]["outcome"] == "stale"
    assert all(o["code"] == "approval-gone" for o in (refused[expiring], refused[stale_run]))
    decided = [o for o in body["items"] if o["outcome"] == "decided"]
    assert {o["approval"]["state"] for o in decided} == {"Approved"}
    assert all(o["approval"]["decidedBy"] == REVIEWER for o in decided)

    # Audited: each decision recorded once, each refusal once with its reason.
    refused_ids = {o["approvalId"] for o in refused.values()}
    with db.tenant(t.tenant) as conn:
        votes = conn.execute(
            select(func.count())
            .select_from(approval_decisions)
            .where(approval_decisions.c.decided_by == REVIEWER)
        ).scalar_one()
        audits = conn.execute(
            select(audit_log.c.detail).where(audit_log.c.kind == "approval-decision-refused")
        ).all()
    assert votes == BULK - 3 + 1  # and the request-changes vote
    assert {a.detail["approval_id"] for a in audits} == refused_ids
    assert sorted(a.detail["code"] for a in audits) == [
        "approval-gone",
        "approval-gone",
        "separation-of-duties",
    ]

    # The same call again with its key: every item's first answer, nothing decided twice.
    again = decider.post(
        "/factory/approvals/decisions", json={"items": items}, headers={"Idempotency-Key": "b1"}
    )
    assert again.status_code == 200, again.text
    assert again.json()["counts"]["decided"] == BULK - 3
    with db.tenant(t.tenant) as conn:
        assert (
            conn.execute(select(func.count()).select_from(approval_decisions)).scalar_one() == votes
        )


def test_bulk_refusals_are_clear_and_store_nothing(t: TenantView, db: Database) -> None:
    run_id, _, approval = t.waiting_for_approval()
    url = "/factory/approvals/decisions"
    reviewer = t.reviewer()
    # Malformed bodies: 422 before anything is sent.
    assert_problem(reviewer.post(url, json={"items": []}), 422)
    assert_problem(reviewer.post(url, json={"items": [{"approvalId": "nope"}]}), 422)
    twice = {"items": [item(approval), item(approval)]}
    assert_problem(reviewer.post(url, json=twice), 422, "validation-failed")
    too_many = {"items": [item(approval)] * 501}
    assert_problem(reviewer.post(url, json=too_many), 422)
    # Without the decide scope: 403 for the whole call.
    assert_problem(t.requester().post(url, json={"items": [item(approval)]}), 403)
    # Another tenant's approval and an unknown one are each not-found, the rest decided.
    other = TenantView(t.api, t.runtime, f"t-other-{uuid.uuid4().hex[:8]}")
    try:
        foreign = other.reviewer().post(url, json={"items": [item(approval)]})
        assert foreign.status_code == 200, foreign.text
        assert foreign.json()["items"][0]["outcome"] == "not-found"
        assert foreign.json()["items"][0]["status"] == 404
    finally:
        other.close()
    unknown = {**item(approval), "approvalId": str(uuid.uuid4())}
    mixed = reviewer.post(url, json={"items": [unknown, item(approval)]})
    assert mixed.status_code == 200, mixed.text
    assert [o["outcome"] for o in mixed.json()["items"]] == ["not-found", "decided"]
    assert t.wait_state(run_id, "Running")["pendingApprovals"] == []


def test_bulk_cancel_of_an_explicit_list(t: TenantView) -> None:
    t.publish()
    runs = [t.submit() for _ in range(3)]
    unknown = str(uuid.uuid4())
    url = "/factory/runs/cancel"
    assert_problem(t.requester().post(url, json={"runIds": runs}), 422)  # no reason
    assert_problem(t.reviewer().post(url, json={"runIds": runs, "reason": "x"}), 403)
    other = TenantView(t.api, t.runtime, f"t-other-{uuid.uuid4().hex[:8]}")
    try:
        foreign = other.requester().post(url, json={"runIds": runs[:1], "reason": "x"})
        assert foreign.json()["items"][0]["outcome"] == "not-found"
    finally:
        other.close()
    assert t.run(runs[0])["state"] not in ("Cancelling", "Cancelled")

    response = t.requester().post(url, json={"runIds": [*runs, unknown], "reason": "cleanup"})
    assert response.status_code == 200, response.text
    body = response.json()
    assert [o["outcome"] for o in body["items"]] == ["accepted"] * 3 + ["not-found"]
    assert body["counts"]["accepted"] == 3 and body["counts"]["not-found"] == 1
    for run_id in runs:
        assert t.wait_state(run_id, "Cancelled")["state"] == "Cancelled"
