"""Project scope: inside one tenant, a caller sees and changes only its own project's runs,
approvals and events, unless a role spans the tenant. Another project's run answers exactly
as an unknown run does (404), so its existence is not revealed."""

from __future__ import annotations

import uuid

import httpx
from api_harness import PROJECT, TenantView, assert_problem, decision
from sqlalchemy import text

from runcontrol.domain import Role
from runcontrol.store import Database

OTHER = "proj-2"


def _as(t: TenantView, subject: str, role: Role, project: str = OTHER) -> httpx.Client:
    return t.api.client(t.token(subject, role, project=project))


def _same_404(http: httpx.Client, path: str, method: str = "GET", **kw: object) -> None:
    """``path`` of a real run of another project answers like that of an unknown run."""
    unknown = path.replace(path.split("/")[3], str(uuid.uuid4()))
    seen = assert_problem(http.request(method, path, **kw), 404)  # type: ignore[arg-type]
    never = assert_problem(http.request(method, unknown, **kw), 404)  # type: ignore[arg-type]
    assert seen["code"] == never["code"]
    assert seen["title"] == never["title"]


def test_another_projects_runs_are_invisible_to_project_roles(t: TenantView) -> None:
    t.publish()
    run_id = t.submit()  # PROJECT
    for role in (Role.REQUESTER, Role.OBSERVER, Role.REVIEWER):
        with _as(t, f"x-{role}", role) as http:
            _same_404(http, f"/factory/runs/{run_id}")
            _same_404(http, f"/factory/runs/{run_id}/events/history")
            _same_404(http, f"/factory/runs/{run_id}/events")
            assert http.get("/factory/runs").json()["items"] == []
    with _as(t, "mine", Role.OBSERVER, project=PROJECT) as http:
        assert [r["runId"] for r in http.get("/factory/runs").json()["items"]] == [run_id]
        assert http.get(f"/factory/runs/{run_id}/events/history").json()


def test_another_projects_requester_cannot_cancel(t: TenantView) -> None:
    t.publish()
    run_id = t.submit()
    with _as(t, "mallory", Role.REQUESTER) as http:
        _same_404(http, f"/factory/runs/{run_id}/cancel", "POST", json={"reason": "mine now"})
    assert t.run(run_id)["state"] not in ("Cancelling", "Cancelled")
    # Its own project's requesters may, not only the one who submitted it.
    with _as(t, "colleague", Role.REQUESTER, project=PROJECT) as http:
        cancelled = http.post(f"/factory/runs/{run_id}/cancel", json={"reason": "ours"})
    assert cancelled.status_code == 202, cancelled.text


def test_another_projects_approvals_are_neither_listed_nor_decidable(t: TenantView) -> None:
    run_id, _, approval = t.waiting_for_approval()
    path = f"/factory/approvals/{approval['approvalId']}/decision"
    with _as(t, "rex", Role.REVIEWER) as reviewer:
        assert reviewer.get("/factory/approvals").json()["items"] == []
        refused = assert_problem(reviewer.post(path, json=decision(approval)), 404)
        assert refused["code"] == "approval-not-found"
    assert t.run(run_id)["state"] == "WaitingForApproval"
    listed = t.reviewer().get("/factory/approvals").json()["items"]
    assert [a["approvalId"] for a in listed] == [approval["approvalId"]]


def test_tenant_wide_roles_see_and_act_across_projects(t: TenantView) -> None:
    run_id, _, approval = t.waiting_for_approval()
    for role in (Role.OPERATOR, Role.WORKSPACE_ADMIN, Role.PLATFORM_ADMIN):
        with _as(t, f"x-{role}", role) as http:
            assert http.get(f"/factory/runs/{run_id}").status_code == 200
            assert [r["runId"] for r in http.get("/factory/runs").json()["items"]] == [run_id]
            listed = http.get("/factory/approvals").json()["items"]
            assert [a["approvalId"] for a in listed] == [approval["approvalId"]]
    with _as(t, "wanda", Role.WORKSPACE_ADMIN) as admin:
        path = f"/factory/approvals/{approval['approvalId']}/decision"
        decided = admin.post(path, json=decision(approval))
    assert decided.status_code == 200, decided.text
    assert decided.json()["decidedBy"] == "wanda"


def test_the_database_itself_hides_another_projects_runs_and_events(
    t: TenantView, db: Database
) -> None:
    """Row-level security (migration 0008): a project-scoped transaction, as the HTTP edge opens
    for project roles, sees no other project's runs or events even with no WHERE clause."""
    t.publish()
    run_id = t.submit()
    t.wait_state(run_id, "Running", "Accepted")

    def visible(project_id: str | None) -> tuple[list[str], int]:
        with db.tenant(t.tenant, project_id=project_id) as conn:
            runs = [str(r) for r in conn.execute(text("SELECT run_id FROM runs")).scalars()]
            events = conn.execute(text("SELECT count(*) FROM outbox")).scalar_one()
        return runs, int(events)

    assert visible(None)[0] == [run_id] and visible(None)[1] > 0
    assert visible(PROJECT) == visible(None)
    assert visible(OTHER) == ([], 0)
