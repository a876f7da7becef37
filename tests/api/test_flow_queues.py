"""Flow control over HTTP, with the run hosts, the scheduler's sweep and a worker (issue 21):
a repository gets one apply run at a time (checked from the stored attempts' intervals) while
another repository's run goes on; the held run says why and ``GET /factory/queues`` shows the
key; the sweep releases it when the slot frees, with no poll in between. Publication refuses a
bad key expression (422, its position), submission an input without the key's field (422) and
a priority above 3 without the operations scope (403)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

from api_harness import TenantView, assert_problem, wait_until
from sqlalchemy import select

from runcontrol import reconcilers
from runcontrol.cli import main
from runcontrol.commands import ReportOutcome
from runcontrol.domain import AttemptOutcome, Role, canonical_hash
from runcontrol.store.tables import attempts, audit_log, cancellation_intents


def publish(t: TenantView, **limit: Any) -> None:
    definition = {
        "workflowId": t.workflow,
        "concurrency": [{"key": "input.repository", "limit": 1, **limit}],
        "steps": [{"name": "apply", "agentId": t.agent}],
    }
    admin = t.user("admin", Role.WORKSPACE_ADMIN)
    response = admin.post("/factory/releases", json={"definition": definition})
    assert response.status_code == 201, response.text


def submit(t: TenantView, repository: str, **body: Any) -> str:
    response = t.requester().post(
        "/factory/runs",
        json=t.body(input={"repository": repository}, **body),
        headers={"Idempotency-Key": f"k-{uuid.uuid4().hex}"},
    )
    assert response.status_code == 202, response.text
    return str(response.json()["runId"])


def claim_any(t: TenantView) -> Any:
    claim = t._call(t.runtime.client.claim([t.agent], f"worker-{t.tenant}", 15.0))
    assert claim is not None, "no attempt became claimable"
    return claim


def stored_attempts(t: TenantView, run_id: str) -> list[Any]:
    with t.runtime.container.db.tenant(t.tenant) as conn:
        return list(conn.execute(select(attempts).where(attempts.c.run_id == run_id)))


def test_one_apply_run_per_repository_released_by_the_sweep(t: TenantView, capsys, monkeypatch):
    publish(t)
    first = submit(t, "repo-x")
    second = submit(t, "repo-x")
    other = submit(t, "repo-y")
    claims = {str(c.run_id): c for c in (claim_any(t), claim_any(t))}
    assert set(claims) == {first, other}  # repo-y runs meanwhile

    held = t.run(second)
    (step,) = held["steps"]
    assert held["state"] == "Running" and step["attempts"] == []
    assert step["heldReason"] == "concurrency-key repo-x 1/1"
    assert step["held"]["kind"] == "concurrency"
    queues = t.requester().get("/factory/queues")
    assert queues.status_code == 200, queues.text
    by_key = {q["key"]: q for q in queues.json()["items"]}
    assert by_key["repo-x"]["holders"] == 1 and by_key["repo-x"]["waiting"] == 1
    assert by_key["repo-x"]["oldestWaitingSeconds"] >= 0
    assert by_key["repo-y"]["holders"] == 1 and by_key["repo-y"]["waiting"] == 0
    # the gauge's sample (runcontrol_flow_waiting_runs{tenant,kind,name})
    sample = reconcilers.sample_gauges(t.runtime.container.db, datetime.now(UTC))
    waiting, age = sample.flow_waiting[(t.tenant, "concurrency", t.workflow)]
    assert waiting == 1 and age >= 0
    # the CLI, on the same API
    monkeypatch.setenv("RUNCONTROL_URL", t.api.base_url)
    monkeypatch.setenv("RUNCONTROL_TOKEN", t.token())
    assert main(["queues"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["KIND", "NAME", "KEY", "HOLDERS", "WAITING", "OLDEST", "WAIT"]
    assert lines[1].split()[:5] == ["concurrency", t.workflow, "repo-x", "1/1", "1"]
    assert main(["runs", "show", second]) == 0
    assert "Pending (held: concurrency-key repo-x 1/1)" in capsys.readouterr().out

    t.succeed(claims[first])
    t.wait_state(first, "Completed")
    released = claim_any(t)  # the slot's release made the run due: the sweep dispatched it
    assert str(released.run_id) == second
    t.succeed(released)
    t.succeed(claims[other])
    for run_id in (second, other):
        t.wait_state(run_id, "Completed")

    (a,) = stored_attempts(t, first)
    (b,) = stored_attempts(t, second)
    (c,) = stored_attempts(t, other)
    assert a.settled_at <= b.dispatched_at  # never overlapping on repo-x
    assert c.dispatched_at < a.settled_at  # repo-y overlapped repo-x's run
    assert wait_until(lambda: t.requester().get("/factory/queues").json()["items"] == [])


def test_refusals_at_publication_and_submission(t: TenantView):
    admin = t.user("admin", Role.WORKSPACE_ADMIN)
    bad = {
        "workflowId": t.workflow,
        "concurrency": [{"key": "input.repository +", "limit": 1}],
        "steps": [{"name": "apply", "agentId": t.agent}],
    }
    body = assert_problem(admin.post("/factory/releases", json={"definition": bad}), 422)
    assert body["position"] == 18
    publish(t)
    missing = t.requester().post(
        "/factory/runs",
        json=t.body(input={"revision": "abc"}),
        headers={"Idempotency-Key": "no-repository"},
    )
    assert "input.repository" in assert_problem(missing, 422)["detail"]
    assert t.requester().get("/factory/runs").json()["items"] == []
    urgent = t.requester().post(
        "/factory/runs",
        json=t.body(input={"repository": "r"}, priority=5),
        headers={"Idempotency-Key": "urgent"},
    )
    assert_problem(urgent, 403)
    run_id = submit(t, "r", priority=2)  # lowering needs nothing more
    assert t.run(run_id)["priority"] == 2


def test_cancel_oldest_cancels_the_holder_through_the_host(t: TenantView):
    publish(t, strategy="cancel-oldest")
    oldest = submit(t, "repo-x")
    claim = claim_any(t)
    assert str(claim.run_id) == oldest
    newest = submit(t, "repo-x")
    cancelling = t.wait_state(oldest, "Cancelling")  # the host's CancelRun, after the commit
    assert cancelling["state"] == "Cancelling"
    t._call(
        t.runtime.client.send(
            ReportOutcome(
                **claim.fenced(),
                outcome=AttemptOutcome.CANCELLED,
                outcome_hash=canonical_hash({"stopped": 1}),
            )
        )
    )
    t.wait_state(oldest, "Cancelled")
    released = claim_any(t)
    assert str(released.run_id) == newest
    t.succeed(released)
    t.wait_state(newest, "Completed")
    with t.runtime.container.db.tenant(t.tenant) as conn:
        (intent,) = conn.execute(
            select(cancellation_intents).where(cancellation_intents.c.run_id == oldest)
        ).all()
        (audit,) = conn.execute(
            select(audit_log).where(
                audit_log.c.run_id == newest, audit_log.c.kind == "flow.cancel-oldest"
            )
        ).all()
    assert intent.requested_by == "run-control" and "cancel-oldest" in intent.reason
    assert audit.detail["holder_runs"] == oldest
