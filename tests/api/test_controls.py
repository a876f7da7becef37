"""Run controls over real HTTP (issue 14): suspend, resume, retry a step, resolve an Uncertain
attempt, rerun a finished run. For each: the run before and after, the audit row (caller and
reason), the journal entry and outbox event, the refusals (roles, a missing reason, the wrong
state), and idempotency on ``Idempotency-Key``."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
import pytest
from api_harness import TenantView, assert_problem
from support import run_rows

from runcontrol.client import Claim
from runcontrol.commands import ReportOutcome
from runcontrol.domain import AttemptOutcome, FailureClass, Role, SideEffectClass
from runcontrol.store import Database
from runcontrol.store.tables import audit_log, recovery_journal

OPERATOR = "olga"
REASON = "incident 42"


def operator(t: TenantView) -> httpx.Client:
    return t.user(OPERATOR, Role.OPERATOR)


def post(client: httpx.Client, path: str, key: str | None = None, **body: Any) -> httpx.Response:
    headers = {"Idempotency-Key": key} if key else {}
    return client.post(path, json={"reason": REASON, **body}, headers=headers)


def report(t: TenantView, claim: Claim, outcome: AttemptOutcome, **kw: Any) -> Any:
    return asyncio.run(
        t.runtime.client.send(ReportOutcome(**claim.fenced(), outcome=outcome, **kw))
    )


def audits(db: Database, t: TenantView, run_id: str, kind: str) -> list[Any]:
    rows = run_rows(db, t.tenant, audit_log, uuid.UUID(run_id), audit_log.c.id)
    return [r for r in rows if r.kind == kind]


def causes(db: Database, t: TenantView, run_id: str) -> list[str]:
    rows = run_rows(db, t.tenant, recovery_journal, uuid.UUID(run_id))
    return [r.cause for r in rows]


def events(t: TenantView, run_id: str, event_type: str) -> list[dict[str, Any]]:
    history = t.requester().get(f"/factory/runs/{run_id}/events/history").json()
    return [e for e in history if e["type"] == event_type]


def test_suspend_and_resume(t: TenantView, db: Database) -> None:
    t.publish()
    run_id = t.submit()
    before = t.run(run_id)
    assert (before["state"], before["suspended"], before["suspendedAt"]) == ("Running", False, None)
    path = f"/factory/runs/{run_id}"

    answer = post(operator(t), f"{path}/suspend", key="s-1")
    assert answer.status_code == 200, answer.text
    assert answer.json()["suspended"] is True and answer.json()["state"] == "Running"
    resent = post(operator(t), f"{path}/suspend", key="s-1")  # the first answer, no 409
    assert resent.status_code == 200 and resent.json() == answer.json()

    after = t.run(run_id)
    assert after["suspended"] is True and after["suspendedAt"] is not None
    (row,) = audits(db, t, run_id, "run-suspended")
    assert (row.actor, row.detail["reason"]) == (OPERATOR, REASON)
    assert "SuspendRequested" in causes(db, t, run_id)
    (event,) = events(t, run_id, "RunSuspended")
    assert (event["payload"]["requestedBy"], event["payload"]["reason"]) == (OPERATOR, REASON)
    # its dispatched attempt waits: a claim passes over it
    assert asyncio.run(t.runtime.client.claim([t.agent], "worker-x", 0)) is None
    assert_problem(post(operator(t), f"{path}/suspend"), 409, "run-suspended")

    admin = t.user("wanda", Role.WORKSPACE_ADMIN)
    resumed = post(admin, f"{path}/resume", reason="incident over")
    assert resumed.status_code == 200, resumed.text
    assert resumed.json()["suspended"] is False and not t.run(run_id)["suspended"]
    assert audits(db, t, run_id, "run-resumed")[0].actor == "wanda"
    assert len(events(t, run_id, "RunResumed")) == 1
    assert_problem(post(admin, f"{path}/resume"), 409, "run-not-suspended")
    t.succeed(t.claim(run_id))
    t.wait_state(run_id, "Completed")
    assert_problem(post(admin, f"{path}/suspend"), 409, "run-terminal")


def test_retry_a_step_while_suspended_then_resume(t: TenantView, db: Database) -> None:
    t.publish()
    run_id = t.submit()
    first = t.claim(run_id)
    path = f"/factory/runs/{run_id}"
    step_id = t.run(run_id)["steps"][0]["stepId"]
    # the attempt is leased: nothing to retry yet
    assert_problem(post(operator(t), f"{path}/steps/{step_id}/retry"), 409, "illegal-transition")
    assert post(operator(t), f"{path}/suspend").status_code == 200
    report(t, first, AttemptOutcome.FAILED, failure_class=FailureClass.TRANSIENT)  # in hand
    (step,) = t.run(run_id)["steps"]
    assert step["state"] == "Pending" and len(step["attempts"]) == 1  # no automatic retry

    retried = post(operator(t), f"{path}/steps/{step_id}/retry")
    assert retried.status_code == 200, retried.text
    assert (retried.json()["stepId"], retried.json()["attemptId"]) == (step_id, None)
    (row,) = audits(db, t, run_id, "step-retry")
    assert (row.actor, row.detail["reason"]) == (OPERATOR, REASON)
    assert events(t, run_id, "StepRetryRequested")[0]["payload"]["nextAttemptNumber"] == 2

    assert post(operator(t), f"{path}/resume").status_code == 200
    second = t.claim(run_id)
    assert second.attempt_id != first.attempt_id
    assert second.fencing_token > first.fencing_token
    t.succeed(second)
    t.wait_state(run_id, "Completed")
    assert_problem(post(operator(t), f"{path}/steps/{step_id}/retry"), 409, "run-terminal")
    assert_problem(post(operator(t), f"{path}/steps/{uuid.uuid4()}/retry"), 404, "step-not-found")


def test_resolve_an_uncertain_attempt_and_rerun_the_failed_run(t: TenantView, db: Database):
    t.publish(side_effect=SideEffectClass.SHARED_WRITE)
    run_id = t.submit()
    claim = t.claim(run_id)
    path = f"/factory/runs/{run_id}"
    attempt = f"{path}/attempts/{claim.attempt_id}/resolve"
    assert_problem(post(operator(t), attempt, outcome="Succeeded"), 409, "illegal-transition")
    report(t, claim, AttemptOutcome.UNCERTAIN)  # shared-write: surfaced, the run fails
    before = t.wait_state(run_id, "Failed")
    assert before["failureClass"] == "uncertain"
    assert before["steps"][0]["attempts"][0]["state"] == "Uncertain"

    resolved = post(operator(t), attempt, outcome="Succeeded")
    assert resolved.status_code == 200, resolved.text
    assert (resolved.json()["state"], resolved.json()["attemptState"]) == ("Failed", "Succeeded")
    assert t.run(run_id)["steps"][0]["attempts"][0]["outcome"] == "Succeeded"
    (row,) = audits(db, t, run_id, "attempt-resolved")
    assert (row.actor, row.detail["reason"], row.detail["outcome"]) == (
        OPERATOR,
        REASON,
        "Succeeded",
    )
    assert "OperatorResolved" in causes(db, t, run_id)
    (event,) = events(t, run_id, "AttemptOutcomeResolved")
    assert (event["payload"]["fromOutcome"], event["payload"]["outcome"]) == (
        "Uncertain",
        "Succeeded",
    )
    assert_problem(post(operator(t), attempt, outcome="Failed"), 409, "illegal-transition")
    assert_problem(post(operator(t), attempt, outcome="Cancelled"), 422)

    rerun = post(operator(t), f"{path}/rerun", key="r-1", release="pinned")
    assert rerun.status_code == 201, rerun.text
    new_id = rerun.json()["runId"]
    assert rerun.headers["Location"] == f"/factory/runs/{new_id}"
    assert (rerun.json()["rerunOf"], rerun.json()["created"]) == (run_id, True)
    again = post(operator(t), f"{path}/rerun", key="r-1", release="pinned")
    assert again.status_code == 201 and again.json()["runId"] == new_id
    assert again.json()["created"] is False
    new = t.run(new_id)
    assert (new["rerunOf"], new["input"], new["releaseId"]) == (
        run_id,
        before["input"],
        before["releaseId"],
    )
    (row,) = audits(db, t, new_id, "run-rerun")
    assert (row.actor, row.detail["reason"], row.detail["release"]) == (OPERATOR, REASON, "pinned")
    assert events(t, new_id, "RunRerun")[0]["payload"]["rerunOf"] == run_id
    assert_problem(post(operator(t), f"/factory/runs/{new_id}/rerun"), 409, "run-not-finished")

    t.publish(side_effect=SideEffectClass.READ)  # the alias moves to a new release
    current = post(operator(t), f"{path}/rerun", release="current")
    assert current.status_code == 201, current.text
    assert current.json()["releaseId"] != before["releaseId"]
    assert t.run(current.json()["runId"])["rerunOf"] == run_id


@pytest.mark.parametrize("role", [Role.OBSERVER, Role.REQUESTER, Role.REVIEWER])
def test_roles_without_the_operate_scope_are_refused(t: TenantView, role: Role) -> None:
    t.publish()
    run_id = t.submit()
    path = f"/factory/runs/{run_id}"
    client = t.user(f"user-{role}", role)
    for control, body in (
        ("suspend", {}),
        ("resume", {}),
        (f"steps/{uuid.uuid4()}/retry", {}),
        (f"attempts/{uuid.uuid4()}/resolve", {"outcome": "Failed"}),
        ("rerun", {"release": "pinned"}),
    ):
        assert_problem(post(client, f"{path}/{control}", **body), 403, "insufficient-scope")
    # a token minted with the scope but no role that grants it: still refused
    forged = t.user("mallory", role, scopes=["factory.runs.operate", "factory.runs.read"])
    assert_problem(post(forged, f"{path}/suspend"), 403)
    assert not t.run(run_id)["suspended"]


def test_a_reason_is_required_and_unknown_runs_are_404(t: TenantView) -> None:
    t.publish()
    run_id = t.submit()
    path = f"/factory/runs/{run_id}"
    for control in ("suspend", "resume", f"steps/{uuid.uuid4()}/retry", "rerun"):
        assert_problem(operator(t).post(f"{path}/{control}", json={}), 422)
        assert_problem(operator(t).post(f"{path}/{control}", json={"reason": ""}), 422)
    assert_problem(
        operator(t).post(f"{path}/attempts/{uuid.uuid4()}/resolve", json={"outcome": "Succeeded"}),
        422,
    )
    assert_problem(post(operator(t), f"/factory/runs/{uuid.uuid4()}/suspend"), 404)
    assert_problem(post(operator(t), f"/factory/runs/{uuid.uuid4()}/rerun"), 404)
    platform = t.user("pat", Role.PLATFORM_ADMIN)
    assert post(platform, f"{path}/suspend").json()["suspended"] is True


def test_malformed_input_is_a_422_problem_and_changes_nothing(t: TenantView) -> None:
    t.publish()
    run_id = t.submit()
    path = f"/factory/runs/{run_id}"
    http = operator(t)
    for url, body in (
        ("/factory/runs/not-a-uuid/suspend", {"reason": REASON}),
        (f"{path}/steps/not-a-uuid/retry", {"reason": REASON}),
        (f"{path}/suspend", {"reason": "x" * 2001}),
        (f"{path}/suspend", {"reason": "nul \x00 inside"}),
        (f"{path}/suspend", {"reason": 42}),
        (f"{path}/rerun", {"reason": REASON, "release": "newest"}),
        (f"{path}/rerun", {"reason": REASON, "releaseAlias": ""}),
        (f"{path}/attempts/{uuid.uuid4()}/resolve", {"reason": REASON, "outcome": "Uncertain"}),
    ):
        assert_problem(http.post(url, json=body), 422)
    assert not t.run(run_id)["suspended"]
