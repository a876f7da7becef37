"""The service under chaos: what ``runcontrol up`` starts, plus a fault channel on stdin.

    python tests/chaos/service.py HTTP_PORT GRPC_PORT

Settings come from the environment (``RUNCONTROL_*``; ``RUNCONTROL_DATABASE_URL`` is the owner
URL of a database the driver has migrated, ``RUNCONTROL_SHARDS__DATABASES`` lists more). It
starts a local Ray runtime, the run hosts, the scheduler and the Serve app as ``runcontrol up``
does, and ``CHAOS_WORKERS`` supervised reference workers for each of ``CHAOS_TENANTS``, then
prints ``{"ready": ...}``. Each stdin line is a fault to inject; each gets one JSON line back:

    kill-host K      ray.kill of run host K (it restarts: max_restarts=-1)
    kill-scheduler   ray.kill of the scheduler actor (it restarts)
    kill-replica     ray.kill of the Serve replica (Serve's controller starts another)
    kill-node        (CHAOS_NODES=2) removal of the second Ray node, with run host 1 on it

With ``CHAOS_NODES=2`` the Ray runtime is a two-node ``ray.cluster_utils.Cluster`` on this
machine (as ``tests/actors/two_node_cluster.py`` starts it): run host 0, the scheduler and
Serve's proxy on the head, run host 1 on the second node; after the second node is removed,
Ray restarts host 1 on the head (its slot there is free once the service is up).

SIGTERM stops it as it stops ``runcontrol up`` (``actors.service.drain_service``): the edge
refuses new work, workers finish the attempts in hand, the edge and the hosts their commands in
flight, within ``drain.grace_seconds``; then Serve and Ray shut down. It prints the drain's
report as ``{"drained": ...}``. End of stdin (the driver died) stops it too.

The workers' client records every fenced command refused as stale (``CHAOS_REFUSALS``, one JSON
line each) so the driver can find each in the audit, and, with probability
``CHAOS_ZOMBIE_RATE`` per report, first sends the same report with a stale fencing token: a
zombie worker whose refusal must be audited and whose report must change nothing.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import random
import signal
import sys
import threading
import time
from typing import Any

import ray
from reference_worker import EchoExecutor, ReferenceWorker

from actors.placement import NAMESPACE, SCHEDULER_NAME, host_name
from actors.run_host import host_config, make_router
from actors.service import drain_service, start_ray, start_service, stop_service
from runcontrol.cli.demo import DEMO_WORKFLOW, start_workers, stop_workers
from runcontrol.client import RunControlClient
from runcontrol.commands import ReportOutcome, new_command_id
from runcontrol.config import Settings
from runcontrol.domain import WorkerIdentity, errors
from runcontrol.workers.protocol import SessionDown, SessionUp

log = logging.getLogger("chaos.service")

# Refusals of a fenced command by a stale lease: each must have its audit row.
STALE = frozenset({"stale-fencing-token", "lease-not-held", "lease-expired"})


def say(**answer: Any) -> None:
    print(json.dumps(answer), flush=True)


class RecordingClient:
    """The workers' session transport: records stale refusals of reports and plays a zombie
    now and then (a report with the previous fencing token, sent on its own)."""

    def __init__(self, inner: RunControlClient, path: str, zombie_rate: float) -> None:
        self.inner = inner
        self.path = path
        self.zombie_rate = zombie_rate
        self._zombie_sent = False
        self.rng = random.Random()
        self._lock = threading.Lock()

    def _record(self, command: ReportOutcome, outcome: str, *, zombie: bool) -> None:
        line = json.dumps(
            {
                "run_id": str(command.run_id),
                "tenant": command.tenant_id,
                "attempt_id": str(command.attempt_id),
                "fencing_token": command.fencing_token,
                "holder": command.holder,
                "outcome": outcome,
                "zombie": zombie,
                "at": time.time(),
            }
        )
        with self._lock, open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    async def hosts(self) -> int:
        return await self.inner.hosts()

    async def exchange(self, host: int, up: SessionUp) -> SessionDown:
        reports = {c.command_id: c for c in up.commands if isinstance(c, ReportOutcome)}
        for command in reports.values():
            # The first report always plays the zombie (with a rate above 0), so every run
            # checks at least one: at 2 % of ~200 reports, some runs had none at all.
            first, self._zombie_sent = not self._zombie_sent, True
            if self.zombie_rate > 0 and (first or self.rng.random() < self.zombie_rate):
                await self._zombie(command)
        down = await self.inner.exchange(host, up)
        for answer in down.answers:
            report = reports.get(answer.command_id)
            code = getattr(answer.value, "code", None)
            if report is not None and not answer.ok and code in STALE:
                self._record(report, code, zombie=False)
        return down

    async def _zombie(self, command: ReportOutcome) -> None:
        stale = dataclasses.replace(
            command, fencing_token=command.fencing_token - 1, command_id=new_command_id()
        )
        try:
            await self.inner.send(stale)
        except errors.RunControlError as exc:
            if exc.code != "unavailable":  # unknown whether it arrived: not counted
                self._record(stale, exc.code, zombie=True)
            return
        except Exception:
            return
        self._record(stale, "accepted", zombie=True)


class TwoNodes:
    """A head and a second node on this machine; run host 1 lives on the second."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        from actors.ingress import use_fast_ingress

        os.environ.setdefault("RAY_worker_maximum_startup_concurrency", "4")
        use_fast_ingress(local_ports=True)  # before the nodes start: they inherit it
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={
                "num_cpus": os.cpu_count() or 2,
                "include_dashboard": False,
                "resources": {"head": 1, "hostnode": 1},
            },
        )
        self.second: Any = self.cluster.add_node(num_cpus=1, resources={"hostnode": 1})
        ray.init(
            address=self.cluster.address,
            namespace=NAMESPACE,
            log_to_driver=False,
            configure_logging=False,
        )
        self.cluster.wait_for_nodes()

        # Host 1 needs the one "hostnode" slot of a node; a placeholder holds the head's while
        # the hosts are created, so host 1 can only land on the second node. Its removal then
        # lets host 1 restart on the head.
        @ray.remote(num_cpus=0, resources={"head": 0.01, "hostnode": 1})
        class Placeholder:
            def ready(self) -> bool:
                return True

        self._placeholder = Placeholder.remote()  # type: ignore[attr-defined]
        ray.get(self._placeholder.ready.remote(), timeout=120)

    @staticmethod
    def host_options(k: int) -> dict[str, Any]:
        return {"resources": {"head": 0.01} if k == 0 else {"hostnode": 1}}

    def placed(self) -> None:
        ray.kill(self._placeholder)

    def node_of(self, name: str) -> str:
        import ray._private.state as ray_state

        handle = ray.get_actor(name, namespace=NAMESPACE)
        node = ray_state.actors(handle._actor_id.hex())["Address"]["NodeID"]
        head = self.cluster.head_node.node_id
        return "head" if node == head else "second"

    def kill_second(self) -> dict[str, Any]:
        if self.second is None:
            return {"ok": False, "error": "the second node is already gone"}
        placed = self.node_of(host_name(1))
        self.cluster.remove_node(self.second)
        self.second = None
        return {"ok": True, "host_1_was_on": placed}

    def shutdown(self) -> None:
        self.cluster.shutdown()


NODES: TwoNodes | None = None


def inject(line: str) -> dict[str, Any]:
    """One fault from the driver: kill an actor (or a node), answer what was killed."""
    started = time.monotonic()
    parts = line.split()
    kind = parts[0] if parts else ""
    if kind == "kill-node":
        if NODES is None:
            return {"fault": kind, "ok": False, "error": "one node only (CHAOS_NODES=1)"}
        done = NODES.kill_second()
        return {"fault": kind, **done, "s": round(time.monotonic() - started, 3)}
    if kind == "kill-host":
        name, namespace = host_name(int(parts[1])), NAMESPACE
    elif kind == "kill-scheduler":
        name, namespace = SCHEDULER_NAME, NAMESPACE
    elif kind == "kill-replica":
        replicas = [
            a
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith("SERVE_REPLICA::") and "RunControlApi" in a["name"]
        ]
        if not replicas:
            return {"fault": kind, "ok": False, "error": "no replica found"}
        name, namespace = replicas[0]["name"], replicas[0]["namespace"]
    else:
        return {"fault": kind, "ok": False, "error": f"unknown fault {line!r}"}
    try:
        ray.kill(ray.get_actor(name, namespace=namespace), no_restart=kind == "kill-replica")
    except Exception as exc:
        return {"fault": kind, "ok": False, "error": repr(exc)}
    return {"fault": kind, "ok": True, "actor": name, "s": round(time.monotonic() - started, 3)}


def read_faults(loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
    for line in sys.stdin:
        if line.strip():
            say(**inject(line.strip()))
    loop.call_soon_threadsafe(stop.set)  # the driver is gone


def main(http_port: int, grpc_port: int) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    settings = Settings()
    owner_url = os.environ["RUNCONTROL_DATABASE_URL"]
    started = time.monotonic()
    global NODES
    if os.environ.get("CHAOS_NODES", "1") == "2":
        NODES = TwoNodes()
    else:
        start_ray()
    # Kept for the process's life: the hosts and the scheduler are not detached, and Ray
    # destroys an actor once the last handle to it is gone.
    service = start_service(
        settings,
        owner_url,
        "127.0.0.1",
        http_port,
        grpc_port=grpc_port,
        host_options=NODES.host_options if NODES else None,
        proxy_location="HeadOnly" if NODES else None,
    )
    placement: dict[str, Any] = {}
    if NODES is not None:
        NODES.placed()
        placement = {
            "nodes": 2,
            "hosts": [NODES.node_of(host_name(k)) for k in range(settings.grains.host_count)],
            "scheduler": NODES.node_of(SCHEDULER_NAME),
        }
    client = RecordingClient(
        RunControlClient(make_router(host_config(settings, owner_url))),
        os.environ["CHAOS_REFUSALS"],
        float(os.environ.get("CHAOS_ZOMBIE_RATE", "0.02")),
    )
    # CHAOS_TENANTS: the tenants served (comma-separated), CHAOS_WORKERS workers each
    tenants = os.environ.get("CHAOS_TENANTS", os.environ.get("CHAOS_TENANT", "")).split(",")
    work_s = float(os.environ.get("CHAOS_WORK_SECONDS", "0.05"))
    renew = max(settings.leases.duration_seconds / 3, 0.5)
    grace = settings.leases.renewal_grace_seconds + 5.0
    workers = [
        ReferenceWorker(
            client,
            WorkerIdentity(tenant, "chaos-worker", f"worker-{k}-{n}"),
            {s["agentId"]: EchoExecutor(s["agentId"], work_s) for s in DEMO_WORKFLOW["steps"]},
            renew_every_s=renew,
            lease_grace_s=grace,
            claim_timeout_s=5.0,
        )
        for k, tenant in enumerate(tenants)
        for n in range(int(os.environ.get("CHAOS_WORKERS", "2")))
    ]

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        threading.Thread(target=read_faults, args=(loop, stop), daemon=True).start()
        say(
            ready=True,
            pid=os.getpid(),
            startup_s=round(time.monotonic() - started, 1),
            **placement,
        )
        running = [(w.worker, w.client, w.identity) for w in workers]
        tasks = start_workers(running)
        await stop.wait()
        report = await drain_service(
            service,
            settings.drain.grace_seconds,
            lambda grace_s: stop_workers(running, tasks, grace_s),
        )
        say(drained=report)

    try:
        asyncio.run(run())
    finally:
        stop_service()
        if NODES is not None:
            NODES.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
