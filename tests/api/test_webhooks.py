"""Webhooks over real HTTP: subscriptions through the API, deliveries by the session's real
scheduler (its outbox relay and WebhookDelivery job) to a real local HTTP receiver."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from api_harness import TenantView, assert_problem, wait_until
from webhook_receiver import Receiver

from runcontrol.client import TERMINAL_EVENTS
from runcontrol.domain import Role
from runcontrol.domain.webhooks import verify


@pytest.fixture(scope="module")
def receiver() -> Iterator[Receiver]:
    with Receiver() as opened:
        yield opened


def operator(t: TenantView) -> Any:
    return t.user("oscar", Role.OPERATOR)


def subscribe(t: TenantView, url: str, **body: Any) -> dict[str, Any]:
    response = operator(t).post("/factory/webhooks", json={"url": url, **body})
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    assert response.headers["Location"] == f"/factory/webhooks/{created['subscriptionId']}"
    assert created["secret"].startswith("whsec_")
    return created


def completed_run(t: TenantView) -> str:
    run_id = t.submit()
    t.succeed(t.claim(run_id))
    t.wait_state(run_id, "Completed")
    return run_id


def cancelled_run(t: TenantView) -> str:
    run_id = t.submit()
    response = t.requester().post(f"/factory/runs/{run_id}/cancel", json={"reason": "no"})
    assert response.status_code == 202, response.text
    t.wait_state(run_id, "Cancelled")
    return run_id


def history(t: TenantView, run_id: str) -> list[dict[str, Any]]:
    response = t.requester().get(f"/factory/runs/{run_id}/events/history")
    assert response.status_code == 200, response.text
    events: list[dict[str, Any]] = response.json()
    assert events[-1]["type"] in TERMINAL_EVENTS
    return events


def counts(t: TenantView, subscription_id: str) -> dict[str, int]:
    response = operator(t).get(f"/factory/webhooks/{subscription_id}")
    assert response.status_code == 200, response.text
    found: dict[str, int] = response.json()["deliveries"]
    return found


def assert_signed(received: list[Any], secret: str) -> None:
    for r in received:
        assert verify(secret, r.timestamp, r.body, r.signature, now=time.time()), r.headers
        assert r.event["eventId"] == r.event_id


def assert_per_run_order(received: list[Any]) -> None:
    """In arrival order, a run's deliveries never go back in seq, and a later event is sent
    only after every earlier one was acknowledged (or dead-lettered)."""
    by_run: dict[str, list[Any]] = {}
    for r in received:
        by_run.setdefault(r.event["runId"], []).append(r)
    for sent in by_run.values():
        seqs = [r.event["seq"] for r in sent]
        assert seqs == sorted(seqs), seqs


def test_every_event_is_delivered_once_in_per_run_order_after_retries(
    t: TenantView, receiver: Receiver
) -> None:
    t.publish()
    path = f"/flaky-{uuid.uuid4().hex[:8]}"
    sub = subscribe(t, receiver.url(path, "flaky:5"), description="ci", maxAttempts=10)
    runs = [completed_run(t), cancelled_run(t), completed_run(t)]
    expected = {run_id: history(t, run_id) for run_id in runs}
    total = sum(len(events) for events in expected.values())

    wait_until(lambda: counts(t, sub["subscriptionId"])["delivered"] == total, timeout=30)
    received = receiver.at(path)
    assert_signed(received, sub["secret"])
    assert_per_run_order(received)
    failed = [r for r in received if r.status == 500]
    assert len(failed) == 5
    acknowledged = [r for r in received if r.status == 200]
    # each event acknowledged exactly once, and a failed one was retried with the same id
    assert sorted(r.event_id for r in acknowledged) == sorted(
        e["eventId"] for events in expected.values() for e in events
    )
    for f in failed:
        retried = [r for r in received if r.event_id == f.event_id and r.attempt > f.attempt]
        assert retried, f"event {f.event_id} was not retried"
    for run_id, events in expected.items():
        got = [r.event for r in acknowledged if r.event["runId"] == run_id]
        assert [e["seq"] for e in got] == [e["seq"] for e in events]
        assert got == events  # the body is the history's envelope, byte for byte in JSON
    positions = [r.position for r in acknowledged]
    assert len(set(positions)) == total
    assert counts(t, sub["subscriptionId"]) == {"pending": 0, "delivered": total, "deadLettered": 0}


def test_dead_letter_after_the_limit_then_redelivery_from_a_cursor(
    t: TenantView, receiver: Receiver
) -> None:
    t.publish()
    path = f"/down-{uuid.uuid4().hex[:8]}"
    sub = subscribe(t, receiver.url(path, "fail"), maxAttempts=2)
    sid = sub["subscriptionId"]
    run_id = completed_run(t)
    events = history(t, run_id)
    n = len(events)

    wait_until(lambda: counts(t, sid)["deadLettered"] == n, timeout=30)
    received = receiver.at(path)
    assert_per_run_order(received)
    assert [(r.event["seq"], r.attempt) for r in received] == [
        (e["seq"], attempt) for e in events for attempt in (1, 2)
    ]
    dead = operator(t).get(f"/factory/webhooks/{sid}/deliveries", params={"state": "DeadLettered"})
    assert dead.status_code == 200, dead.text
    letters = dead.json()["items"]
    assert [d["eventId"] for d in letters] == [e["eventId"] for e in events]
    assert {(d["attempts"], d["lastStatus"], d["lastError"]) for d in letters} == {
        (2, 500, "HTTP 500")
    }

    # The receiver is back: redeliver everything, then everything after the third event.
    receiver.modes[path] = "ok"
    again = operator(t).post(f"/factory/webhooks/{sid}/redeliver", json={"after": 0})
    assert again.status_code == 202, again.text
    assert again.json() == {"subscriptionId": sid, "after": 0, "queued": n}
    wait_until(lambda: counts(t, sid)["delivered"] == n, timeout=30)
    first_pass = [r for r in receiver.at(path) if r.status == 200]
    assert [r.event_id for r in first_pass] == [e["eventId"] for e in events]
    assert_signed(first_pass, sub["secret"])

    cursor = first_pass[2].position
    again = operator(t).post(f"/factory/webhooks/{sid}/redeliver", json={"after": cursor})
    assert again.json()["queued"] == n - 3
    wait_until(lambda: len([r for r in receiver.at(path) if r.status == 200]) == 2 * n - 3)
    second_pass = [r for r in receiver.at(path) if r.status == 200][n:]
    assert [r.event_id for r in second_pass] == [e["eventId"] for e in events[3:]]
    assert all(r.attempt == 1 for r in second_pass)  # a redelivery starts over
    assert counts(t, sid) == {"pending": 0, "delivered": n, "deadLettered": 0}


def test_a_subscription_gets_only_events_published_after_it_and_none_once_disabled(
    t: TenantView, receiver: Receiver
) -> None:
    t.publish()
    before = completed_run(t)
    wait_until(lambda: _feed_has(t, before))
    path = f"/late-{uuid.uuid4().hex[:8]}"
    sub = subscribe(t, receiver.url(path))
    sid = sub["subscriptionId"]
    after = completed_run(t)
    n = len(history(t, after))
    wait_until(lambda: counts(t, sid)["delivered"] == n, timeout=30)
    assert {r.event["runId"] for r in receiver.at(path)} == {after}

    assert operator(t).delete(f"/factory/webhooks/{sid}").status_code == 204
    view = operator(t).get(f"/factory/webhooks/{sid}").json()
    assert view["disabledAt"] is not None
    last = completed_run(t)
    # The relay has published the run's events (the feed is its output); a subscription still
    # enabled would have deliveries for them by now.
    wait_until(lambda: _feed_has(t, last))
    assert len(receiver.at(path)) == n
    assert counts(t, sid)["pending"] == 0
    assert_problem(
        operator(t).post(f"/factory/webhooks/{sid}/redeliver", json={"after": 0}),
        409,
        "webhook-disabled",
    )


def _feed_has(t: TenantView, run_id: str) -> bool:
    feed = operator(t).get("/factory/events/history", params={"limit": 500}).json()
    return any(e["runId"] == run_id and e["type"] in TERMINAL_EVENTS for e in feed)


def test_who_may_manage_webhooks(t: TenantView, receiver: Receiver) -> None:
    url = receiver.url("/roles")
    for role in (Role.REQUESTER, Role.REVIEWER, Role.OBSERVER):
        with t.api.client(t.token("x", role)) as http:
            assert_problem(http.get("/factory/webhooks"), 403)
            assert_problem(http.post("/factory/webhooks", json={"url": url}), 403)
    for role in (Role.OPERATOR, Role.WORKSPACE_ADMIN, Role.PLATFORM_ADMIN):
        with t.api.client(t.token("admin", role)) as http:
            assert http.post("/factory/webhooks", json={"url": url}).status_code == 201
    listed = operator(t).get("/factory/webhooks").json()["items"]
    assert len(listed) == 3 and all("secret" not in item for item in listed)

    other = TenantView(t.api, t.runtime, f"t-{uuid.uuid4().hex[:12]}")
    try:
        sid = listed[0]["subscriptionId"]
        http = other.user("oscar", Role.OPERATOR)
        assert http.get("/factory/webhooks").json()["items"] == []
        assert_problem(http.get(f"/factory/webhooks/{sid}"), 404, "webhook-not-found")
        assert_problem(http.delete(f"/factory/webhooks/{sid}"), 404, "webhook-not-found")
        assert_problem(
            http.post(f"/factory/webhooks/{sid}/redeliver", json={"after": 0}),
            404,
            "webhook-not-found",
        )
    finally:
        other.close()
    assert_problem(
        operator(t).post("/factory/webhooks", json={"url": "ftp://example.com/hook"}),
        422,
        "invalid-webhook-url",
    )
