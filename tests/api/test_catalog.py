"""The workflow catalog over real HTTP (issue 22 item 5): a WorkspaceAdmin publishes a release
and it runs; a Requester may not; an invalid graph is a 422 naming the problem and publishes
nothing; a moved alias changes only later submissions; a run's graph; ``Prefer: wait``."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from api_harness import TenantView, assert_problem

from runcontrol import cli
from runcontrol.domain import Role


def admin(t: TenantView):
    return t.user("wanda", Role.WORKSPACE_ADMIN)


def definition(t: TenantView, *steps: dict[str, Any]) -> dict[str, Any]:
    return {"workflowId": t.workflow, "steps": [dict(s, agentId=t.agent) for s in steps]}


def submit(t: TenantView, **headers: str) -> Any:
    return t.requester().post(
        "/factory/runs",
        json=t.body(),
        headers={"Idempotency-Key": f"key-{uuid.uuid4().hex}", **headers},
    )


def test_a_release_published_by_a_workspace_admin_runs(t: TenantView) -> None:
    body = {"definition": definition(t, {"name": "only"})}
    published = admin(t).post("/factory/releases", json=body)
    assert published.status_code == 201, published.text
    release = published.json()
    assert release["workflowId"] == t.workflow and release["aliases"] == ["latest"]
    assert release["graph"] == {
        "nodes": [{"name": "only", "agentId": t.agent, "dependsOn": []}],
        "edges": [],
    }
    again = admin(t).post("/factory/releases", json=body)  # same content, same release
    assert again.json()["releaseId"] == release["releaseId"]
    run_id = t.submit()
    assert t.run(run_id)["releaseId"] == release["releaseId"]
    t.succeed(t.claim(run_id))
    assert t.wait_state(run_id, "Completed")["state"] == "Completed"


@pytest.mark.parametrize("role", [Role.REQUESTER, Role.REVIEWER, Role.OPERATOR, Role.OBSERVER])
def test_only_admins_publish(t: TenantView, role: Role) -> None:
    body = {"definition": definition(t, {"name": "only"})}
    response = t.user("someone", role).post("/factory/releases", json=body)
    assert_problem(response, 403, "insufficient-scope")
    assert_problem(t.requester().get(f"/factory/workflows/{t.workflow}"), 404)


@pytest.mark.parametrize(
    ("steps", "detail"),
    [
        ([{"name": "a", "dependsOn": ["ghost"]}], {"step": "a", "unknown": "ghost"}),
        (
            [{"name": "a", "dependsOn": ["b"]}, {"name": "b"}],
            {"cycle": "a -> b -> a"},
        ),
    ],
)
def test_an_invalid_graph_is_refused_naming_it_and_nothing_is_published(
    t: TenantView, steps: list[dict[str, Any]], detail: dict[str, Any]
) -> None:
    response = admin(t).post("/factory/releases", json={"definition": definition(t, *steps)})
    problem = assert_problem(response, 422, "validation-failed")
    for key, value in detail.items():
        assert problem[key] == value, problem
    assert_problem(t.requester().get(f"/factory/workflows/{t.workflow}"), 404)
    listed = t.requester().get("/factory/workflows").json()["items"]
    assert t.workflow not in [w["workflowId"] for w in listed]


def test_a_moved_alias_changes_only_later_submissions(t: TenantView) -> None:
    first = (
        admin(t)
        .post("/factory/releases", json={"definition": definition(t, {"name": "one"})})
        .json()
    )
    second = (
        admin(t)
        .post(
            "/factory/releases",
            json={"definition": definition(t, {"name": "two"}), "aliases": ["next"]},
        )
        .json()
    )
    before = t.submit()
    assert t.run(before)["releaseId"] == first["releaseId"]
    moved = admin(t).put(
        f"/factory/workflows/{t.workflow}/aliases/latest",
        json={"releaseId": second["releaseId"]},
    )
    assert moved.status_code == 200, moved.text
    assert sorted(moved.json()["aliases"]) == ["latest", "next"]
    after = t.submit()
    assert t.run(after)["releaseId"] == second["releaseId"]
    assert t.run(before)["releaseId"] == first["releaseId"]  # accepted runs keep theirs
    workflow = t.requester().get(f"/factory/workflows/{t.workflow}").json()
    assert workflow["aliases"] == {"latest": second["releaseId"], "next": second["releaseId"]}
    assert {r["releaseId"] for r in workflow["releases"]} == {
        first["releaseId"],
        second["releaseId"],
    }
    unknown = admin(t).put(
        f"/factory/workflows/{t.workflow}/aliases/latest", json={"releaseId": "nope@1"}
    )
    assert_problem(unknown, 404)
    requester = t.requester().put(
        f"/factory/workflows/{t.workflow}/aliases/latest", json={"releaseId": first["releaseId"]}
    )
    assert_problem(requester, 403)


def test_a_runs_graph_shows_each_steps_state_attempts_and_dependencies(t: TenantView) -> None:
    steps = [
        {"name": "plan"},
        {"name": "a", "dependsOn": ["plan"]},
        {"name": "b", "dependsOn": ["plan"]},
        {"name": "join", "dependsOn": ["a", "b"]},
    ]
    admin(t).post("/factory/releases", json={"definition": definition(t, *steps)})
    run_id = t.submit()
    t.succeed(t.claim(run_id))
    t.wait_state(run_id, "Running")
    graph = t.requester().get(f"/factory/runs/{run_id}/graph")
    assert graph.status_code == 200, graph.text
    nodes = {n["name"]: n for n in graph.json()["nodes"]}
    assert nodes["plan"]["state"] == "Succeeded"
    assert nodes["plan"]["attempts"][0]["state"] == "Succeeded"
    assert {nodes["a"]["state"], nodes["b"]["state"]} == {"Running"}  # dispatched together
    assert nodes["join"]["state"] == "Pending" and nodes["join"]["dependsOn"] == ["a", "b"]
    assert {(e["from"], e["to"]) for e in graph.json()["edges"]} == {
        ("plan", "a"),
        ("plan", "b"),
        ("a", "join"),
        ("b", "join"),
    }
    assert t.run(run_id)["steps"][3]["dependsOn"] == ["a", "b"]
    other = t.api.client(t.api.token(f"other-{uuid.uuid4().hex[:6]}"))
    try:
        assert_problem(other.get(f"/factory/runs/{run_id}/graph"), 404)
    finally:
        other.close()


def test_prefer_wait_answers_with_the_terminal_run_or_the_usual_202(t: TenantView) -> None:
    admin(t).post("/factory/releases", json={"definition": definition(t, {"name": "only"})})
    pending = submit(t, Prefer="wait=1")
    assert pending.status_code == 202, pending.text  # nobody works on it: not within the wait
    run_id = pending.json()["runId"]
    assert t.run(run_id)["state"] in ("Accepted", "Running")
    t.succeed(t.claim(run_id))
    t.wait_state(run_id, "Completed")
    # The same key again is the same run, now terminal: answered within the wait.
    key = f"key-{uuid.uuid4().hex}"
    first = t.requester().post("/factory/runs", json=t.body(), headers={"Idempotency-Key": key})
    t.succeed(t.claim(first.json()["runId"]))
    t.wait_state(first.json()["runId"], "Completed")
    done = t.requester().post(
        "/factory/runs", json=t.body(), headers={"Idempotency-Key": key, "Prefer": "wait=5"}
    )
    assert done.status_code == 200, done.text
    assert done.headers["Preference-Applied"] == "wait"
    assert done.json()["state"] == "Completed" and done.json()["runId"] == first.json()["runId"]


@pytest.mark.parametrize("prefer", ["wait=inf", "wait=1e309", "wait=nan", "wait=5, " + "x" * 300])
def test_a_preference_the_server_cannot_honour_is_ignored(t: TenantView, prefer: str) -> None:
    """Issue 34: ``wait=inf`` waited the whole cap (30 s) and a Prefer header over 200
    characters refused the submission (422); both are ignored (RFC 7240): the usual 202."""
    admin(t).post("/factory/releases", json={"definition": definition(t, {"name": "only"})})
    started = time.monotonic()
    response = submit(t, Prefer=prefer)
    assert response.status_code == 202, response.text
    assert "Preference-Applied" not in response.headers
    assert time.monotonic() - started < 10  # not the 30 s cap


def test_the_cli_publishes_through_the_api_with_url(
    t: TenantView, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    file = tmp_path / "wf.json"
    file.write_text(json.dumps(definition(t, {"name": "a"}, {"name": "b", "dependsOn": []})))
    token = t.token("wanda", Role.WORKSPACE_ADMIN)
    url = ["--url", t.api.base_url, "--token", token]
    assert cli.main(["release", str(file), *url]) == 0
    printed = json.loads(capsys.readouterr().out)
    workflow = t.requester().get(f"/factory/workflows/{t.workflow}").json()
    assert workflow["aliases"] == {"latest": printed["releaseId"]}
    refused = ["--url", t.api.base_url, "--token", t.token()]  # a Requester's
    assert cli.main(["release", str(file), *refused]) == 1
    err = capsys.readouterr().err
    assert "403" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
