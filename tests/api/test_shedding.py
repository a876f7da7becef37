"""Load is shed, not queued until the client times out: a replica already waiting on
``api.max_commands_in_flight`` commands answers 503 ``overloaded`` with Retry-After at once,
having done nothing, so the client's retry (same Idempotency-Key) is safe anywhere.

The app is built in this process over the session's real run hosts (``create_app`` with the
limit set to 2) and driven through httpx's ASGI transport, so the test controls exactly how
many commands are in flight without redeploying the session's Serve app."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import httpx
from api_harness import TenantView, api_settings

from runcontrol.api import create_app
from runcontrol.config import Settings


def test_commands_past_the_in_flight_limit_are_shed_with_retry_after(
    t: TenantView, ray_runtime: Any, db: Any, tmp_path: Any
) -> None:
    settings = api_settings(ray_runtime, tmp_path / "jwks.json")
    settings["auth"].pop("jwks_file")  # this app verifies the harness's HS256 tokens only
    settings["auth"]["hs256_with_jwks"] = False
    settings["api"]["max_commands_in_flight"] = 2
    app = create_app(ray_runtime.client, db, Settings.model_validate(settings))
    t.publish()
    keys = [f"shed-{i}" for i in range(16)]

    async def submit_all() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        headers = {"Authorization": f"Bearer {t.token()}"}
        async with httpx.AsyncClient(
            transport=transport, base_url="http://replica", headers=headers, timeout=60
        ) as http:

            async def submit(key: str) -> httpx.Response:
                return await http.post(
                    "/factory/runs", json=t.body(), headers={"Idempotency-Key": key}
                )

            return list(await asyncio.gather(*(submit(k) for k in keys)))

    responses = asyncio.run(submit_all())
    codes = Counter(r.status_code for r in responses)
    assert codes[202] >= 2 and codes[503] >= 1, codes
    shed = [k for k, r in zip(keys, responses, strict=True) if r.status_code == 503]
    for response in responses:
        if response.status_code == 503:
            assert response.json()["code"] == "overloaded"
            assert response.headers["Retry-After"] == "1"
    # A shed submission did nothing: its retry (through the deployed app) creates its run.
    for key in shed:
        retried = t.requester().post(
            "/factory/runs", json=t.body(), headers={"Idempotency-Key": key}
        )
        assert retried.status_code == 202, retried.text
    listed = t.requester().get("/factory/runs", params={"limit": 100}).json()
    assert len(listed["items"]) == len(keys)
