"""GetRun over HTTP vs the trivial Serve route, same ingress, same run (wrk, 32 connections).

``python -m bench.get_http [--seconds S]``: a private database and Ray with Serve's fast
ingress (actors/ingress.py), one run to read, then wrk on the trivial route and on
``GET /factory/runs/{runId}`` (auth, a tenant-scoped read of run + steps + attempts + leases +
approvals; no run host involved).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import uuid

import ray
from ray import serve

from actors.ingress import ACCESS_LOG_OFF, haproxy_enabled, use_fast_ingress
from runcontrol.api.auth import mint_dev_token
from runcontrol.bootstrap import build, build_database
from runcontrol.config import Settings
from runcontrol.domain import Principal, Role, WorkflowDefinition
from runcontrol.grain import RunGrain

from . import common
from .http import Trivial, _free_port, _wrk
from .inprocess import _submit


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench.get_http")
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--connections", type=int, default=32)
    args = parser.parse_args()
    if not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    use_fast_ingress(local_ports=True)
    with common.private_database() as url:
        settings = Settings()
        db = build_database(settings, owner_url=url)
        container = build(settings, db=db, migrate=False)
        tenant = f"bench-{uuid.uuid4().hex[:8]}"
        container.releases.publish(
            tenant,
            WorkflowDefinition.from_dict({"workflowId": "bench", "steps": [{"agentId": "a"}]}),
            "bench",
            container.env.clock.now(),
        )
        grain = RunGrain(container.env, tenant, uuid.uuid4())
        principal = Principal("bench-user", tenant, "bench", frozenset({Role.REQUESTER}))
        asyncio.run(_submit(grain, principal))  # the grain's store is async
        common.local_ray()
        try:
            from serve_app import RunControlApi

            port = _free_port()
            os.environ["RUNCONTROL_DATABASE_URL"] = url
            serve.start(
                http_options={"host": "127.0.0.1", "port": port}, logging_config=ACCESS_LOG_OFF
            )
            serve.run(Trivial.bind(), name="trivial", route_prefix="/trivial")
            serve.run(RunControlApi.bind(database_url=url), name="runcontrol", route_prefix="/")
            secret = settings.auth.hs256_secret
            assert secret is not None
            token = mint_dev_token(
                secret.get_secret_value(), tenant, "bench", "bench-user", ["Requester"]
            )
            base = f"http://127.0.0.1:{port}"
            auth = {"Authorization": f"Bearer {token}"}
            get_url = f"{base}/factory/runs/{grain.run_id}"
            _wrk(f"{base}/trivial/", args.connections, 2, None, {})  # warm both
            _wrk(get_url, args.connections, 2, None, auth)
            trivial = _wrk(f"{base}/trivial/", args.connections, args.seconds, None, {})
            get = _wrk(get_url, args.connections, args.seconds, None, auth)
        finally:
            serve.shutdown()
            ray.shutdown()
            db.dispose()
    ingress = "HAProxy direct ingress" if haproxy_enabled() else "Serve's Python proxy"
    print(f"\nServe ingress: {ingress}; wrk -t2 -c{args.connections} -d{args.seconds}s")
    print(f"{'route':<24}{'req/s':>10}{'p50 ms':>10}{'p95 ms':>10}{'p99 ms':>10}{'errors':>8}")
    for name, f in (("trivial", trivial), ("GET /factory/runs/{id}", get)):
        print(
            f"{name:<24}{f['rps']:>10.0f}{f['p50_ms']:>10.1f}{f['p95_ms']:>10.1f}"
            f"{f['p99_ms']:>10.1f}{f['errors']:>8}"
        )
    print(f"{'GET / trivial':<24}{get['rps'] / trivial['rps']:>10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
