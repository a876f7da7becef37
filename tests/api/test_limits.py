"""Request limits over HTTP: bodies over ``api.max_body_bytes`` get 413 and a tenant over its
command rate gets 429 with Retry-After, while other tenants go on."""

from __future__ import annotations

import json
from collections.abc import Iterator

from api_harness import RATE_LIMIT, RATE_LIMITED_TENANT, Api, TenantView, assert_problem

from runcontrol.config import ApiOptions

MAX_BODY = ApiOptions().max_body_bytes  # the test deployment keeps the default: 1 MiB


def _oversized(t: TenantView, size: int) -> bytes:
    body = t.body(input={"blob": "x" * size})
    return json.dumps(body).encode()


def test_a_body_over_the_cap_is_413_before_any_route_reads_it(t: TenantView) -> None:
    t.publish()
    http = t.requester()
    too_big = _oversized(t, MAX_BODY)
    response = http.post(
        "/factory/runs",
        content=too_big,
        headers={"Idempotency-Key": "big", "Content-Type": "application/json"},
    )
    body = assert_problem(response, 413, "payload-too-large")
    assert body["maxBytes"] == MAX_BODY
    assert http.get("/factory/runs").json()["items"] == []

    def chunks() -> Iterator[bytes]:  # no Content-Length: the cap counts what arrives
        for i in range(0, len(too_big), 64 * 1024):
            yield too_big[i : i + 64 * 1024]

    chunked = http.post(
        "/factory/runs",
        content=chunks(),
        headers={"Idempotency-Key": "big-chunked", "Content-Type": "application/json"},
    )
    assert_problem(chunked, 413, "payload-too-large")
    assert http.get("/factory/runs").json()["items"] == []


def test_a_chunked_body_under_the_cap_reaches_the_route(t: TenantView) -> None:
    t.publish()
    payload = json.dumps(t.body()).encode()

    def chunks() -> Iterator[bytes]:
        yield payload[:10]
        yield payload[10:]

    response = t.requester().post(
        "/factory/runs",
        content=chunks(),
        headers={"Idempotency-Key": "chunked", "Content-Type": "application/json"},
    )
    assert response.status_code == 202, response.text


def test_a_tenant_over_its_command_rate_gets_429_with_retry_after(
    api: Api, ray_runtime: object
) -> None:
    limited = TenantView(api, ray_runtime, RATE_LIMITED_TENANT)
    unlimited = TenantView(api, ray_runtime, f"{RATE_LIMITED_TENANT}-not")
    try:
        limited.publish()
        unlimited.publish()
        burst = int(RATE_LIMIT["burst"])
        run_ids = [limited.submit(key=f"k-{i}") for i in range(burst)]
        over = limited.requester().post(
            "/factory/runs", json=limited.body(), headers={"Idempotency-Key": "one-more"}
        )
        body = assert_problem(over, 429, "rate-limited")
        retry_after = int(over.headers["Retry-After"])
        assert 1 <= retry_after <= 1 / float(RATE_LIMIT["per_second"])
        assert body["retryAfter"] == retry_after
        # cancels are metered too; reads are not
        cancel = limited.requester().post(f"/factory/runs/{run_ids[0]}/cancel", json={})
        assert_problem(cancel, 429, "rate-limited")
        assert limited.run(run_ids[0])["state"] not in ("Cancelling", "Cancelled")
        listed = limited.requester().get("/factory/runs").json()["items"]
        assert sorted(r["runId"] for r in listed) == sorted(run_ids)
        # another tenant is not held back by this one
        for i in range(burst + 2):
            unlimited.submit(key=f"u-{i}")
    finally:
        limited.close()
        unlimited.close()
