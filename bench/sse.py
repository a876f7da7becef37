"""Many live event streams on one API replica: delivery latency, and no host calls.

``python -m bench --only sse``: ``streams`` Server-Sent Event streams
(``GET /factory/runs/{runId}/events``) spread evenly over ``runs`` open runs, all held by one
asyncio + httpx client through the real ingress to the one API replica. Each run's attempt is
leased; the driver then reports progress on the runs (``ReportProgress``, one message at a
time, round robin, ``rate`` events/s for ``seconds``), and every stream of the run receives the
``ProgressReported`` event. Delivery latency is the event's ``occurredAt`` (stamped by the
grain just before its commit) to its receipt by the client, on the same machine's clock.

The hosts' own counters (``RunHost.stats``: commands, and reads = claims, run views, event
pages) are read before and after the streaming phase: every command in it is the driver's
progress, so any other host call there would be a stream's. No scheduler runs here.
"""

from __future__ import annotations

import asyncio
import json
import os
import resource
import time
import uuid
from collections import defaultdict
from datetime import datetime
from typing import Any

import httpx

from runcontrol.client import Claim
from runcontrol.commands import ReportProgress
from runcontrol.domain import ProgressMessage

from . import common, cpu
from .stack import Stack, api_stack


def raise_fd_limit() -> int:
    """As many open files as the hard limit allows (each stream is a socket at both ends);
    processes started afterwards (Ray, the replica) inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Streams:
    """The client side: opens the streams, parses their frames, records latencies."""

    def __init__(self, stack: Stack, client: httpx.AsyncClient) -> None:
        self.stack = stack
        self.client = client
        self.opened = 0
        self.refused: list[int] = []
        self.all_open = asyncio.Event()
        self.latencies: list[float] = []
        self.measuring_since = float("inf")  # epoch seconds: progress before it is ignored
        self.received = 0
        self.changed = asyncio.Event()

    async def follow(self, run_id: str, total: int, opening: asyncio.Semaphore) -> None:
        await opening.acquire()
        held = True
        try:
            async with self.client.stream(
                "GET", f"/factory/runs/{run_id}/events", headers=self.stack.headers
            ) as response:
                if response.status_code != 200:
                    self.refused.append(response.status_code)
                    held = False
                    opening.release()
                    self._counted(total)
                    return
                event = ""
                async for line in response.aiter_lines():
                    if held:  # the first frame (retry:) came: the stream is live
                        held = False
                        opening.release()
                        self.opened += 1
                        self._counted(total)
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == "ProgressReported":
                        received = time.time()
                        occurred = datetime.fromisoformat(json.loads(line[6:])["occurredAt"])
                        if occurred.timestamp() >= self.measuring_since:
                            self.latencies.append(1000 * (received - occurred.timestamp()))
                            self.received += 1
                            self.changed.set()
        finally:
            if held:  # it failed before its first frame
                self.refused.append(0)
                opening.release()
                self._counted(total)

    def _counted(self, total: int) -> None:
        if self.opened + len(self.refused) >= total:
            self.all_open.set()


async def _claim_all(stack: Stack, runs: int) -> list[Claim]:
    claims: list[Claim] = []
    while len(claims) < runs:
        found = await stack.client.claim(stack.agents, f"bench-sse-{len(claims)}", 10.0)
        if found is None:
            raise RuntimeError(f"only {len(claims)} of {runs} attempts could be claimed")
        claims.append(found)
    return claims


async def _submit(stack: Stack, client: httpx.AsyncClient, runs: int) -> None:
    body = {"workflowId": stack.workflow_id, "releaseAlias": "latest", "modelProfileId": "m"}
    sem = asyncio.Semaphore(16)

    async def one(i: int) -> None:
        async with sem:
            response = await client.post(
                "/factory/runs",
                json={**body, "input": {"i": i}},
                headers={**stack.headers, "Idempotency-Key": f"sse-{uuid.uuid4()}"},
            )
            response.raise_for_status()

    await asyncio.gather(*(one(i) for i in range(runs)))


async def _drive(stack: Stack, claims: list[Claim], events: int, rate: float) -> int:
    """``events`` progress reports, round robin over the runs, paced at ``rate`` per second;
    one run's reports in order (a progress ``seq`` has no gaps). Answers how many were sent."""
    seqs: dict[int, int] = defaultdict(int)
    locks = [asyncio.Lock() for _ in claims]

    async def report(i: int) -> None:
        k = i % len(claims)
        async with locks[k]:
            seqs[k] += 1
            message = ProgressMessage(seq=seqs[k], text="bench", payload={"i": i})
            await stack.client.send(ReportProgress(**claims[k].fenced(), messages=(message,)))

    started = time.perf_counter()
    tasks = []
    for i in range(events):
        await asyncio.sleep(max(0.0, started + i / rate - time.perf_counter()))
        tasks.append(asyncio.create_task(report(i)))
    await asyncio.gather(*tasks)
    return events


def run(
    owner_url: str,
    *,
    streams: int = 1000,
    runs: int = 100,
    seconds: float = 20.0,
    rate: float = 50.0,
) -> dict[str, Any]:
    fd_limit = raise_fd_limit()
    roots = cpu.own_processes(owner_url)
    per_run = [streams // runs + (1 if k < streams % runs else 0) for k in range(runs)]
    events = max(int(seconds * rate), runs)
    api = {"api": {"sse_max_streams": max(streams + 100, 4000)}}
    with api_stack(owner_url, steps=1, api_settings=api) as stack:

        async def scenario() -> dict[str, Any]:
            limits = httpx.Limits(max_connections=streams + 32, max_keepalive_connections=32)
            timeout = httpx.Timeout(60.0, read=None)
            async with httpx.AsyncClient(base_url=stack.base, limits=limits, timeout=timeout) as c:
                await _submit(stack, c, runs)
                claims = await _claim_all(stack, runs)
                client = Streams(stack, c)
                opening = asyncio.Semaphore(64)
                opened_at = time.perf_counter()
                tasks = [
                    asyncio.create_task(client.follow(str(claims[k].run_id), streams, opening))
                    for k in range(runs)
                    for _ in range(per_run[k])
                ]
                await client.all_open.wait()
                open_s = time.perf_counter() - opened_at
                hosts_before = stack.host_stats()
                cpu_before = cpu.cpu_by_process(os.getpid(), roots=roots)
                client.measuring_since = time.time()
                sent = await _drive(stack, claims, events, rate)
                # Every report goes to every stream of its run: wait for them all, or for
                # nothing more to arrive for 15 s (then the shortfall is reported).
                expected = (
                    sum(per_run[i % runs] for i in range(sent)) if client.refused == [] else 0
                )
                while client.received < expected:
                    client.changed.clear()
                    try:
                        await asyncio.wait_for(client.changed.wait(), 15)
                    except TimeoutError:
                        break
                cpu_after = cpu.cpu_by_process(os.getpid(), roots=roots)
                hosts_after = stack.host_stats()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

            def delta(key: str) -> int:
                return sum(a[key] - b[key] for a, b in zip(hosts_after, hosts_before, strict=True))

            commands, reads = delta("commands"), delta("reads")
            return {
                "streams": streams,
                "streams_open": client.opened,
                "streams_refused": len(client.refused),
                "runs": runs,
                "fd_limit": fd_limit,
                "open_seconds": open_s,
                "events_sent": sent,
                "events_per_s": rate,
                "deliveries_expected": expected,
                "deliveries": client.received,
                "delivery_p50_ms": common.percentile(client.latencies, 50),
                "delivery_p99_ms": common.percentile(client.latencies, 99),
                "delivery_max_ms": max(client.latencies, default=float("nan")),
                "host_commands": commands,
                "host_reads": reads,
                "host_calls_by_streams": reads + commands - sent,
                "cpu_ms_per_delivery": cpu.ms_per_unit(cpu_before, cpu_after, client.received),
                "load_average": os.getloadavg(),
            }

        return asyncio.run(scenario())


def report(figures: dict[str, Any]) -> None:
    print()
    print(
        f"SSE: {figures['streams_open']} of {figures['streams']} streams open on one replica "
        f"({figures['streams_refused']} refused) over {figures['runs']} runs, opened in "
        f"{figures['open_seconds']:.1f} s; {figures['events_sent']} events at "
        f"{figures['events_per_s']:.0f}/s; load average "
        f"{' / '.join(f'{x:.2f}' for x in figures['load_average'])}"
    )
    print(
        f"{'deliveries (received / expected)':<44}"
        f"{figures['deliveries']:>7} / {figures['deliveries_expected']:<7}"
    )
    print(
        f"{'delivery latency p50 / p99 / max ms':<44}{figures['delivery_p50_ms']:>7.1f} / "
        f"{figures['delivery_p99_ms']:.1f} / {figures['delivery_max_ms']:.1f}"
    )
    print(
        f"{'host calls by streams (reads / commands)':<44}{figures['host_calls_by_streams']:>7}"
        f"   ({figures['host_reads']} reads, {figures['host_commands']} commands, "
        f"{figures['events_sent']} of them the driver's)"
    )
    cpu.print_ms_per_unit("CPU per delivered event, by process", figures["cpu_ms_per_delivery"])
