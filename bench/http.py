"""Submissions through Ray Serve vs a trivial Serve route, same ingress, same run.

Both are driven by the same asyncio + httpx load generator with the same connection count, so
the ratio compares the front door's own ceiling with the full submit path (auth, validation,
host call, one transaction to accept + reserve + dispatch).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from typing import Any

import httpx

from actors.ingress import free_port, haproxy_enabled

from . import common, cpu
from .common import percentile
from .stack import Trivial, api_stack

__all__ = ["Trivial", "run"]


def _free_port() -> int:  # kept for bench.get_http
    return free_port()


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


# Every submission gets an Idempotency-Key of its own: this run's salt, the wrk thread, a
# counter. (A key made of os.time() and an unseeded math.random() was the same in both
# threads, so half the submissions were answered as replays of the other thread's.)
WRK_SCRIPT = """
local counter = 0
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
request = function()
  counter = counter + 1
  if wrk.body ~= nil and wrk.body ~= "" then
    wrk.headers["Idempotency-Key"] = string.format("wrk-%s-%d-%d", SALT, tid, counter)
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
        script = f'local SALT = "{uuid.uuid4().hex}"\n' + WRK_SCRIPT
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


def runs_created(owner_url: str, tenant: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(owner_url)
    try:
        with engine.connect() as conn:
            query = text("SELECT count(*) FROM runs WHERE tenant_id = :t")
            return int(conn.execute(query, {"t": tenant}).scalar_one())
    finally:
        engine.dispose()


def run(
    owner_url: str, *, concurrency: int = 32, total: int = 3000, seconds: int = 15
) -> dict[str, Any]:
    """Both routes under the same ingress, one after the other, each with the process CPU it
    used per request (``bench.cpu``: this process and its descendants, and PostgreSQL)."""
    roots = cpu.own_processes(owner_url)
    driver = os.getpid()
    with api_stack(owner_url) as stack:
        body = {"workflowId": "bench", "releaseAlias": "latest", "modelProfileId": "m", "input": {}}

        async def get_trivial(client: httpx.AsyncClient, i: int) -> httpx.Response:
            return await client.get("/trivial/")

        async def submit(client: httpx.AsyncClient, i: int) -> httpx.Response:
            return await client.post(
                "/factory/runs",
                json={**body, "input": {"i": i}},
                headers={**stack.headers, "Idempotency-Key": f"bench-{uuid.uuid4()}"},
            )

        base = stack.base
        cpu_ms: dict[str, dict[str, float]] = {}

        def measured(name: str, load: Callable[[], Any], count: Callable[[Any], float]) -> Any:
            before = cpu.cpu_by_process(driver, roots=roots)
            result = load()
            cpu_ms[name] = cpu.ms_per_unit(
                before, cpu.cpu_by_process(driver, roots=roots), count(result)
            )
            return result

        async def warm() -> None:
            await _load(base, get_trivial, 200, concurrency)
            await _load(base, submit, 200, concurrency)

        def scenario() -> dict[str, Any]:
            asyncio.run(warm())
            trivial = measured(
                "trivial",
                lambda: asyncio.run(_load(base, get_trivial, total, concurrency)),
                lambda _: total,
            )
            submitted = measured(
                "submit",
                lambda: asyncio.run(_load(base, submit, total, concurrency)),
                lambda _: total,
            )
            return _figures("httpx", concurrency, total, trivial, submitted)

        def with_wrk() -> dict[str, Any]:
            asyncio.run(warm())
            trivial_run = measured(
                "trivial",
                lambda: _wrk(f"{base}/trivial/", concurrency, seconds, None, {}),
                lambda r: r["rps"] * seconds,
            )
            submit_run = measured(
                "submit",
                lambda: _wrk(
                    f"{base}/factory/runs",
                    concurrency,
                    seconds,
                    json.dumps(body),
                    {**stack.headers, "Content-Type": "application/json"},
                ),
                lambda r: r["rps"] * seconds,
            )
            return {
                "generator": "wrk",
                "connections": concurrency,
                "seconds": seconds,
                **{f"trivial_{k}": v for k, v in trivial_run.items()},
                **{f"submit_{k}": v for k, v in submit_run.items()},
            }

        figures = with_wrk() if shutil.which("wrk") else scenario()
        # Runs created, beside the submissions answered: equal unless keys repeated (replays).
        figures["runs_created"] = runs_created(owner_url, stack.tenant)
    figures["cpu_ms_per_request"] = cpu_ms
    figures["ingress"] = "HAProxy direct ingress" if haproxy_enabled() else "Serve's Python proxy"
    figures["load_average"] = os.getloadavg()
    print()
    print(f"Serve ingress: {figures['ingress']}; load average {common.load_average()}")
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
    print(f"{'runs created (all submissions, warm-up too)':<44}{figures['runs_created']:>14}")
    print(f"{'CPU ms per request, by process':<44}{'submit':>14}{'trivial':>14}")
    for kind, ms in cpu_ms["submit"].items():
        print(f"{'  ' + kind:<44}{ms:>14.2f}{cpu_ms['trivial'].get(kind, 0.0):>14.2f}")
    return figures
