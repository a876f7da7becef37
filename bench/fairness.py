"""Fair shares across tenants (issue 21): one tenant's interactive run behind another's backlog.

``python -m bench --only fairness``: one worker pool serving every tenant (the SDK's echo app
in the cluster, ``runcontrol worker --transport ray --work-seconds S``: untenanted credits)
and two tenants of one-step runs on the same agent, submitted over HTTP through the real
ingress as the e2e bench submits:

Each attempt takes the workers ``work_seconds`` (1 s: an agent step does work), so A's
backlog outgrows the pool and waits dispatched, in the hosts' books, as in the issue.

1. *unloaded*: tenant B alone submits one run every ``b_every_s``;
2. *loaded*: tenant A submits ``a_runs`` runs at once (``concurrency`` connections, no limit on
   runs in flight) while B goes on submitting one run every ``b_every_s``, until A's backlog
   has drained (every A run ended).

Figures, per phase, for B's runs: the time from submission to first claim from the stored rows
(the run's ``created_at``, its acceptance, to its first lease's ``granted_at``), p50 / p95 /
max; the same from the client's send (the HTTP submission included: the stored lease time
minus the send time, one machine's clock); and where that time went (send -> accepted,
accepted -> dispatched, dispatched -> leased). Then the loaded / unloaded ratios (the issue's
target: within 2x) and A's drain rate (A's completed runs / (A's last end - A's first send)).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from typing import Any

import httpx
import ray
from sqlalchemy import create_engine, text

from actors.placement import host_index
from actors.scheduler import ensure_scheduler

from . import common
from .e2e import _submit, _wait_terminal, workers_of
from .stack import Stack, api_stack

STEPS = 1


def _firsts(engine: Any, tenant: str) -> dict[str, tuple[float, float, float | None]]:
    """Each of the tenant's runs: (accepted, its first attempt dispatched, its first lease
    granted or None), epoch seconds, from the stored rows."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT r.run_id, extract(epoch FROM r.created_at), "
                "(SELECT extract(epoch FROM min(a.dispatched_at)) FROM attempts a "
                " WHERE a.run_id = r.run_id), "
                "(SELECT extract(epoch FROM min(l.granted_at)) FROM leases l "
                " WHERE l.run_id = r.run_id) "
                "FROM runs r WHERE r.tenant_id = :t"
            ),
            {"t": tenant},
        ).all()
    return {
        str(r[0]): (float(r[1]), float(r[2] or r[1]), None if r[3] is None else float(r[3]))
        for r in rows
    }


async def _one_every(
    stack: Stack, headers: dict[str, str], every_s: float, count: int | None, stop: asyncio.Event
) -> dict[str, float]:
    """Submit one run every ``every_s`` (``count`` of them, or until ``stop``): run id -> the
    client's send time (epoch seconds)."""
    body = {"workflowId": stack.workflow_id, "releaseAlias": "latest", "modelProfileId": "m"}
    sent: dict[str, float] = {}
    async with httpx.AsyncClient(base_url=stack.base, timeout=60) as client:
        n = 0
        while (count is None or n < count) and not stop.is_set():
            tick = time.monotonic()
            at = time.time()
            response = await client.post(
                "/factory/runs",
                json={**body, "input": {"b": n}},
                headers={**headers, "Idempotency-Key": f"fair-b-{uuid.uuid4()}"},
            )
            response.raise_for_status()
            sent[response.json()["runId"]] = at
            n += 1
            wait = every_s - (time.monotonic() - tick)
            if wait > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
    return sent


def _claimed(engine: Any, tenant: str, runs: set[str], patience_s: float) -> dict[str, Any]:
    """Wait until every run in ``runs`` holds a lease (or ``patience_s`` passes)."""
    deadline = time.monotonic() + patience_s
    while True:
        firsts = _firsts(engine, tenant)
        if all(firsts.get(r, (0, 0, None))[2] is not None for r in runs):
            return firsts
        if time.monotonic() > deadline:
            return firsts
        time.sleep(0.25)


def _slowest(
    engine: Any, sent: dict[str, float], firsts: dict[str, Any], hosts: int, n: int = 5
) -> list[dict[str, Any]]:
    """Where B's slowest runs waited: each one's host, its wait, and the worker slots (lease
    holders) granted anything on that host meanwhile (0: no credit reached that host)."""
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT run_id, holder, extract(epoch FROM granted_at) FROM leases")
        ).all()
    waits = sorted(
        ((f[2] - f[0], run_id) for run_id, f in firsts.items() if run_id in sent and f[2]),
        reverse=True,
    )[:n]
    out = []
    for wait, run_id in waits:
        host = host_index(uuid.UUID(run_id), hosts)
        accepted, _, leased = firsts[run_id]
        slots = {
            holder
            for rid, holder, at in rows
            if accepted <= float(at) < leased and host_index(rid, hosts) == host
        }
        out.append({"host": host, "wait_ms": 1000 * wait, "slots_granting_there": len(slots)})
    return out


def _grant_gaps(engine: Any, since: float, hosts: int) -> list[float]:
    """Per host (of the runs' placement), the longest time without any grant on it between
    ``since`` and its last grant: a host left without credits shows here."""
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT run_id, extract(epoch FROM granted_at) FROM leases "
                "WHERE granted_at >= to_timestamp(:s) ORDER BY granted_at"
            ),
            {"s": since},
        ).all()
    last = [since] * hosts
    gaps = [0.0] * hosts
    for run_id, at in rows:
        h = host_index(run_id, hosts)
        gaps[h] = max(gaps[h], float(at) - last[h])
        last[h] = float(at)
    return [1000 * g for g in gaps]


def _figures(sent: dict[str, float], firsts: dict[str, Any]) -> dict[str, Any]:
    stored, client, accepting, dispatching, leasing = [], [], [], [], []
    for run_id, at in sent.items():
        accepted, dispatched, leased = firsts.get(run_id, (None, None, None))
        if leased is None:
            continue
        stored.append(1000 * (leased - accepted))
        client.append(1000 * (leased - at))
        accepting.append(1000 * (accepted - at))
        dispatching.append(1000 * (dispatched - accepted))
        leasing.append(1000 * (leased - dispatched))
    out: dict[str, Any] = {"runs": len(sent), "claimed": len(stored)}
    for name, values in (
        ("accepted_to_claim", stored),
        ("sent_to_claim", client),
        ("sent_to_accepted", accepting),
        ("accepted_to_dispatched", dispatching),
        ("dispatched_to_claim", leasing),
    ):
        out[f"{name}_p50_ms"] = common.percentile(values, 50)
        out[f"{name}_p95_ms"] = common.percentile(values, 95)
        out[f"{name}_max_ms"] = max(values, default=float("nan"))
    return out


def run(
    owner_url: str,
    *,
    a_runs: int = 5000,
    b_every_s: float = 2.0,
    b_unloaded: int = 10,
    concurrency: int = 32,
    workers: int = 1,
    worker_concurrency: int = 32,
    work_seconds: float = 1.0,
) -> dict[str, Any]:
    engine = create_engine(owner_url)
    with api_stack(owner_url, steps=STEPS, trivial=False) as stack:
        stack_hosts = stack.settings.grains.host_count
        tenant_b, headers_b = stack.another_tenant()
        scheduler = ensure_scheduler(stack.settings, owner_url)
        try:
            with workers_of("sdk", stack, owner_url, workers, worker_concurrency, work_seconds):
                warm: dict[str, float] = {}
                asyncio.run(_submit(stack, 20, 8, warm, []))
                _wait_terminal(engine, set(warm), patience_s=120)
                alone = asyncio.run(
                    _one_every(stack, headers_b, b_every_s, b_unloaded, asyncio.Event())
                )
                unloaded = _figures(alone, _claimed(engine, tenant_b, set(alone), 60))
                loaded_sent, a_sent, a_errors, a_started = asyncio.run(
                    _loaded(stack, engine, headers_b, a_runs, b_every_s, concurrency)
                )
                done = _wait_terminal(engine, set(a_sent), patience_s=120)
                b_firsts = _claimed(engine, tenant_b, set(loaded_sent), 120)
                loaded = _figures(loaded_sent, b_firsts)
                loaded["slowest"] = _slowest(engine, loaded_sent, b_firsts, stack_hosts)
                loaded["max_grant_gap_ms_by_host"] = _grant_gaps(engine, a_started, stack_hosts)
        finally:
            ray.kill(scheduler)
    engine.dispose()
    a_ended = [t for r, (state, t) in done.items() if r in a_sent and state == "Completed"]
    a_seconds = max(a_ended, default=a_started) - a_started
    figures: dict[str, Any] = {
        "a_runs": a_runs,
        "a_submitted": len(a_sent),
        "a_submit_errors": len(a_errors),
        "a_completed": len(a_ended),
        "a_drain_seconds": a_seconds,
        "a_drain_runs_per_s": len(a_ended) / max(a_seconds, 1e-9),
        "a_submissions_per_s": len(a_sent) / max(max(a_sent.values(), default=0) - a_started, 1e-9),
        "b_every_s": b_every_s,
        "worker_processes": workers,
        "worker_concurrency": worker_concurrency,
        "work_seconds": work_seconds,
        # With every slot busy, a slot frees on B's host about this often: the least B can
        # wait for one once A's backlog fills the pool (fair shares give B the next one).
        "slot_gap_ms": 1000 * work_seconds * stack_hosts / max(workers * worker_concurrency, 1),
        "connections": concurrency,
        "unloaded": unloaded,
        "loaded": loaded,
        "load_average": list(os.getloadavg()),
    }
    for name in ("accepted_to_claim", "sent_to_claim"):
        for p in ("p50", "p95", "max"):
            base = unloaded[f"{name}_{p}_ms"]
            figures[f"{name}_{p}_ratio"] = loaded[f"{name}_{p}_ms"] / base if base > 0 else None
    return figures


async def _loaded(
    stack: Stack,
    engine: Any,
    headers_b: dict[str, str],
    a_runs: int,
    b_every_s: float,
    concurrency: int,
) -> tuple[dict[str, float], dict[str, float], list[int], float]:
    """A's runs at once beside B's one every ``b_every_s``, until A's have all ended."""
    a_sent: dict[str, float] = {}
    a_errors: list[int] = []
    stop = asyncio.Event()
    started = time.time()
    b = asyncio.create_task(_one_every(stack, headers_b, b_every_s, None, stop))
    await _submit(stack, a_runs, concurrency, a_sent, a_errors)

    def drained() -> bool:
        ended = set(_terminal_ids(engine, stack.tenant))
        return ended.issuperset(a_sent)

    last_change, count = time.monotonic(), -1
    while not await asyncio.to_thread(drained):
        now_count = len(_terminal_ids(engine, stack.tenant))
        if now_count != count:
            count, last_change = now_count, time.monotonic()
        elif time.monotonic() - last_change > 120:
            break  # stuck: reported as not completed
        await asyncio.sleep(0.5)
    stop.set()
    return await b, a_sent, a_errors, started


def _terminal_ids(engine: Any, tenant: str) -> list[str]:
    with engine.connect() as conn:
        return [
            str(r[0])
            for r in conn.execute(
                text(
                    "SELECT run_id FROM runs WHERE tenant_id = :t "
                    "AND state IN ('Completed', 'Failed', 'Cancelled')"
                ),
                {"t": tenant},
            )
        ]


def report(f: dict[str, Any]) -> None:
    print()
    print(
        f"fairness: tenant A {f['a_completed']} of {f['a_runs']} one-step runs completed "
        f"({f['a_submit_errors']} submissions refused), tenant B one run every {f['b_every_s']} s; "
        f"{f['worker_processes']} SDK worker process(es) x {f['worker_concurrency']} slots "
        f"of {f['work_seconds']:g} s work serving both; load average "
        f"{' / '.join(f'{x:.2f}' for x in f['load_average'])}"
    )
    u, loaded = f["unloaded"], f["loaded"]
    print(
        f"{'B: submission -> first claim (ms)':<46}{'unloaded':>18}{'A draining':>18}{'ratio':>8}"
    )
    for name, label in (
        ("accepted_to_claim", "stored: accepted -> leased"),
        ("sent_to_claim", "client send -> leased"),
        ("sent_to_accepted", "  send -> accepted"),
        ("accepted_to_dispatched", "  accepted -> dispatched"),
        ("dispatched_to_claim", "  dispatched -> leased"),
    ):
        for p in ("p50", "p95", "max"):
            a, b = u[f"{name}_{p}_ms"], loaded[f"{name}_{p}_ms"]
            ratio = f"{b / a:>8.2f}" if a > 0 else f"{'-':>8}"
            print(f"  {label + ' ' + p:<44}{a:>18.1f}{b:>18.1f}{ratio}")
    print(f"  B runs measured: {u['claimed']} unloaded, {loaded['claimed']} while A drained")
    gaps = " / ".join(f"{g:.0f}" for g in loaded["max_grant_gap_ms_by_host"])
    print(f"  longest time without a grant, per host, while A drained: {gaps} ms")
    for slow in loaded["slowest"]:
        print(
            f"  slow B run on host {slow['host']}: {slow['wait_ms']:.0f} ms, "
            f"{slow['slots_granting_there']} slots granted on that host meanwhile"
        )
    print(
        f"  (with every slot busy a slot frees on B's host every ~{f['slot_gap_ms']:.0f} ms: "
        "work / slots per host, the least B can wait)"
    )
    print(
        f"{'A: drain rate (completed runs/s)':<46}{f['a_drain_runs_per_s']:>18.1f}"
        f"   ({f['a_drain_seconds']:.0f} s; submissions {f['a_submissions_per_s']:.0f}/s)"
    )
