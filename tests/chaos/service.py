"""The service under chaos: what ``runcontrol up`` starts, plus a fault channel on stdin.

    python tests/chaos/service.py HTTP_PORT GRPC_PORT

Settings come from the environment (``RUNCONTROL_*``; ``RUNCONTROL_DATABASE_URL`` is the owner
URL of a database the driver has migrated). It starts a local Ray runtime, the run hosts, the
scheduler and the Serve app as ``runcontrol up`` does, and ``CHAOS_WORKERS`` supervised reference
workers, then prints ``{"ready": ...}``. Each stdin line is a fault to inject; each gets one JSON
line back:

    kill-host K      ray.kill of run host K (it restarts: max_restarts=-1)
    kill-scheduler   ray.kill of the scheduler actor (it restarts)
    kill-replica     ray.kill of the Serve replica (Serve's controller starts another)

SIGTERM stops it as it stops ``runcontrol up``: workers drain, then Serve and Ray shut down.
End of stdin (the driver died) stops it too.

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
from collections.abc import AsyncIterator
from typing import Any
from uuid import UUID

import ray

from actors.placement import NAMESPACE, SCHEDULER_NAME, host_name
from actors.run_host import host_config, make_router
from actors.service import start_ray, start_service, stop_service
from runcontrol.cli import DEMO_WORKFLOW, _supervise_workers
from runcontrol.client import Claim, RunControlClient
from runcontrol.commands import Command, ReportOutcome, new_command_id
from runcontrol.config import Settings
from runcontrol.domain import WorkerIdentity, errors
from runcontrol.worker import EchoExecutor, ReferenceWorker

log = logging.getLogger("chaos.service")

# Refusals of a fenced command by a stale lease: each must have its audit row.
STALE = frozenset({"stale-fencing-token", "lease-not-held", "lease-expired"})


def say(**answer: Any) -> None:
    print(json.dumps(answer), flush=True)


class RecordingClient:
    """The workers' client: records stale refusals of reports and plays a zombie now and then."""

    def __init__(self, inner: RunControlClient, path: str, zombie_rate: float) -> None:
        self.inner = inner
        self.path = path
        self.zombie_rate = zombie_rate
        self.rng = random.Random()
        self._lock = threading.Lock()

    def _record(self, command: ReportOutcome, outcome: str, *, zombie: bool) -> None:
        line = json.dumps(
            {
                "run_id": str(command.run_id),
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

    async def send(self, command: Command[Any]) -> Any:
        if isinstance(command, ReportOutcome):
            if self.rng.random() < self.zombie_rate:
                await self._zombie(command)
            try:
                return await self.inner.send(command)
            except errors.RunControlError as exc:
                if exc.code in STALE:
                    self._record(command, exc.code, zombie=False)
                raise
        return await self.inner.send(command)

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

    async def claim(
        self,
        agent_ids: list[str],
        holder: str | WorkerIdentity,
        timeout_s: float = 30.0,
        *,
        claim_id: str | None = None,
    ) -> Claim | None:
        return await self.inner.claim(agent_ids, holder, timeout_s, claim_id=claim_id)

    def watch(
        self, tenant_id: str, run_id: UUID, after_seq: int = 0, *, wait_s: float = 20.0
    ) -> AsyncIterator[dict[str, Any]]:
        return self.inner.watch(tenant_id, run_id, after_seq, wait_s=wait_s)


def inject(line: str) -> dict[str, Any]:
    """One fault from the driver: kill an actor, answer what was killed."""
    started = time.monotonic()
    parts = line.split()
    kind = parts[0] if parts else ""
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
    start_ray()
    # Kept for the process's life: the hosts and the scheduler are not detached, and Ray
    # destroys an actor once the last handle to it is gone.
    service = start_service(settings, owner_url, "127.0.0.1", http_port, grpc_port=grpc_port)
    client = RecordingClient(
        RunControlClient(make_router(host_config(settings, owner_url))),
        os.environ["CHAOS_REFUSALS"],
        float(os.environ.get("CHAOS_ZOMBIE_RATE", "0.02")),
    )
    tenant = os.environ["CHAOS_TENANT"]
    work_s = float(os.environ.get("CHAOS_WORK_SECONDS", "0.05"))
    renew = max(settings.leases.duration_seconds / 3, 0.5)
    grace = settings.leases.renewal_grace_seconds + 5.0
    workers = [
        ReferenceWorker(
            client,
            WorkerIdentity(tenant, "chaos-worker", f"worker-{n}"),
            {s["agentId"]: EchoExecutor(s["agentId"], work_s) for s in DEMO_WORKFLOW["steps"]},
            renew_every_s=renew,
            lease_grace_s=grace,
            claim_timeout_s=5.0,
        )
        for n in range(int(os.environ.get("CHAOS_WORKERS", "2")))
    ]

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        threading.Thread(target=read_faults, args=(loop, stop), daemon=True).start()
        say(ready=True, pid=os.getpid(), startup_s=round(time.monotonic() - started, 1))
        await _supervise_workers(workers, stop)

    try:
        asyncio.run(run())
    finally:
        stop_service()
        del service
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1]), int(sys.argv[2])))
