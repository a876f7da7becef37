"""Liveness and readiness, including a replica whose database does not answer (503) and work
that no worker takes (503)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
from api_harness import Api, TenantView, api_settings, assert_problem
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

BROKEN_DB = "postgresql+psycopg://nobody@127.0.0.1:1/nowhere"


def test_live_and_ready(api: Api) -> None:
    with api.client() as http:
        assert http.get("/health/live").status_code == 200
        ready = http.get("/health/ready")
    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checks": {"database": "ok", "runHosts": "ok"}}


def test_not_ready_without_a_database_is_503(
    api: Api, ray_runtime: Any, serve_instance: int, tmp_path: Path
) -> None:
    from ray import serve

    from serve_app import RunControlApi

    settings = api_settings(ray_runtime, tmp_path / "unused-jwks.json")
    settings["api"]["readiness_timeout_seconds"] = 2
    # A second app on the same Serve instance whose database URL points nowhere.
    broken = RunControlApi.options(
        graceful_shutdown_timeout_s=0.5, graceful_shutdown_wait_loop_s=0.1
    )
    serve.run(
        broken.bind(database_url=BROKEN_DB, settings=settings),
        name="broken",
        route_prefix="/broken",
    )
    token = api.token("t-broken")
    try:
        with httpx.Client(base_url=f"{api.base_url}/broken", timeout=30) as http:
            assert http.get("/health/live").status_code == 200
            response = http.get("/health/ready")
            # A read meets the database down: 503 to retry, never an internal error.
            read = http.get("/factory/runs", headers={"Authorization": f"Bearer {token}"})
    finally:
        serve.delete("broken")
    assert_problem(read, 503, "unavailable")
    assert read.headers["retry-after"]
    body = assert_problem(response, 503, "not-ready")
    assert body["checks"]["runHosts"] == "ok"
    assert body["checks"]["database"] != "ok"
    assert "database" in body["detail"]
    assert response.headers["retry-after"]


def test_not_ready_while_dispatched_attempts_wait_with_no_claim(
    api: Api, t: TenantView, ray_runtime: Any, tmp_path: Path
) -> None:
    from ray import serve

    from serve_app import RunControlApi

    settings = api_settings(ray_runtime, tmp_path / "unused-jwks.json")
    settings["api"]["dispatch_stall_seconds"] = 60
    watching = RunControlApi.options(
        graceful_shutdown_timeout_s=0.5, graceful_shutdown_wait_loop_s=0.1
    )
    serve.run(
        watching.bind(database_url=ray_runtime.owner_url, settings=settings),
        name="stall",
        route_prefix="/stall",
    )
    t.publish()
    runs = [t.submit(), t.submit()]
    for run_id in runs:
        t.wait_state(run_id, "Running")
    # Both first attempts wait, unclaimed, since a day ago (as the database's owner: the app
    # role cannot write history).
    owner = create_engine(ray_runtime.owner_url, poolclass=NullPool)
    with owner.begin() as conn:
        moved = conn.execute(
            text(
                "UPDATE attempts SET dispatched_at = dispatched_at - interval '1 day' "
                "WHERE agent_id = :agent AND state = 'Dispatched'"
            ),
            {"agent": t.agent},
        )
        assert moved.rowcount == 2
    owner.dispose()
    try:
        with httpx.Client(base_url=f"{api.base_url}/stall", timeout=30) as http:
            stalled = http.get("/health/ready")
            # A worker of the agent claims one: the other still waits, but work is taken.
            claim = asyncio.run(ray_runtime.client.claim([t.agent], f"w-{t.tenant}", 15))
            assert claim is not None
            after_claim = http.get("/health/ready")
    finally:
        serve.delete("stall")
    body = assert_problem(stalled, 503, "not-ready")
    assert body["checks"]["database"] == body["checks"]["runHosts"] == "ok"
    assert body["checks"]["workers"].startswith("stalled:")
    assert f"{t.agent}: 2 waiting" in body["checks"]["workers"]
    assert "workers" in body["detail"]
    # Other tests' leftovers in the session's database may still stall other agents.
    checks = after_claim.json()["checks"]
    assert t.agent not in checks["workers"], checks
    if after_claim.status_code == 200:
        assert checks["workers"] == "ok"
