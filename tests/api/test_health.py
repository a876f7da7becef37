"""Liveness and readiness, including a replica whose database does not answer (503); work
that no worker takes is the tenant's ``/health/workers`` and a metric, never readiness."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from api_harness import Api, TenantView, api_settings, assert_problem, extra_app
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
    settings = api_settings(ray_runtime, tmp_path / "unused-jwks.json")
    settings["api"]["readiness_timeout_seconds"] = 2
    token = api.token("t-broken")
    # A second app on the same Serve instance whose database URL points nowhere.
    with (
        extra_app(api, "broken", BROKEN_DB, settings) as base_url,
        httpx.Client(base_url=base_url, timeout=30) as http,
    ):
        assert http.get("/health/live").status_code == 200
        response = http.get("/health/ready")
        # A read meets the database down: 503 to retry, never an internal error.
        read = http.get("/factory/runs", headers={"Authorization": f"Bearer {token}"})
    assert_problem(read, 503, "unavailable")
    assert read.headers["retry-after"]
    body = assert_problem(response, 503, "not-ready")
    assert body["checks"]["runHosts"] == "ok"
    assert body["checks"]["database"] != "ok"
    assert "database" in body["detail"]
    assert response.headers["retry-after"]


def test_a_replica_on_a_schema_that_keeps_no_older_code_is_not_ready_and_says_why(
    api: Api, ray_runtime: Any, serve_instance: int, tmp_path: Path
) -> None:
    """A replica of this release on a database a newer, incompatible release migrated
    (``tests/upgrade_migrations`` to 9002) answers 503 with the refusal, so a load balancer
    sends nothing to it until the rolling upgrade replaces it."""
    from support import new_database

    from runcontrol.store.functions import revisions

    newer = new_database(ray_runtime.owner_url, "runcontrol_newer")
    newer.migrate(more_versions=[Path(__file__).resolve().parent.parent / "upgrade_migrations"])
    newer.dispose()
    settings = api_settings(ray_runtime, tmp_path / "unused-jwks.json")
    with (
        extra_app(api, "older", newer.owner_url, settings) as base_url,
        httpx.Client(base_url=base_url, timeout=30) as http,
    ):
        response = http.get("/health/ready")
    body = assert_problem(response, 503, "not-ready")
    assert body["checks"] == {
        "database": (
            "schema: the database schema is at revision 9002, which needs code at 9002 or newer;"
            f" this release is {revisions()[-1]}: run the new release here (a rolling upgrade"
            " replaces this process, docs/operations.md)"
        ),
        "runHosts": "ok",
    }


def test_a_tenant_without_workers_leaves_readiness_alone_and_sees_its_stall(
    api: Api, t: TenantView, ray_runtime: Any, tmp_path: Path
) -> None:
    from runcontrol import reconcilers

    settings = api_settings(ray_runtime, tmp_path / "unused-jwks.json")
    settings["api"]["dispatch_stall_seconds"] = 60
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
    mine = {"Authorization": f"Bearer {t.token()}"}
    other = {"Authorization": f"Bearer {api.token(f'other-{t.tenant}')}"}
    with (
        extra_app(api, "stall", ray_runtime.owner_url, settings) as base_url,
        httpx.Client(base_url=base_url, timeout=30) as http,
    ):
        ready = http.get("/health/ready")
        stalled = http.get("/health/workers", headers=mine)
        elsewhere = http.get("/health/workers", headers=other)
        anonymous = http.get("/health/workers")
        sample = reconcilers.sample_gauges(ray_runtime.container.db, datetime.now(UTC), 60)
        # A worker of the agent claims one: the other still waits, but work is taken.
        claim = asyncio.run(ray_runtime.client.claim([t.agent], f"w-{t.tenant}", 15))
        assert claim is not None
        after_claim = http.get("/health/workers", headers=mine)
    # Readiness is this replica's: its database, its run hosts, its drain; nothing else.
    assert ready.status_code == 200, ready.text
    assert ready.json()["checks"] == {"database": "ok", "runHosts": "ok"}
    assert stalled.status_code == 200, stalled.text
    body = stalled.json()
    assert body["status"] == "stalled" and body["stallSeconds"] == 60, body
    assert [(s["agentId"], s["waiting"]) for s in body["stalled"]] == [(t.agent, 2)], body
    # Another tenant sees none of it (row-level security; its own leftovers, if any, aside).
    assert elsewhere.status_code == 200
    assert t.agent not in elsewhere.text, elsewhere.text
    assert_problem(anonymous, 401, "unauthorized")
    # The metric's sample (runcontrol_dispatch_stalled_attempts{tenant,agent}).
    assert sample.stalled[(t.tenant, t.agent)] == 2, sample.stalled
    assert all(tenant != t.tenant or a == t.agent for tenant, a in sample.stalled), sample
    assert after_claim.json() == {"status": "ok", "stallSeconds": 60, "stalled": []}
