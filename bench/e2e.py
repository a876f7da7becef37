"""End to end: runs submitted over HTTP, completed by worker processes doing no work.

``python -m bench --only e2e``: N runs of 3 steps (no gate) are submitted through the real
ingress (HAProxy direct ingress, the API replica) by ``concurrency`` connections, with at most
``in_flight`` submitted runs not yet ended (a backlog of every run at once would measure
its own queue), while worker processes complete every step, with the scheduler running as in
the product. The workers, one kind per measurement (``TRANSPORTS``), each on a fresh stack:

- ``claim``: the old claim path, the figure before (``bench.claim_worker``: a claim actor call
  and a report per attempt, in the cluster);
- ``session``: the host side of the worker session alone (``bench.session_worker``, in the
  cluster, no SDK);
- ``sdk``: the worker SDK's echo app in the cluster, as a user starts it
  (``runcontrol worker --transport ray --work-seconds 0``);
- ``grpc``: the same app outside the cluster, as a user starts it (``runcontrol worker
  --transport grpc --target ... --token ...`` with a Worker token of the tenant);
- ``grpc-relay``: the same, each exchange through the ingress (``--via-ingress``), relayed by
  the API replica instead of served by the run host's own gRPC server;
- ``grpc-session``: ``bench.session_worker`` over gRPC (the host side through Serve's gRPC
  ingress, no SDK; not run by default).

Completion is read from the database (each run's terminal ``updated_at``), never by polling
runs over HTTP. Reported: completed runs/s beside the pgbench ceiling of the same run,
submit->completed p50/p99 (the client's send time to the run's terminal timestamp), the CPU
each completed run cost by process kind, and the per-run cost counted by the bench.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import httpx
import ray
from sqlalchemy import create_engine, text

from actors.scheduler import ensure_scheduler
from runcontrol.domain.shards import hashed_vshard

from . import common, counts, cpu
from .stack import Stack, api_stack

STEPS = 3
WORKER = "from actors.cli import main; raise SystemExit(main())"
TRANSPORTS = ("claim", "session", "sdk", "grpc", "grpc-relay", "grpc-session")
DEFAULT_TRANSPORTS = "claim,session,sdk,grpc"


@contextmanager
def _stopped_after(procs: list[subprocess.Popen[bytes]]) -> Iterator[None]:
    """Stop the worker processes with SIGTERM (they drain), killing those that do not end."""
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _worker_command(
    transport: str, stack: Stack, work_seconds: float = 0.0
) -> tuple[list[str], str]:
    """The command line of one worker process of ``transport`` (``TRANSPORTS``), less its
    holder, slots and agents; and its holder's prefix. ``work_seconds``: how long the SDK's
    echo app works on each attempt (``sdk`` and ``grpc``)."""
    work = f"--work-seconds={work_seconds:g}"
    cli = ["-c", WORKER, "worker"]
    if transport in ("grpc", "grpc-relay"):
        # As a user starts a worker outside the cluster: no Ray in it, a Worker token of the
        # tenant (holders ``bench-worker/bench-g{k}.{slot}``); grpc-relay: every exchange
        # relayed by the API replica, as before each host served its own (issue 42).
        target = [f"--target={stack.grpc_target}", f"--token={stack.worker_token}"]
        relay = ["--via-ingress"] if transport == "grpc-relay" else []
        return [*cli, "--transport=grpc", *target, *relay, work], "bench-g"
    if transport == "grpc-session":
        where = [f"--grpc={stack.grpc_target}", f"--token={stack.worker_token}"]
        return ["-m", "bench.session_worker", *where], "bench-worker/s"
    address = f"--address={ray.get_runtime_context().gcs_address}"
    if transport == "sdk":
        return [*cli, "--transport=ray", address, work], "bench-w"
    module = {"claim": "bench.claim_worker", "session": "bench.session_worker"}[transport]
    return ["-m", module, address], f"bench-{transport[0]}"


@contextmanager
def workers_of(
    transport: str,
    stack: Stack,
    owner_url: str,
    processes: int,
    concurrency: int,
    work_seconds: float = 0.0,
    databases: Sequence[str] = (),
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``processes`` worker processes of ``transport`` with ``concurrency`` slots each, on the
    stack's agents; stopped with SIGTERM (they drain). ``databases``: the shard databases
    listed (``RUNCONTROL_SHARDS__DATABASES``), if several."""
    args, holder = _worker_command(transport, stack, work_seconds)
    env = dict(os.environ, RUNCONTROL_DATABASE_URL=owner_url)
    if databases:
        env["RUNCONTROL_SHARDS__DATABASES"] = ",".join(databases)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                *args,
                f"--holder={holder}{k}",
                f"--concurrency={concurrency}",
                "--agents",
                *stack.agents,
            ],
            env=env,
            stdout=subprocess.DEVNULL,
        )
        for k in range(processes)
    ]
    with _stopped_after(procs):
        yield procs


# The load generator reads completions by run id (the primary key), only of the runs it still
# waits for: a read of every terminal run of the tenant, ten times a second, cost PostgreSQL
# more per run the longer the bench ran (an index scan over the tenant's runs each time), and
# that CPU was counted as the server's.
_TERMINAL = text(
    "SELECT run_id, state, extract(epoch FROM updated_at) FROM runs "
    "WHERE run_id = ANY(CAST(:ids AS uuid[])) AND state IN ('Completed', 'Failed', 'Cancelled')"
)


def _terminal(engine: Any, ids: Collection[str]) -> dict[str, tuple[str, float]]:
    """Which of ``ids`` are terminal runs: (state, epoch seconds of its terminal commit).
    ``engine``: one database's, or a tuple of every shard database's (each is read)."""
    if not ids:
        return {}
    rows = []
    for each in engine if isinstance(engine, tuple) else (engine,):
        with each.connect() as conn:
            rows += conn.execute(_TERMINAL, {"ids": list(ids)}).all()
    return {str(r[0]): (str(r[1]), float(r[2])) for r in rows}


def _analyze(engine: Any) -> None:
    """Statistics for the warm-up's rows, as autovacuum gathers them within a database's first
    minutes. Without them the sessions' first generic plans, made on empty tables, pick any
    index that matches row-level security's tenant predicate (a tie at one row): the run's
    update then scanned the tenant's runs (``ix_runs_workflow``) until autovacuum's analyse
    invalidated the plans, which a one-minute bench on a new database never saw."""
    with engine.begin() as conn:
        conn.execute(text("ANALYZE"))


async def _submit(
    stack: Stack,
    runs: int,
    concurrency: int,
    sent: dict[str, float],
    errors: list[int],
    *,
    engine: Any = None,
    in_flight: int = 0,
    tenants: Sequence[dict[str, str]] = (),
) -> None:
    """Submit ``runs`` runs over HTTP from ``concurrency`` connections; ``sent`` gets each
    accepted run's send time (epoch seconds). ``tenants``: the Requesters' headers the runs
    take in turn (else the stack's tenant's). With ``in_flight``, a submission waits while
    that many submitted runs have not ended (those still open read from the database every
    0.1 s), so the latency measured is the path's, not that of a backlog of every run at once."""
    body = {"workflowId": stack.workflow_id, "releaseAlias": "latest", "modelProfileId": "m"}
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    counter = iter(range(runs))
    open_runs: set[str] = set()  # accepted, not seen ended
    posting = 0  # submissions not answered yet
    polling: asyncio.Task[None] | None = None

    async def poll() -> None:  # one read for all the connections waiting
        nonlocal polling
        await asyncio.sleep(0.1)
        ended = await asyncio.to_thread(_terminal, engine, list(open_runs))
        open_runs.difference_update(ended)
        polling = None

    async with httpx.AsyncClient(base_url=stack.base, limits=limits, timeout=60) as client:

        async def connection() -> None:
            nonlocal posting, polling
            for i in counter:
                while in_flight and len(open_runs) + posting >= in_flight:
                    if polling is None:
                        polling = asyncio.create_task(poll())
                    await asyncio.shield(polling)
                posting += 1
                started = time.time()
                try:
                    response = await client.post(
                        "/factory/runs",
                        json={**body, "input": {"i": i}},
                        headers={
                            **(tenants[i % len(tenants)] if tenants else stack.headers),
                            "Idempotency-Key": f"e2e-{uuid.uuid4()}",
                        },
                    )
                finally:
                    posting -= 1
                if response.status_code == 202:
                    run_id = response.json()["runId"]
                    sent[run_id] = started
                    open_runs.add(run_id)
                else:
                    errors.append(response.status_code)

        await asyncio.gather(*(connection() for _ in range(concurrency)))


async def _submit_paced(
    stack: Stack,
    runs: int,
    rate: float,
    sent: dict[str, float],
    errors: list[int],
    *,
    tenants: Sequence[dict[str, str]] = (),
) -> None:
    """Submit ``runs`` runs at ``rate`` a second, open loop: run ``i`` is sent at ``i / rate``
    seconds whether or not the earlier ones were answered (a closed loop would slow down with
    the service and hide its queueing), each on a connection of its own from the pool."""
    body = {"workflowId": stack.workflow_id, "releaseAlias": "latest", "modelProfileId": "m"}
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=stack.base, limits=limits, timeout=60) as client:

        async def one(i: int, at: float) -> None:
            await asyncio.sleep(max(0.0, at - time.time()))
            started = time.time()
            response = await client.post(
                "/factory/runs",
                json={**body, "input": {"i": i}},
                headers={
                    **(tenants[i % len(tenants)] if tenants else stack.headers),
                    "Idempotency-Key": f"e2e-paced-{uuid.uuid4()}",
                },
            )
            if response.status_code == 202:
                sent[response.json()["runId"]] = started
            else:
                errors.append(response.status_code)

        start = time.time() + 0.1
        await asyncio.gather(*(one(i, start + i / rate) for i in range(runs)))


def _paced(
    stack: Stack,
    engine: Sequence[Any],
    runs: int,
    rate: float,
    tenants: Sequence[dict[str, str]],
) -> dict[str, Any]:
    """Submit->completed at a fixed ``rate`` (a fraction of the peak just measured): what a
    user sees of a service that is not saturated, beside the peak's queueing."""
    sent: dict[str, float] = {}
    errors: list[int] = []
    asyncio.run(_submit_paced(stack, runs, rate, sent, errors, tenants=tenants))
    done = _wait_terminal(engine, set(sent), patience_s=60)
    latencies = [
        1000 * (done[r][1] - sent[r]) for r in sent if done.get(r, ("",))[0] == "Completed"
    ]
    return {
        "rate_per_s": rate,
        "submitted": len(sent),
        "submit_errors": len(errors),
        "completed": len(latencies),
        "submit_to_completed_p50_ms": common.percentile(latencies, 50),
        "submit_to_completed_p99_ms": common.percentile(latencies, 99),
    }


def _wait_terminal(engine: Any, expected: set[str], patience_s: float) -> dict:
    """Read which of ``expected`` are terminal every half second until all are or none has
    ended for ``patience_s`` (then what ended is reported, and the rest as missing)."""
    done: dict[str, tuple[str, float]] = {}
    last_count, last_change = -1, time.monotonic()
    while True:
        done.update(_terminal(engine, expected.difference(done)))
        if len(done) == len(expected):
            return done
        if len(done) != last_count:
            last_count, last_change = len(done), time.monotonic()
        elif time.monotonic() - last_change > patience_s:
            return done
        time.sleep(0.5)


def run(
    owner_url: str,
    *,
    runs: int = 2000,
    concurrency: int = 32,
    workers: int = 1,
    worker_concurrency: int = 32,
    warmup: int = 50,
    in_flight: int = 64,
    transport: str = "claim",
    databases: Sequence[str] = (),
    tenants: int = 1,
    paced: float = 0.0,
) -> dict[str, Any]:
    """One measurement with ``transport``'s workers (``TRANSPORTS``) on a fresh stack.
    ``databases``: several shard databases (the first ``owner_url``), the virtual shards
    spread over them; ``tenants``: the runs submitted by that many tenants in turn, each
    after the first on the next database (``bench.shards``: 1 against 2 databases). The
    rows, transactions and NOTIFYs counted are the first database's. ``paced``: then, on the
    same stack, a quarter as many runs submitted at that fraction of the peak rate measured,
    for submit->completed away from saturation (the figures under ``paced``)."""
    roots = cpu.own_processes(owner_url)
    urls = tuple(databases) or (owner_url,)
    engine = tuple(create_engine(u) for u in urls)
    listed = (
        {"database_url": owner_url, "shards": {"databases": list(databases)}} if databases else None
    )
    # No trivial route beside the API app: with one Serve application a gRPC worker needs no
    # ``application`` metadata, as under ``runcontrol up``.
    with api_stack(
        owner_url, steps=STEPS, trivial=False, settings=listed, api_settings=listed
    ) as stack:
        scheduler = ensure_scheduler(stack.settings, owner_url)
        headers = [stack.headers] + [
            stack.another_tenant(_tenant_on(hashed_vshard(stack.tenant) + n))[1]
            for n in range(1, tenants)
        ]
        try:
            with workers_of(
                transport, stack, owner_url, workers, worker_concurrency, databases=databases
            ) as procs:
                pids = {p.pid for p in procs}
                warm: dict[str, float] = {}
                asyncio.run(
                    _submit(stack, warmup, min(concurrency, warmup), warm, [], tenants=headers)
                )
                _wait_terminal(engine, set(warm), patience_s=120)
                for each in engine:
                    _analyze(each)
                rows_before = counts.rows(owner_url)
                hosts_before = stack.host_stats()
                notifies = counts.Notifies(owner_url)
                tx_before = counts.transactions(owner_url)
                cpu_before = cpu.cpu_by_process(os.getpid(), pids, roots)
                sent: dict[str, float] = {}
                errors: list[int] = []
                started = time.time()
                asyncio.run(
                    _submit(
                        stack,
                        runs,
                        concurrency,
                        sent,
                        errors,
                        engine=engine,
                        in_flight=in_flight,
                        tenants=headers,
                    )
                )
                submitted = time.time()
                done = _wait_terminal(engine, set(sent), patience_s=60)
                cpu_after = cpu.cpu_by_process(os.getpid(), pids, roots)
                tx_after = counts.transactions(owner_url)
                hosts_after = stack.host_stats()
                rows_after = counts.rows(owner_url)  # what the relay wrote after counts too
                notifies.close()
                peak = len(sent) / max(
                    max((t for _, t in done.values()), default=0) - started, 1e-9
                )
                at_rate = (
                    _paced(stack, engine, max(runs // 4, 10), paced * peak, headers)
                    if paced > 0 and done
                    else None
                )
        finally:
            ray.kill(scheduler)
    # where the runs are: each database's share of the runs submitted
    by_database = [len(_terminal(each, list(sent))) for each in engine]
    for each in engine:
        each.dispose()
    ended = {r: done[r] for r in sent if r in done}
    completed = [r for r, (state, _) in ended.items() if state == "Completed"]
    finished_at = max((t for _, t in ended.values()), default=submitted)
    latencies = [1000 * (ended[r][1] - sent[r]) for r in completed]

    def host_delta(key: str) -> int:
        return sum(a[key] - b[key] for a, b in zip(hosts_after, hosts_before, strict=True))

    per_run = max(len(completed), 1)
    return {
        "runs": runs,
        "steps": STEPS,
        "connections": concurrency,
        "worker_processes": workers,
        "worker_concurrency": worker_concurrency,
        "max_runs_in_flight": in_flight,
        "submitted": len(sent),
        "submit_errors": len(errors),
        "completed": len(completed),
        "not_completed": len(sent) - len(completed),
        "seconds": finished_at - started,
        "submissions_per_s": len(sent) / (submitted - started),
        "completed_runs_per_s": len(completed) / max(finished_at - started, 1e-9),
        "submit_to_completed_p50_ms": common.percentile(latencies, 50),
        "submit_to_completed_p99_ms": common.percentile(latencies, 99),
        "host_commands_per_run": host_delta("commands") / per_run,
        "host_reads_per_run": host_delta("reads") / per_run,
        "transport": transport,
        "databases": len(urls),
        "ended_by_database": by_database,
        "tenants": tenants,
        # the per-run cost (bench-counted): actor calls the hosts served, every transaction
        # of the database (the bench's own few polls included), commit statements the hosts
        # sent (group commits) and the documents in them with their mean size in bytes, the
        # NOTIFYs sent (by channel), the rows written (by table: bench/counts.py)
        "host_calls_per_run": host_delta("calls") / per_run,
        "host_exchanges_per_run": host_delta("exchanges") / per_run,
        "host_turns_per_run": host_delta("turns") / per_run,  # several commands of a run
        "transactions_per_run": (tx_after - tx_before) / per_run,
        "commit_statements_per_run": host_delta("commit_groups") / per_run,
        "commit_documents_per_run": host_delta("commit_documents") / per_run,
        "commit_document_bytes": host_delta("commit_bytes")
        / max(host_delta("commit_documents"), 1),
        "notifies_per_run": notifies.count / per_run,
        "notifies_per_run_by_channel": {
            c: n / per_run for c, n in sorted(notifies.by_channel.items())
        },
        "rows_per_run": counts.rows_per_unit(rows_before, rows_after, len(completed)),
        "cpu_ms_per_completed_run": cpu.server_side(
            cpu.ms_per_unit(cpu_before, cpu_after, len(completed))
        ),
        "load_average": os.getloadavg(),
        "paced": at_rate,
    }


def _tenant_on(vshard: int) -> str:
    """A new tenant whose virtual shard (the hash of its id) is ``vshard`` modulo 64. The
    virtual shards spread (shard ``v`` on database ``v % N``, N dividing 64), the tenant is on
    the database ``vshard`` is on: the first tenant's shard plus ``n``, ``n`` databases on."""
    return next(
        name
        for name in (f"bench-{uuid.uuid4().hex[:8]}" for _ in iter(int, 1))
        if hashed_vshard(name) % 64 == vshard % 64
    )


def report(figures: dict[str, Any], ceiling: float) -> None:
    rate = figures["completed_runs_per_s"]
    print()
    print(
        f"end to end: {figures['completed']} of {figures['runs']} runs x {STEPS} steps completed "
        f"({figures['not_completed']} not, {figures['submit_errors']} submissions refused); "
        f"{figures['connections']} HTTP connections, {figures['worker_processes']} worker "
        f"process(es) x {figures['worker_concurrency']} slots, at most "
        f"{figures['max_runs_in_flight']} runs in flight; load average "
        f"{' / '.join(f'{x:.2f}' for x in figures['load_average'])}"
    )
    print(f"{'figure':<44}{'value':>14}{'ceiling':>14}{'ratio':>8}")
    print(f"{'completed 3-step runs/s vs pgbench':<44}{rate:>14.1f}{ceiling:>14.0f}", end="")
    print(f"{rate / ceiling:>8.3f}")
    print(f"{'  submissions/s meanwhile':<44}{figures['submissions_per_s']:>14.1f}")
    print(
        f"{'submit->completed p50 / p99 ms':<44}"
        f"{figures['submit_to_completed_p50_ms']:>7.0f} / "
        f"{figures['submit_to_completed_p99_ms']:<6.0f}"
    )
    if paced := figures.get("paced"):
        label = f"  the same at {paced['rate_per_s']:.0f} runs/s (paced), p50 / p99"
        print(
            f"{label:<44}"
            f"{paced['submit_to_completed_p50_ms']:>7.0f} / "
            f"{paced['submit_to_completed_p99_ms']:<6.0f}"
            f"  ({paced['completed']} of {paced['submitted']} completed)"
        )
    print(
        f"{'host commands / host reads per run':<44}"
        f"{figures['host_commands_per_run']:>7.1f} / {figures['host_reads_per_run']:<6.1f}"
    )
    print(f"per-run cost ({figures['transport']} workers):")
    for key, label in (
        ("host_calls_per_run", "actor calls served by the hosts"),
        ("host_exchanges_per_run", "session exchanges (by actor call or not)"),
        ("host_turns_per_run", "turns deciding several commands of a run"),
        ("transactions_per_run", "database transactions"),
        ("commit_statements_per_run", "commit statements (group commits)"),
        ("commit_documents_per_run", "committed documents (commands)"),
        ("commit_document_bytes", "  bytes per document"),
        ("notifies_per_run", "NOTIFYs sent"),
    ):
        print(f"  {label:<42}{figures[key]:>10.1f}")
    for channel, n in figures["notifies_per_run_by_channel"].items():
        print(f"    {channel:<40}{n:>10.2f}")
    counts.print_rows(figures["rows_per_run"])
    cpu.print_ms_per_unit("CPU per completed run, by process", figures["cpu_ms_per_completed_run"])
