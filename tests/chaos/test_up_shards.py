"""``runcontrol up --dev --shards 2`` (issue 41, point 6): one command starts the service on two
databases of the embedded server, the virtual shards spread over them, and serves a tenant on
each: its release published and its run submitted over HTTP (the edge mints the run in the
tenant's shard, a run host commits it there), its run read back and its readiness checked on
both databases."""

from __future__ import annotations

import signal
import uuid
from pathlib import Path

import httpx
import pytest
from test_up_lifecycle import GRACE_S, MARGIN_S, Up, root  # noqa: F401 - root: a fixture

from runcontrol.cli.demo import DEMO_WORKFLOW
from runcontrol.cli.tokens import mint, with_dev_auth
from runcontrol.config import Settings
from runcontrol.domain.shards import hashed_vshard, vshard_of


def tenant_on(database: int) -> str:
    """A fresh tenant whose virtual shard is on ``database`` once spread (``v % 2``)."""
    while True:
        tenant = f"t-{uuid.uuid4().hex[:10]}"
        if hashed_vshard(tenant) % 2 == database:
            return tenant


@pytest.mark.slow
def test_up_with_two_shards_serves_a_tenant_on_each_database(root: Path) -> None:  # noqa: F811
    up = Up(root / "pg", root / "up.log", "--shards", "2", "--no-workers")
    try:
        up.wait_up()
        out = up.output()
        assert "2 shard databases" in out and "spread over the 2 databases" in out, out
        settings = Settings(data_dir=str(root / "pg"))
        with_dev_auth(settings)  # the secret `up --dev` keeps beside its data dir
        with httpx.Client(base_url=up.url, timeout=30.0) as http:
            assert http.get("/health/ready").status_code == 200  # both databases' schemas
            for database in (0, 1):
                tenant = tenant_on(database)

                def auth(role: str, t: str = tenant) -> dict[str, str]:
                    token = mint(settings, f"{role.lower()}-1", [role], t, "p")
                    return {"Authorization": f"Bearer {token}"}

                published = http.post(
                    "/factory/releases",
                    json={"definition": DEMO_WORKFLOW},
                    headers=auth("WorkspaceAdmin"),
                )
                assert published.status_code == 201, published.text
                submitted = http.post(
                    "/factory/runs",
                    json={
                        "workflowId": DEMO_WORKFLOW["workflowId"],
                        "releaseAlias": "latest",
                        "modelProfileId": "code-agent",
                        "input": {"repository": "example/repo", "revision": "a1b2c3d"},
                    },
                    headers={**auth("Requester"), "Idempotency-Key": uuid.uuid4().hex},
                )
                assert submitted.status_code == 202, submitted.text
                run_id = uuid.UUID(submitted.json()["runId"])
                assert vshard_of(run_id) == hashed_vshard(tenant)  # minted in its shard
                found = http.get(f"/factory/runs/{run_id}", headers=auth("Requester"))
                assert found.status_code == 200, found.text
                assert found.json()["state"] in ("Accepted", "Running")
    finally:
        up.proc.send_signal(signal.SIGINT)
        up.wait_gone(GRACE_S + MARGIN_S + 30)
