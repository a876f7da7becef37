"""Per-run events: SSE (live, resumable with Last-Event-ID, heartbeats, ends on a terminal
event) and the JSON history, both cursor-compatible."""

from __future__ import annotations

import time
import uuid
from typing import Any

from api_harness import (
    HEARTBEAT_S,
    Sse,
    SseReader,
    TenantView,
    assert_problem,
    decision,
    new_tenant,
)

TERMINAL = {"RunCompleted", "RunFailed", "RunCancelled"}


def history(t: TenantView, run_id: str, **params: Any) -> list[dict[str, Any]]:
    response = t.requester().get(f"/factory/runs/{run_id}/events/history", params=params)
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()
    return events


def assert_gap_free(events: list[Sse], start: int = 1) -> None:
    seqs = [e.id for e in events]
    assert seqs == list(range(start, start + len(seqs))), seqs
    assert all(e.data["seq"] == e.id and e.data["type"] == e.event for e in events)


def completed_run(t: TenantView) -> tuple[str, list[dict[str, Any]]]:
    """A one-step run taken to Completed, and all its events."""
    t.publish()
    run_id = t.submit()
    t.succeed(t.claim(run_id))
    t.wait_state(run_id, "Completed")
    return run_id, history(t, run_id)


def stream(t: TenantView, run_id: str, **headers: str) -> Any:
    return t.requester().stream(
        "GET", f"/factory/runs/{run_id}/events", headers=headers, timeout=30.0
    )


def test_live_stream_follows_the_run_and_ends_after_the_terminal_event(t: TenantView) -> None:
    t.publish()
    run_id = t.submit()
    already = t.run(run_id)["lastEventSeq"]
    with stream(t, run_id) as response:
        sse = SseReader(response)
        first = sse.read(stop_after=already)
        assert sse.retry_ms is not None
        t.succeed(t.claim(run_id))
        rest = sse.read()
    assert rest.ended
    events = first.events + rest.events
    assert_gap_free(events)
    assert events[0].event == "RunAccepted"
    assert events[-1].event == "RunCompleted"
    assert [e.event for e in events].count("RunCompleted") == 1
    assert [e.data for e in events] == history(t, run_id, limit=500)
    assert events[-1].data["runId"] == run_id
    assert events[-1].data["tenantId"] == t.tenant


def test_reconnecting_with_last_event_id_has_no_gap_and_no_duplicate(t: TenantView) -> None:
    t.publish(gate="approval")
    run_id = t.submit()
    seen: list[Sse] = []

    with stream(t, run_id) as response:
        seen += SseReader(response).read(stop_after=2).events
    claim = t.claim(run_id)
    approval = t.request_approval(claim)

    with stream(t, run_id, **{"Last-Event-ID": str(seen[-1].id)}) as response:
        sse = SseReader(response)
        while not any(e.event == "ApprovalRequested" for e in seen):
            seen += sse.read(stop_after=1).events

    pending = t.run(run_id)["pendingApprovals"][0]
    assert pending["approvalId"] == str(approval.approval_id)
    t.reviewer().post(
        f"/factory/approvals/{pending['approvalId']}/decision", json=decision(pending)
    ).raise_for_status()
    t.succeed(t.claim(run_id))  # the approval resumed the parked attempt

    with stream(t, run_id, **{"Last-Event-ID": str(seen[-1].id)}) as response:
        tail = SseReader(response).read()
    assert tail.ended
    seen += tail.events

    assert_gap_free(seen)
    assert seen[-1].event == "RunCompleted"
    assert [e.data for e in seen] == history(t, run_id, limit=500)
    types = [e.event for e in seen]
    assert types.index("ApprovalRequested") < types.index("ApprovalDecided")


def test_after_query_parameter_resumes_like_last_event_id(t: TenantView) -> None:
    run_id, everything = completed_run(t)
    with t.requester().stream("GET", f"/factory/runs/{run_id}/events?after=2") as response:
        replay = SseReader(response).read()
    assert replay.ended
    assert_gap_free(replay.events, start=3)
    assert [e.data for e in replay.events] == everything[2:]
    # The header wins over the query parameter (it is what EventSource sends on reconnect).
    with t.requester().stream(
        "GET", f"/factory/runs/{run_id}/events?after=1", headers={"Last-Event-ID": "4"}
    ) as response:
        assert SseReader(response).read().events[0].id == 5


def test_idle_stream_sends_heartbeats(t: TenantView) -> None:
    _, _, approval = t.waiting_for_approval()
    run_id = approval["runId"]
    last = t.run(run_id)["lastEventSeq"]
    started = time.monotonic()
    with stream(t, run_id, **{"Last-Event-ID": str(last)}) as response:
        sse = SseReader(response)
        beats = [sse.read(stop_on_comment=True) for _ in range(2)]
    elapsed = time.monotonic() - started
    assert all(b.comments == 1 and b.events == [] for b in beats)
    assert elapsed < 20 * HEARTBEAT_S


def test_a_finished_stream_answers_204_and_unknown_runs_404(t: TenantView) -> None:
    t.publish()
    run_id = t.submit()
    cancelled = t.requester().post(f"/factory/runs/{run_id}/cancel", json={"reason": "stop"})
    assert cancelled.status_code == 202
    t.wait_state(run_id, "Cancelled")
    last = history(t, run_id)[-1]
    assert last["type"] == "RunCancelled"

    done = t.requester().get(
        f"/factory/runs/{run_id}/events", headers={"Last-Event-ID": str(last["seq"])}
    )
    assert done.status_code == 204

    assert_problem(t.requester().get(f"/factory/runs/{uuid.uuid4()}/events"), 404, "run-not-found")
    with t.api.client(t.api.token(new_tenant())) as stranger:
        assert_problem(stranger.get(f"/factory/runs/{run_id}/events"), 404, "run-not-found")
    bad = t.requester().get(f"/factory/runs/{run_id}/events", headers={"Last-Event-ID": "x"})
    assert_problem(bad, 422, "request-invalid")


def test_history_pages_by_seq(t: TenantView) -> None:
    run_id, everything = completed_run(t)
    assert [e["seq"] for e in everything] == list(range(1, len(everything) + 1))
    assert everything[-1]["type"] in TERMINAL
    assert history(t, run_id, after=2, limit=2) == everything[2:4]
    assert history(t, run_id, after=len(everything)) == []

    http = t.requester()
    assert_problem(http.get(f"/factory/runs/{uuid.uuid4()}/events/history"), 404)
    assert_problem(http.get(f"/factory/runs/{run_id}/events/history?limit=0"), 422)
    assert_problem(http.get(f"/factory/runs/{run_id}/events/history?after=-1"), 422)
    with t.api.client(t.api.token(new_tenant())) as stranger:
        response = stranger.get(f"/factory/runs/{run_id}/events/history")
        assert_problem(response, 404, "run-not-found")
