"""Liveness and readiness, including a replica whose database does not answer (503)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
from api_harness import Api, api_settings, assert_problem

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
    try:
        with httpx.Client(base_url=f"{api.base_url}/broken", timeout=30) as http:
            assert http.get("/health/live").status_code == 200
            response = http.get("/health/ready")
    finally:
        serve.delete("broken")
    body = assert_problem(response, 503, "not-ready")
    assert body["checks"]["runHosts"] == "ok"
    assert body["checks"]["database"] != "ok"
    assert "database" in body["detail"]
    assert response.headers["retry-after"]
