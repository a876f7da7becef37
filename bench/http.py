"""Submissions through Ray Serve vs a trivial Serve route, same ingress, same run.

Both are driven by the same asyncio + httpx load generator with the same connection count, so
the ratio compares the front door's own ceiling with the full submit path (auth, validation,
host call, one transaction to accept + reserve + dispatch).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from typing import Any

import httpx
from fastapi import FastAPI
from ray import serve

from actors.ingress import ACCESS_LOG_OFF, haproxy_enabled
from actors.run_host import ensure_hosts
from runcontrol.api.auth import mint_dev_token
from runcontrol.bootstrap import build, build_database
from runcontrol.config import Settings
from runcontrol.domain import WorkflowDefinition

from .common import percentile

trivial_app = FastAPI()


@trivial_app.get("/")
async def trivial() -> dict[str, bool]:
    return {"ok": True}


@serve.deployment(
    num_replicas=1,
    ray_actor_options={"num_cpus": 0},
    max_ongoing_requests=256,
    logging_config=ACCESS_LOG_OFF,
)
@serve.ingress(trivial_app)
class Trivial:
    pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _load(
    base: str, make_request: Any, total: int, concurrency: int
) -> tuple[float, list[float], int]:
    latencies: list[float] = []
    errors = 0
    counter = iter(range(total))
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=30) as client:

        async def worker() -> None:
            nonlocal errors
            for i in counter:
                started = time.perf_counter()
                response = await make_request(client, i)
                latencies.append((time.perf_counter() - started) * 1000)
                if response.status_code >= 400:
                    errors += 1

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return total / elapsed, latencies, errors


def _figures(
    generator: str, concurrency: int, total: int, trivial: Any, submit: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {"generator": generator, "connections": concurrency, "requests": total}
    for name, (rate, latencies, errors) in (("trivial", trivial), ("submit", submit)):
        out[f"{name}_rps"] = rate
        for p in (50, 95, 99):
            out[f"{name}_p{p}_ms"] = percentile(latencies, p)
        out[f"{name}_errors"] = errors
    return out


WRK_SCRIPT = """
local counter = 0
local thread_salt = math.random(1, 1000000000)
request = function()
  counter = counter + 1
  if wrk.body ~= nil and wrk.body ~= "" then
    wrk.headers["Idempotency-Key"] = string.format("wrk-%d-%d-%d", os.time(), thread_salt, counter)
  end
  return wrk.format(nil, nil, nil, wrk.body)
end
done = function(summary, latency, requests)
  local errors = summary.errors.status + summary.errors.connect + summary.errors.read
    + summary.errors.write + summary.errors.timeout
  io.write(string.format("RC p50=%f p95=%f p99=%f rps=%f errors=%d\\n",
    latency:percentile(50) / 1000, latency:percentile(95) / 1000,
    latency:percentile(99) / 1000, summary.requests / (summary.duration / 1e6), errors))
end
"""


def _wrk(
    url: str, connections: int, seconds: int, body: str | None, headers: dict[str, str]
) -> dict[str, float]:
    """Drive ``url`` with wrk (C, so the generator does not eat the CPU it measures)."""
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as fh:
        script = WRK_SCRIPT
        if body is not None:
            script = f'wrk.method = "POST"\nwrk.body = {json.dumps(body)}\n' + script
        fh.write(script)
        path = fh.name
    args = ["wrk", "-t2", f"-c{connections}", f"-d{seconds}s", "-s", path]
    for key, value in headers.items():
        args += ["-H", f"{key}: {value}"]
    try:
        out = subprocess.run([*args, url], check=True, capture_output=True, text=True).stdout
    finally:
        os.unlink(path)
    line = next(x for x in out.splitlines() if x.startswith("RC "))
    fields = dict(item.split("=") for item in line[3:].split())
    return {
        "rps": float(fields["rps"]),
        "p50_ms": float(fields["p50"]),
        "p95_ms": float(fields["p95"]),
        "p99_ms": float(fields["p99"]),
        "errors": int(fields["errors"]),
    }


def run(
    owner_url: str, *, concurrency: int = 32, total: int = 3000, seconds: int = 15
) -> dict[str, Any]:
    from serve_app import RunControlApi

    settings = Settings()
    db = build_database(settings, owner_url=owner_url)
    container = build(settings, db=db, migrate=False)
    tenant = f"bench-{uuid.uuid4().hex[:8]}"
    container.releases.publish(
        tenant,
        WorkflowDefinition.from_dict({"workflowId": "bench", "steps": [{"agentId": "a"}]}),
        "bench",
        container.env.clock.now(),
    )
    hosts = ensure_hosts(settings, owner_url)
    port = _free_port()
    os.environ["RUNCONTROL_DATABASE_URL"] = owner_url
    serve.start(http_options={"host": "127.0.0.1", "port": port}, logging_config=ACCESS_LOG_OFF)
    serve.run(Trivial.bind(), name="trivial", route_prefix="/trivial")
    secret = secrets.token_urlsafe(48)  # this run's own: there is no built-in secret
    serve.run(
        RunControlApi.bind(database_url=owner_url, settings={"auth": {"hs256_secret": secret}}),
        name="runcontrol",
        route_prefix="/",
    )
    token = mint_dev_token(secret, tenant, "bench", "bench-user", ["Requester"])
    headers = {"Authorization": f"Bearer {token}"}
    body = {"workflowId": "bench", "releaseAlias": "latest", "modelProfileId": "m", "input": {}}

    async def get_trivial(client: httpx.AsyncClient, i: int) -> httpx.Response:
        return await client.get("/trivial/")

    async def submit(client: httpx.AsyncClient, i: int) -> httpx.Response:
        return await client.post(
            "/factory/runs",
            json={**body, "input": {"i": i}},
            headers={**headers, "Idempotency-Key": f"bench-{uuid.uuid4()}"},
        )

    base = f"http://127.0.0.1:{port}"

    async def warm() -> None:
        await _load(base, get_trivial, 200, concurrency)
        await _load(base, submit, 200, concurrency)

    async def scenario() -> dict[str, Any]:
        await warm()
        t_rate, t_lat, t_err = await _load(base, get_trivial, total, concurrency)
        s_rate, s_lat, s_err = await _load(base, submit, total, concurrency)
        return _figures("httpx", concurrency, total, (t_rate, t_lat, t_err), (s_rate, s_lat, s_err))

    def with_wrk() -> dict[str, Any]:
        asyncio.run(warm())
        trivial_run = _wrk(f"{base}/trivial/", concurrency, seconds, None, {})
        submit_run = _wrk(
            f"{base}/factory/runs",
            concurrency,
            seconds,
            json.dumps(body),
            {**headers, "Content-Type": "application/json"},
        )
        return {
            "generator": "wrk",
            "connections": concurrency,
            "seconds": seconds,
            **{f"trivial_{k}": v for k, v in trivial_run.items()},
            **{f"submit_{k}": v for k, v in submit_run.items()},
        }

    try:
        figures = with_wrk() if shutil.which("wrk") else asyncio.run(scenario())
    finally:
        serve.shutdown()
        del hosts
        db.dispose()
    figures["ingress"] = "HAProxy direct ingress" if haproxy_enabled() else "Serve's Python proxy"
    print()
    print(f"Serve ingress: {figures['ingress']}")
    title = f"figure ({figures['generator']}, {concurrency} connections)"
    print(f"{title:<44}{'value':>14}{'ceiling':>14}{'ratio':>8}")
    print(
        f"{'submissions/s vs trivial Serve route':<44}{figures['submit_rps']:>14.0f}"
        f"{figures['trivial_rps']:>14.0f}{figures['submit_rps'] / figures['trivial_rps']:>8.2f}"
    )
    for p in ("p50", "p95", "p99"):
        print(
            f"{'latency ' + p + ' ms (submit vs trivial)':<44}"
            f"{figures['submit_' + p + '_ms']:>14.1f}{figures['trivial_' + p + '_ms']:>14.1f}"
        )
    print(
        f"{'errors (submit / trivial)':<44}{figures['submit_errors']:>14}"
        f"{figures['trivial_errors']:>14}"
    )
    return figures
