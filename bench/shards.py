"""The write path on one and on two shard databases, side by side (issue 41, docs/sharding.md).

``python -m bench.shards``: the same grain commands (a 3-step run submitted, each attempt
opened, leased and reported) driven in this process on one event loop, without Ray, for runs
of two tenants: first on one database, then with the second tenant's virtual shard on a second
database beside the first on the same server (``embedded.shard_databases``). Reported per
layout: commands/s, and CPU per command of this process (the rules, the documents, the
driver) and of the PostgreSQL server (every backend: both databases share it), so the ratio
says where the time goes. On this 2-core machine both databases share the cores with the
driver; on a machine with a core per database and more drivers, the same command gives the
scaling figure. Not the HTTP end to end (``--only e2e``): the write path's share of it.

``e2e`` (``python -m bench --only shards``): the HTTP end to end (``bench.e2e``: submissions
over HTTP, worker processes, the scheduler) on one database and on two, each on fresh
databases of the same server, the virtual shards spread over them (``runcontrol up --shards
2``'s layout) and the runs submitted by two tenants in turn, one on each database.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from runcontrol import embedded
from runcontrol.bootstrap import build
from runcontrol.config import Settings
from runcontrol.domain import Principal, Role, WorkflowDefinition
from runcontrol.grain import RunGrain
from runcontrol.ids import new_run_id
from runcontrol.store import Database
from runcontrol.store.shards import Shards

from . import cpu, e2e
from .common import private_database
from .inprocess import _drive, _each, _submit

STEPS = 3
SECOND = 600  # the second tenant's virtual shard: on the second database with two


def _layout(urls: list[str], pool_size: int) -> Shards:
    shards = Shards([Database(u, pool_size=pool_size) for u in urls], pool_size=pool_size)
    if len(urls) > 1:
        with shards.first.db.system_tx() as conn:
            conn.execute(text("UPDATE vshards SET database = 1 WHERE vshard >= 512"))
            conn.execute(text("UPDATE directory_version SET version = version + 1"))
    return shards


def measure(urls: list[str], *, runs: int, drivers: int, pool_size: int = 8) -> dict[str, float]:
    """``runs`` runs of two tenants (the second on the last of ``urls``' databases)."""
    shards = _layout(urls, pool_size)
    settings = Settings.model_validate({"pool_size": pool_size})
    container = build(settings, db=shards.db, migrate=False)
    definition = WorkflowDefinition.from_dict(
        {"workflowId": "bench", "steps": [{"agentId": f"a{i}"} for i in range(STEPS)]}
    )
    tenants = []
    for vshard in (1, SECOND):
        tenant = f"bench-{uuid.uuid4().hex[:8]}"
        if len(urls) > 1:
            shards.directory.place(tenant, vshard)
        container.releases.publish(tenant, definition, "bench", container.env.clock.now())
        tenants.append(tenant)
    roots = [os.getpid(), cpu.postmaster_pid(urls[0])]
    figures: dict[str, float] = {}

    async def scenario() -> None:
        owners = [tenants[n % 2] for n in range(runs)]
        grains = [RunGrain(container.env, t, new_run_id(t, shards.vshard_for)) for t in owners]

        async def submit(grain: RunGrain) -> None:
            principal = Principal("bench", grain.tenant_id, "bench", frozenset({Role.REQUESTER}))
            await _submit(grain, principal)

        await _each(grains, drivers, submit)
        before = cpu.cpu_by_process(os.getpid(), roots=roots)
        started = time.perf_counter()
        commands = sum(await _each(grains, drivers, _drive))
        seconds = time.perf_counter() - started
        after = cpu.cpu_by_process(os.getpid(), roots=roots)
        mine = _seconds(after, {os.getpid()}) - _seconds(before, {os.getpid()})
        server = _seconds(after, None) - _seconds(before, None) - mine
        figures["commands"] = commands
        figures["commands_per_s"] = commands / seconds
        figures["driver_cpu_ms_per_command"] = 1000 * mine / commands
        figures["postgres_cpu_ms_per_command"] = 1000 * server / commands
        for shard in shards.all():
            figures[f"commit_statements_db{shard.index}"] = shard.store.statements_sent
        await container.store.close()

    try:
        asyncio.run(scenario())
    finally:
        shards.dispose()
    return figures


def _seconds(snapshot: cpu.Snapshot, pids: set[int] | None) -> float:
    return sum(s for pid, (_, s) in snapshot.items() if pids is None or pid in pids)


def run(owner_url: str, *, runs: int = 400, drivers: int = 16) -> dict[str, Any]:
    urls = embedded.shard_databases(owner_url, 2)
    for url in urls:
        Database(url).migrate()
    one = measure(urls[:1], runs=runs, drivers=drivers)
    two = measure(urls, runs=runs, drivers=drivers)
    return {
        "one_database": one,
        "two_databases": two,
        "ratio": two["commands_per_s"] / one["commands_per_s"],
    }


def e2e_side_by_side(
    owner_url: str, *, order: Sequence[int] = (1, 2), **measure: Any
) -> dict[str, Any]:
    """``bench.e2e.run`` (``measure``: its options) on one database and on two, in ``order``
    (the legs' order, to see what running first costs): fresh databases each, two tenants
    submitting in turn (with two databases, one on each)."""
    figures: dict[str, Any] = {"order": list(order)}
    for count in order:
        first = _fresh_database(owner_url, f"e2e_{count}db_{uuid.uuid4().hex[:6]}")
        urls = embedded.shard_databases(first, count)
        print(f"end to end on {count} database(s) ...", flush=True)
        figures[f"{count}_databases"] = e2e.run(
            first, databases=urls if count > 1 else (), tenants=2, **measure
        )
    one, two = figures["1_databases"], figures["2_databases"]
    figures["ratio"] = two["completed_runs_per_s"] / max(one["completed_runs_per_s"], 1e-9)
    return figures


def _fresh_database(owner_url: str, name: str) -> str:
    admin = create_engine(owner_url, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE DATABASE {name}"))
    admin.dispose()
    return make_url(owner_url).set(database=name).render_as_string(hide_password=False)


def e2e_report(figures: dict[str, Any]) -> None:
    one, two = figures["1_databases"], figures["2_databases"]
    print(f"{'end to end over HTTP (' + one['transport'] + ' workers)':<44}", end="")
    print(f"{'1 database':>14}{'2 databases':>14}")
    for key, label in (
        ("completed_runs_per_s", "completed 3-step runs/s"),
        ("submit_to_completed_p50_ms", "submit->completed p50 ms"),
        ("submit_to_completed_p99_ms", "submit->completed p99 ms"),
        ("not_completed", "runs not completed"),
    ):
        print(f"{label:<44}{one[key]:>14.1f}{two[key]:>14.1f}")
    print(f"{'runs ended per database':<44}", end="")
    for figures_of in (one, two):
        print(f"{' / '.join(map(str, figures_of['ended_by_database'])):>14}", end="")
    print()
    print("CPU ms per completed run, by process")
    a, b = one["cpu_ms_per_completed_run"], two["cpu_ms_per_completed_run"]
    for kind in dict.fromkeys([*a, *b]):
        print(f"{'  ' + kind:<44}{a.get(kind, 0.0):>14.2f}{b.get(kind, 0.0):>14.2f}")
    print(f"{'2 / 1 databases (completed runs/s)':<44}{figures['ratio']:>28.2f}")
    print(f"load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} cores")


def report(figures: dict[str, Any]) -> None:
    one, two = figures["one_database"], figures["two_databases"]
    print(f"{'write path (in-process grains)':<40}{'1 database':>14}{'2 databases':>14}")
    for key, label in (
        ("commands_per_s", "commands/s"),
        ("driver_cpu_ms_per_command", "  this process: CPU ms/command"),
        ("postgres_cpu_ms_per_command", "  PostgreSQL: CPU ms/command"),
    ):
        print(f"{label:<40}{one[key]:>14.2f}{two[key]:>14.2f}")
    print(f"{'2 / 1 databases':<40}{figures['ratio']:>28.2f}")
    print(f"load average {' / '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} cores")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.shards", description=__doc__)
    parser.add_argument("--runs", type=int, default=400)
    parser.add_argument("--drivers", type=int, default=16)
    args = parser.parse_args()
    with private_database() as url:
        report(run(url, runs=args.runs, drivers=args.drivers))


if __name__ == "__main__":
    main()
