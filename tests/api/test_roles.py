"""Roles mean something: the role table decides, together with the token's scopes, what a
caller may do. A token's scopes beyond its roles' are ignored, so minting one cannot widen it."""

from __future__ import annotations

import pytest
from api_harness import PROJECT, TenantView, assert_problem, decision

from runcontrol.api.auth import ALL_SCOPES
from runcontrol.domain import Role

OTHER_PROJECT = "proj-2"


def test_an_observer_reads_but_never_submits_cancels_or_decides(t: TenantView) -> None:
    t.publish()
    run_id = t.submit()
    for scopes in (None, ALL_SCOPES):  # the role's own scopes, or every scope there is
        observer = t.user("olga", Role.OBSERVER, scopes=scopes)
        assert observer.get(f"/factory/runs/{run_id}").status_code == 200
        assert observer.get("/factory/approvals").status_code == 200
        submitted = observer.post(
            "/factory/runs", json=t.body(), headers={"Idempotency-Key": "olga"}
        )
        assert_problem(submitted, 403, "insufficient-scope")
        cancelled = observer.post(f"/factory/runs/{run_id}/cancel", json={"reason": "no"})
        assert_problem(cancelled, 403, "insufficient-scope")
    assert t.run(run_id)["state"] != "Cancelling"
    listed = t.requester().get("/factory/runs").json()["items"]
    assert [r["runId"] for r in listed] == [run_id]


def test_a_requester_never_decides_even_with_the_decide_scope(t: TenantView) -> None:
    run_id, _, approval = t.waiting_for_approval()
    other_requester = t.user("erin", Role.REQUESTER, scopes=ALL_SCOPES)  # not the run's requester
    response = other_requester.post(
        f"/factory/approvals/{approval['approvalId']}/decision", json=decision(approval)
    )
    body = assert_problem(response, 403, "insufficient-scope")
    assert "factory.approvals.decide" in body["detail"]
    assert t.run(run_id)["state"] == "WaitingForApproval"


def test_an_operator_cancels_any_run_of_the_tenant_but_never_submits(
    t: TenantView,
) -> None:
    t.publish()
    run_id = t.submit()  # in PROJECT
    operator = t.api.client(t.token("oscar", Role.OPERATOR, project=OTHER_PROJECT))
    with operator:
        assert operator.get(f"/factory/runs/{run_id}").json()["projectId"] == PROJECT
        assert [r["runId"] for r in operator.get("/factory/runs").json()["items"]] == [run_id]
        cancelled = operator.post(f"/factory/runs/{run_id}/cancel", json={"reason": "stuck"})
        assert cancelled.status_code == 202, cancelled.text
        assert t.wait_state(run_id, "Cancelled", "Cancelling")["state"] in (
            "Cancelled",
            "Cancelling",
        )

        submitted = operator.post(
            "/factory/runs", json=t.body(), headers={"Idempotency-Key": "oscar"}
        )
        body = assert_problem(submitted, 403, "forbidden")
        assert "SubmitRun" in body["detail"]


def test_an_operator_never_decides(t: TenantView) -> None:
    _, _, approval = t.waiting_for_approval()
    with t.api.client(t.token("oscar", Role.OPERATOR, scopes=ALL_SCOPES)) as operator:
        response = operator.post(
            f"/factory/approvals/{approval['approvalId']}/decision", json=decision(approval)
        )
    assert_problem(response, 403, "insufficient-scope")


@pytest.mark.parametrize(
    ("role", "status"),
    [(Role.WORKER, 403), ("Superuser", 403), (Role.REQUESTER, 200)],
)
def test_only_known_roles_with_an_http_operation_get_in(
    t: TenantView, role: str, status: int
) -> None:
    # A Worker's token (scope factory.runtime) is for the runtime calls, not the HTTP API; an
    # unknown role grants nothing whatever scopes the token claims.
    with t.api.client(t.token("w", role, scopes=ALL_SCOPES)) as http:
        response = http.get("/factory/runs")
    assert response.status_code == status, response.text
    if status == 403:
        assert_problem(response, 403, "insufficient-scope")
