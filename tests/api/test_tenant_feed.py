"""The tenant feed ``/factory/events``: every published event the caller may see, resumable
with ``Last-Event-ID``, limited to the caller's project unless a role spans the tenant."""

from __future__ import annotations

from typing import Any

from api_harness import PROJECT, SseReader, TenantView, assert_problem, wait_until

from runcontrol.domain import Role

OTHER_PROJECT = "proj-2"


def _run(t: TenantView, project: str) -> str:
    with t.api.client(t.token(f"req-{project}", Role.REQUESTER, project=project)) as http:
        run_id = t.submit(http)
    t.succeed(t.claim(run_id))
    return run_id


def _feed(http: Any, after: int = 0) -> list[dict[str, Any]]:
    response = http.get("/factory/events/history", params={"after": after, "limit": 500})
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()
    return events


def _history(t: TenantView, run_id: str) -> list[dict[str, Any]]:
    with t.api.client(t.token("op", Role.OPERATOR)) as http:
        events: list[dict[str, Any]] = http.get(f"/factory/runs/{run_id}/events/history").json()
    return events


def test_the_feed_holds_what_the_caller_may_see_in_position_order(t: TenantView) -> None:
    t.publish()
    mine, theirs = _run(t, PROJECT), _run(t, OTHER_PROJECT)
    for run_id in (mine, theirs):
        t.wait_state(run_id, "Completed") if run_id == mine else None
    operator = t.user("oscar", Role.OPERATOR)
    expected = {r: _history(t, r) for r in (mine, theirs)}
    total = sum(len(e) for e in expected.values())
    wait_until(
        lambda: len(_feed(operator)) == total and expected[theirs][-1]["type"] == "RunCompleted",
        timeout=20,
    )

    everything = _feed(operator)
    positions = [e["position"] for e in everything]
    assert positions == sorted(positions) and len(set(positions)) == total
    for run_id, events in expected.items():
        assert [
            {k: v for k, v in e.items() if k != "position"}
            for e in everything
            if e["runId"] == run_id
        ] == events

    # Project roles see their project's runs only; the database enforces it too (0010).
    for role in (Role.REQUESTER, Role.OBSERVER, Role.REVIEWER):
        with t.api.client(t.token("p", role, project=PROJECT)) as http:
            assert {e["runId"] for e in _feed(http)} == {mine}
    with t.api.client(t.token("p", Role.OBSERVER, project=OTHER_PROJECT)) as http:
        assert {e["runId"] for e in _feed(http)} == {theirs}
    # Resume in the middle: exactly what follows.
    middle = positions[len(positions) // 2]
    assert _feed(operator, after=middle) == [e for e in everything if e["position"] > middle]
    # Another tenant sees none of it.
    with t.api.client(t.api.token("t-someone-else", "x", (Role.OPERATOR,))) as http:
        assert _feed(http) == []


def test_the_live_feed_resumes_after_last_event_id_without_gap_or_repeat(t: TenantView) -> None:
    t.publish()
    observer_token = t.token("olga", Role.OBSERVER, project=PROJECT)
    first = _run(t, PROJECT)
    t.wait_state(first, "Completed")
    n_first = len(_history(t, first))
    with t.api.client(observer_token) as http:
        wait_until(lambda: len(_feed(http)) == n_first)
        with http.stream("GET", "/factory/events") as response:
            reader = SseReader(response)
            head = reader.read(stop_after=3).events
        assert reader.retry_ms == 2000
        last = head[-1].id
        # More events commit while no stream is open, one of them in another project.
        second = _run(t, PROJECT)
        _run(t, OTHER_PROJECT)
        t.wait_state(second, "Completed")
        n_second = len(_history(t, second))
        with http.stream(
            "GET", "/factory/events", headers={"Last-Event-ID": str(last)}
        ) as response:
            rest = SseReader(response).read(stop_after=n_first + n_second - 3).events
    seen = head + rest
    ids = [e.id for e in seen]
    assert ids == sorted(ids) and len(set(ids)) == len(ids) == n_first + n_second
    assert [e.data["position"] for e in seen] == ids
    assert {e.data["runId"] for e in seen} == {first, second}
    for run_id in (first, second):
        assert [e.data["seq"] for e in seen if e.data["runId"] == run_id] == [
            e["seq"] for e in _history(t, run_id)
        ]
    assert [e.event for e in seen] == [e.data["type"] for e in seen]


def test_the_feed_needs_a_token_that_may_read_runs(t: TenantView) -> None:
    with t.api.client() as http:
        assert_problem(http.get("/factory/events"), 401, "unauthorized")
    with t.api.client(t.token("w", Role.WORKER)) as http:
        assert_problem(http.get("/factory/events/history"), 403)
