"""Streamed output (issue 30): chunks/s and server CPU per 1,000 chunks, beside pgbench.

``python -m bench --only output``: ``attempts`` runs are submitted over HTTP and their attempts
claimed; each attempt then streams ``rate`` chunks a second for ``seconds`` through the SDK's
own batching (``AttemptContext.output``, what ``step.stream`` calls), over the in-cluster
client to the run hosts. One SSE reader per run (``GET /factory/runs/{runId}/output/stream``)
counts what it receives: every chunk, once, in position order, and how long after its write.

The figures: chunks stored per second (and what was offered), the writes and the statements
that carried them (a write is one attempt's batch; a statement groups the writes ready on a
host at once), the CPU per 1,000 chunks by process (the server: hosts, PostgreSQL, the API
replica feeding the readers; the driver apart), each rate beside pgbench's transactions/s.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from datetime import datetime, timedelta
from typing import Any

import httpx

from runcontrol.client import Claim
from runcontrol.clock import SystemClock
from runcontrol.sdk import Backoff
from runcontrol.sdk._step import AttemptContext
from runcontrol.workers.protocol import Grant

from . import common, cpu
from .sse import _claim_all, _submit, raise_fd_limit
from .stack import Stack, api_stack

TICK_S = 0.05  # the driver adds each attempt's chunks in ticks of this long


class Readers:
    """One SSE reader per run: what it received, in order, and each chunk's delay."""

    def __init__(self, stack: Stack, client: httpx.AsyncClient) -> None:
        self.stack = stack
        self.client = client
        self.positions: dict[str, list[int]] = {}
        self.latencies: list[float] = []
        self.opened = 0
        self.all_open = asyncio.Event()

    async def follow(self, run_id: str, total: int) -> None:
        seen = self.positions.setdefault(run_id, [])
        path = f"/factory/runs/{run_id}/output/stream"
        async with self.client.stream("GET", path, headers=self.stack.headers) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if line.startswith("retry:"):
                    self.opened += 1
                    if self.opened >= total:
                        self.all_open.set()
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    seen.append(chunk["position"])
                    written = datetime.fromisoformat(chunk["writtenAt"]).timestamp()
                    self.latencies.append(1000 * (time.time() - written))


def _attempt(stack: Stack, claim: Claim) -> AttemptContext:
    grant = Grant(str(uuid.uuid4()), claim.tenant_id, claim.grant, claim.input)
    return AttemptContext(
        grant,
        stack.client.send,
        clock=SystemClock(),
        backoff=Backoff(base_s=0.05, cap_s=1.0),
        lease_grace=timedelta(seconds=30),
        loop=asyncio.get_running_loop(),
    )


async def _stream(attempt: AttemptContext, rate: float, seconds: float) -> int:
    """``rate`` chunks a second for ``seconds``, paced in ticks, then flushed."""
    per_tick = max(int(rate * TICK_S), 1)
    ticks = int(seconds / TICK_S)
    started = time.perf_counter()
    sent = 0
    for tick in range(ticks):
        for _ in range(per_tick):
            await attempt.output.add(f"token {sent} ")
            sent += 1
        await asyncio.sleep(max(0.0, started + (tick + 1) * TICK_S - time.perf_counter()))
    await attempt.output.flush()
    return sent


def run(
    owner_url: str,
    ceiling: float,
    *,
    attempts: int = 100,
    rate: float = 100.0,
    seconds: float = 10.0,
) -> dict[str, Any]:
    """``ceiling``: pgbench's transactions/s in this run."""
    raise_fd_limit()
    roots = cpu.own_processes(owner_url)
    with api_stack(owner_url, steps=1, trivial=False) as stack:

        async def scenario() -> dict[str, Any]:
            limits = httpx.Limits(max_connections=attempts + 32, max_keepalive_connections=32)
            timeout = httpx.Timeout(60.0, read=None)
            async with httpx.AsyncClient(base_url=stack.base, limits=limits, timeout=timeout) as c:
                await _submit(stack, c, attempts)
                claims = await _claim_all(stack, attempts)
                readers = Readers(stack, c)
                following = [
                    asyncio.create_task(readers.follow(str(k.run_id), attempts)) for k in claims
                ]
                await asyncio.wait_for(readers.all_open.wait(), 60)
                contexts = [_attempt(stack, k) for k in claims]
                hosts_before = stack.host_stats()
                cpu_before = cpu.cpu_by_process(os.getpid(), roots=roots)
                started = time.perf_counter()
                sent = sum(await asyncio.gather(*(_stream(a, rate, seconds) for a in contexts)))
                elapsed = time.perf_counter() - started
                cpu_after = cpu.cpu_by_process(os.getpid(), roots=roots)
                hosts_after = stack.host_stats()
                deadline = time.monotonic() + 30
                while sum(map(len, readers.positions.values())) < sent:
                    if time.monotonic() > deadline:
                        break
                    await asyncio.sleep(0.1)
                for task in following:
                    task.cancel()
                await asyncio.gather(*following, return_exceptions=True)

            def delta(key: str) -> int:
                return sum(a[key] - b[key] for a, b in zip(hosts_after, hosts_before, strict=True))

            chunks, writes = delta("output_chunks"), delta("output_writes")
            statements = delta("output_statements")
            per_1000 = cpu.ms_per_unit(cpu_before, cpu_after, chunks / 1000)
            driver = per_1000.get("driver (load generator)", 0.0)
            in_order = all(p == list(range(1, len(p) + 1)) for p in readers.positions.values())
            return {
                "pgbench_tps": ceiling,
                "attempts": attempts,
                "rate_per_attempt": rate,
                "seconds": elapsed,
                "chunks_offered_per_s": attempts * max(int(rate * TICK_S), 1) / TICK_S,
                "chunks_sent": sent,
                "chunks_stored": chunks,
                "chunks_per_s": chunks / elapsed,
                "writes_per_s": writes / elapsed,
                "statements_per_s": statements / elapsed,
                "chunks_per_write": chunks / max(writes, 1),
                "writes_per_statement": writes / max(statements, 1),
                "delivered": sum(map(len, readers.positions.values())),
                "delivered_in_order_once": in_order,
                "delivery_p50_ms": common.percentile(readers.latencies, 50),
                "delivery_p99_ms": common.percentile(readers.latencies, 99),
                "cpu_ms_per_1000_chunks": per_1000,
                "server_cpu_ms_per_1000_chunks": per_1000["all"] - driver,
                "load_average": os.getloadavg(),
            }

        return asyncio.run(scenario())


def report(figures: dict[str, Any]) -> None:
    ceiling = figures["pgbench_tps"]
    print()
    print(
        f"streamed output: {figures['attempts']} attempts x {figures['rate_per_attempt']:.0f} "
        f"chunks/s for {figures['seconds']:.1f} s, one SSE reader each; load average "
        f"{' / '.join(f'{x:.2f}' for x in figures['load_average'])}"
    )
    print(f"{'figure':<44}{'value':>14}{'ceiling':>14}{'ratio':>8}")
    for name, value in (
        ("chunks stored/s", figures["chunks_per_s"]),
        ("  writes/s (one attempt's batch each)", figures["writes_per_s"]),
        ("  statements/s (the writes ready at once)", figures["statements_per_s"]),
    ):
        print(f"{name:<44}{value:>14.0f}{ceiling:>14.0f}{value / ceiling:>8.2f}")
    print(f"{'  chunks offered/s':<44}{figures['chunks_offered_per_s']:>14.0f}")
    print(
        f"{'  chunks per write / writes per statement':<44}"
        f"{figures['chunks_per_write']:>7.1f} / {figures['writes_per_statement']:<6.1f}"
    )
    print(
        f"{'delivered (received / stored), in order once':<44}"
        f"{figures['delivered']:>7} / {figures['chunks_stored']:<7} "
        f"{figures['delivered_in_order_once']}"
    )
    print(
        f"{'delivery p50 / p99 ms (write to reader)':<44}"
        f"{figures['delivery_p50_ms']:>7.1f} / {figures['delivery_p99_ms']:.1f}"
    )
    print(
        f"{'server CPU ms per 1,000 chunks':<44}{figures['server_cpu_ms_per_1000_chunks']:>14.1f}"
    )
    cpu.print_ms_per_unit("CPU per 1,000 chunks, by process", figures["cpu_ms_per_1000_chunks"])
