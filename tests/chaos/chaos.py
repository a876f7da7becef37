"""The chaos driver: runs under load while faults are injected, then the invariants checked.

It owns a PostgreSQL (``pg.py``) and runs the service in a child process (``service.py``: Ray,
run hosts, scheduler, the Serve app, reference workers), so it can crash the one and SIGTERM the
other. Over real HTTP it submits ``runs`` runs of the demo workflow (``plan`` -> ``apply``,
shared-write behind an approval gate -> ``report``), each with a budget reservation, keeping at
most ``in_flight`` unfinished; a scripted reviewer approves every pending request. Meanwhile it
injects faults of five kinds:

    run-host       ray.kill of one run host (restarts; max_restarts=-1)
    scheduler      ray.kill of the scheduler actor (restarts)
    serve-replica  ray.kill of the API replica (Serve starts another)
    postgres       pg_ctl stop -m immediate (a crash), the scheduler and a run host killed while
                   it is down (they restart during the outage), a few seconds later start
    service        SIGTERM of the whole service (workers drain, Serve and Ray stop), start again
    node           (``nodes=2``) removal of the second Ray node, which hosts run host 1

``nodes=2`` runs the service on two Ray nodes of this machine (``service.py``, ``TwoNodes``)
and adds the sixth kind; every invariant is the same.

``mode="each"``: one fault of each kind, in a random order, spread over the submissions.
``mode="random"``: a random kind after a random gap, until every run has been submitted.

Recovery after a fault: the seconds from the fault until ``/health/ready`` answers 200 again
*and* one more run has completed than had when the fault struck (or no run is left unfinished).

Afterwards ``check`` reads the database as its owner and lists every breach of the invariants.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
from chaos_checks import TERMINAL, check, scheduler_processes, stuck_publication, wait_published
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.pool import NullPool

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
KINDS = ("run-host", "scheduler", "serve-replica", "postgres", "service")
NODE_KINDS = (*KINDS, "node")  # two nodes: the second one is removed too
PROJECT = "chaos"
SECRET = "chaos-" + "0123456789abcdef" * 4

# The service's settings: short leases and frequent sweeps, so a lost worker's attempt comes
# back within seconds; every other option keeps its default.
SERVICE_ENV = {
    "RUNCONTROL_LEASES__DURATION_SECONDS": "10",
    "RUNCONTROL_LEASES__RENEWAL_GRACE_SECONDS": "2",
    "RUNCONTROL_RETRIES__BASE_DELAY_SECONDS": "0.1",
    "RUNCONTROL_RETRIES__MAX_DELAY_SECONDS": "1",
    "RUNCONTROL_SCHEDULER__LEASE_EXPIRY_INTERVAL": "1",
    "RUNCONTROL_SCHEDULER__DISPATCH_SWEEP_INTERVAL": "1",
    "RUNCONTROL_SCHEDULER__OUTBOX_RELAY_INTERVAL": "1",
    "RUNCONTROL_SCHEDULER__APPROVAL_EXPIRY_INTERVAL": "5",
    "RUNCONTROL_BUDGET__TENANT_LIMIT_USD": "1000000000",
    "RUNCONTROL_GRAINS__HOST_COUNT": "2",
    "RUNCONTROL_AUTH__HS256_SECRET": SECRET,
    # a replica being replaced need not drain for 30 s here
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
}
HOST_COUNT = 2


@dataclass
class ChaosOptions:
    runs: int = 80
    mode: str = "each"  # or "random"
    in_flight: int = 24
    seed: int = field(default_factory=lambda: random.randrange(1 << 30))
    gap_s: tuple[float, float] = (5.0, 25.0)  # mode "random": pause between faults
    pg_outage_s: tuple[float, float] = (1.0, 4.0)
    recover_timeout_s: float = 180.0
    settle_timeout_s: float = 300.0
    zombie_rate: float = 0.02
    work_s: float = 0.05
    workers: int = 2
    nodes: int = 1  # 2: a second Ray node, removed as a sixth kind of fault
    # The fault kinds injected (default: every kind the node count allows).
    only_kinds: tuple[str, ...] | None = None

    @property
    def kinds(self) -> tuple[str, ...]:
        if self.only_kinds is not None:
            return self.only_kinds
        return NODE_KINDS if self.nodes == 2 else KINDS


@dataclass
class Fault:
    kind: str
    at_s: float  # since the start of the load
    in_flight: int  # runs accepted and not yet terminal when it struck
    detail: dict[str, Any]
    recovered_s: float | None = None  # None: not within recover_timeout_s


@dataclass
class Tally:
    accepted: dict[str, str] = field(default_factory=dict)  # idempotency key -> run id
    submit_resends: int = 0
    submit_draining: int = 0  # of them, answered 503 draining (a service stopping)
    submit_refused: list[str] = field(default_factory=list)
    decided: int = 0
    decide_refused: dict[str, int] = field(default_factory=dict)
    decide_errors: list[str] = field(default_factory=list)
    terminal: int = 0
    completed: int = 0
    states: dict[str, int] = field(default_factory=dict)


def free_port() -> int:
    from actors.ingress import free_port as pick

    return pick()


def percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = min(len(ordered) - 1, max(0, round(p / 100 * (len(ordered) - 1))))
    return round(ordered[k], 1)


def demo_request(i: int) -> dict[str, Any]:
    """The ``i``-th submission of the demo workflow (a budget reservation each)."""
    return {
        "workflowId": "demo-review",
        "releaseAlias": "latest",
        "modelProfileId": "code-agent",
        "input": {"repository": "example/repo", "revision": f"r{i}"},
        "limits": {"maxCostUsd": 1, "maxMinutes": 45},
    }


async def approve_pending(
    http: httpx.AsyncClient, headers: dict[str, str], reason: str
) -> AsyncIterator[httpx.Response]:
    """The reviewer (``headers``) approves every request pending; each decision's answer."""
    r = await http.get(
        "/factory/approvals", params={"state": "Pending", "limit": 200}, headers=headers
    )
    for a in r.json()["items"] if r.status_code == 200 else []:
        yield await http.post(
            f"/factory/approvals/{a['approvalId']}/decision",
            json={
                "decision": "approve",
                "version": a["version"],
                "proposalHash": a["proposalHash"],
                "reason": reason,
            },
            headers={**headers, "Idempotency-Key": f"decide-{a['approvalId']}"},
        )


# ---------------------------------------------------------------------- the service process


class ServiceProcess:
    def __init__(
        self, env: dict[str, str], http_port: int, grpc_port: int, log: Path, root: Path = ROOT
    ) -> None:
        self.env = env
        self.root = root  # the tree whose service.py runs (upgrade_check.py: a previous release)
        self.ports = (http_port, grpc_port)
        self.log_path = log
        self.proc: subprocess.Popen[str] | None = None
        self._log: IO[str] | None = None
        self.drained: dict[str, Any] | None = None  # the last drain's report
        self.ready: list[dict[str, Any]] = []  # each start's ready line (where things landed)

    def start(self, timeout_s: float = 240.0) -> float:
        """Start it and wait for its ready line; answer the seconds that took."""
        began = time.monotonic()
        self._log = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 (kept open)
        self.proc = subprocess.Popen(
            [sys.executable, str(self.root / "tests/chaos/service.py"), *map(str, self.ports)],
            cwd=self.root,  # Ray puts the driver's directory on its workers' path
            env=self.env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            start_new_session=True,  # its own process group: killable as a whole
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc, self._lines), daemon=True).start()
        answer = self._answer(timeout_s)
        if not answer.get("ready"):
            raise RuntimeError(f"the service did not start: {answer}; see {self.log_path}")
        self.ready.append(answer)
        return time.monotonic() - began

    @staticmethod
    def _read(proc: subprocess.Popen[str], lines: queue.Queue[str | None]) -> None:
        assert proc.stdout is not None
        with contextlib.suppress(ValueError):  # closed under it
            for line in proc.stdout:
                if line.startswith("{"):
                    lines.put(line)
        lines.put(None)

    def _answer(self, timeout_s: float) -> dict[str, Any]:
        """The service's next JSON line (its ready line, or a fault's answer)."""
        assert self.proc is not None
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            return {"timeout": timeout_s}
        if line is None:
            return {"exited": self.proc.wait()}
        answer: dict[str, Any] = json.loads(line)
        return answer

    def inject(self, fault: str) -> dict[str, Any]:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(fault + "\n")
        self.proc.stdin.flush()
        return self._answer(60.0)

    def terminate(self, timeout_s: float = 120.0) -> int:
        """SIGTERM, as an orchestrator stops it; SIGKILL of the group if it hangs. The drain's
        report, if the service printed one, is kept in ``drained``."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return -9
        finally:
            self._close()
        while True:
            answer = self._answer(5.0)
            if "drained" in answer:
                self.drained = answer["drained"]
            if "exited" in answer or "timeout" in answer:
                return code

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self._close()

    def _close(self) -> None:
        if self.proc is not None:
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None:
                    stream.close()
        if self._log is not None:
            self._log.close()
            self._log = None


# ---------------------------------------------------------------------- the run


class Chaos:
    def __init__(self, options: ChaosOptions, root: Path) -> None:
        from chaos_pg import CrashablePostgres

        from runcontrol.api import mint_dev_token
        from runcontrol.bootstrap import build
        from runcontrol.cli.demo import DEMO_WORKFLOW
        from runcontrol.config import Settings
        from runcontrol.domain import WorkflowDefinition
        from runcontrol.store import Database

        self.options = options
        self.rng = random.Random(options.seed)
        self.root = root
        self.tenant = f"chaos-{uuid.uuid4().hex[:8]}"
        self.pg = CrashablePostgres(root)
        db = Database(self.pg.owner_url, pool_size=2)
        db.migrate()
        container = build(Settings(), db=db, migrate=False)
        container.releases.publish(
            self.tenant,
            WorkflowDefinition.from_dict(DEMO_WORKFLOW),
            "chaos",
            container.env.clock.now(),
        )
        db.dispose()
        self.owner: Engine = create_engine(self.pg.owner_url, poolclass=NullPool)
        self.refusals = root / "refusals.jsonl"
        self.refusals.touch()
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
        env.update(SERVICE_ENV)
        env.update(
            {
                # the project, tests/ (reference_worker) and tests/chaos/ (this harness)
                "PYTHONPATH": os.pathsep.join((str(ROOT), str(HERE.parent), str(HERE))),
                "RUNCONTROL_DATABASE_URL": self.pg.owner_url,
                "CHAOS_TENANT": self.tenant,
                "CHAOS_REFUSALS": str(self.refusals),
                "CHAOS_ZOMBIE_RATE": str(options.zombie_rate),
                "CHAOS_WORK_SECONDS": str(options.work_s),
                "CHAOS_WORKERS": str(options.workers),
                "CHAOS_NODES": str(options.nodes),
            }
        )
        http_port = free_port()
        self.base_url = f"http://127.0.0.1:{http_port}"
        self.service = ServiceProcess(env, http_port, free_port(), root / "service.log")
        self.requester = mint_dev_token(
            SECRET, self.tenant, PROJECT, "alice", ["Requester"], ttl_s=86400
        )
        self.reviewer = mint_dev_token(
            SECRET, self.tenant, PROJECT, "rita", ["Reviewer"], ttl_s=86400
        )
        self.tally = Tally()
        self.faults: list[Fault] = []
        self.startups: list[float] = []
        self._began = 0.0
        self.began_wall = 0.0
        self.submitted = 0
        self._done = asyncio.Event()
        # Committed events the relay had not published a minute after the runs settled (None:
        # not waited for: the load did not settle) and what held it back then.
        self.unpublished: int | None = None
        self.publication_stuck: dict[str, Any] | None = None

    # ------------------------------------------------------------------ driving

    async def run(self) -> dict[str, Any]:
        def dump_tasks() -> None:  # kill -USR1: where each task of the driver waits
            for task in asyncio.all_tasks():
                task.print_stack(file=sys.stderr)

        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)
        self.startups.append(await asyncio.to_thread(self.service.start))
        self._began = time.monotonic()
        self.began_wall = time.time()
        async with httpx.AsyncClient(base_url=self.base_url, timeout=10.0) as http:
            helpers = [
                asyncio.create_task(self._monitor()),
                asyncio.create_task(self._review(http)),
            ]
            injector = asyncio.create_task(self._inject_faults(http))
            error = None
            settled = False
            try:
                await self._submit_all(http)
                await injector
                settled = await self._settle()
                # While the service still runs: a scheduler restarted by the last fault
                # relays what was committed before it (after the stop nothing would).
                await self._wait_published()
            except Exception as exc:  # reported with the checks, which still run
                error = repr(exc)
            finally:
                self._done.set()
                injector.cancel()
                for task in helpers:
                    await task
                await asyncio.to_thread(self.service.terminate)
        load_s = time.monotonic() - self._began
        return {"settled": settled, "error": error, "load_s": round(load_s, 1)}

    async def _wait_published(self) -> None:
        self.unpublished = await asyncio.to_thread(wait_published, self.owner, self.tenant, 60.0)
        if self.unpublished:
            self.publication_stuck = {
                **await asyncio.to_thread(stuck_publication, self.owner, self.tenant),
                "scheduler_processes": scheduler_processes(),
            }

    def close(self) -> None:
        self.service.kill()
        self.owner.dispose()
        self.pg.stop()

    def _now(self) -> float:
        return round(time.monotonic() - self._began, 2)

    def say(self, message: str) -> None:
        print(f"[chaos {self._now():7.1f}s] {message}", file=sys.stderr, flush=True)

    async def _submit_all(self, http: httpx.AsyncClient) -> None:
        headers = {"Authorization": f"Bearer {self.requester}"}
        for i in range(self.options.runs):
            self.submitted = i
            seen, since = self.tally.terminal, time.monotonic()
            while len(self.tally.accepted) - self.tally.terminal >= self.options.in_flight:
                if self.tally.terminal != seen:
                    seen, since = self.tally.terminal, time.monotonic()
                if time.monotonic() - since > self.options.settle_timeout_s:
                    raise RuntimeError(
                        f"no run finished for {self.options.settle_timeout_s:g}s with "
                        f"{self.options.in_flight} in flight: {self.tally.states}"
                    )
                await asyncio.sleep(0.1)
            key = f"chaos-{i}"
            body = demo_request(i)
            failures = 0
            while True:
                try:
                    r = await http.post(
                        "/factory/runs", json=body, headers={**headers, "Idempotency-Key": key}
                    )
                except httpx.TransportError:
                    r = None
                if r is not None and r.status_code in (200, 201, 202):
                    self.tally.accepted[key] = r.json()["runId"]
                    break
                # Only the app's own answers (JSON, problem+json) are final: while the app is
                # being deployed, Serve's proxy answers 404 in plain text.
                ours = r is not None and "json" in r.headers.get("content-type", "")
                if ours and r is not None and r.status_code == 503:
                    self.tally.submit_draining += r.json().get("code") == "draining"
                if ours and r is not None and r.status_code not in (429, 500, 502, 503, 504):
                    self.tally.submit_refused.append(f"{key}: {r.status_code} {r.text[:300]}")
                    self.say(f"submission refused: {self.tally.submit_refused[-1]}")
                    break
                failures += 1
                self.tally.submit_resends += 1
                await asyncio.sleep(min(0.1 * 2**failures, 2.0))

    async def _review(self, http: httpx.AsyncClient) -> None:
        headers = {"Authorization": f"Bearer {self.reviewer}"}
        while not self._done.is_set():
            try:
                async for d in approve_pending(http, headers, "chaos reviewer"):
                    if d.status_code == 200:
                        self.tally.decided += 1
                    else:
                        code = str(d.status_code)
                        self.tally.decide_refused[code] = self.tally.decide_refused.get(code, 0) + 1
                        if d.status_code >= 500 and len(self.tally.decide_errors) < 10:
                            self.tally.decide_errors.append(f"{self._now()}s {code} {d.text[:300]}")
            except (httpx.TransportError, ValueError, KeyError) as exc:
                self.tally.decide_refused[type(exc).__name__] = (
                    self.tally.decide_refused.get(type(exc).__name__, 0) + 1
                )
            await asyncio.sleep(0.25)

    async def _monitor(self) -> None:
        query = text("SELECT state, count(*) FROM runs WHERE tenant_id = :t GROUP BY state")

        def read() -> dict[str, int]:
            with self.owner.connect() as conn:
                return {s: int(n) for s, n in conn.execute(query, {"t": self.tenant})}

        said = 0.0
        while not self._done.is_set():
            try:
                states = await asyncio.to_thread(read)
            except Exception as exc:  # the database is down: keep the last figures
                states = None
                failure = repr(exc)[:200]
            if states is not None:
                failure = ""
                self.tally.states = states
                self.tally.terminal = sum(states.get(s, 0) for s in TERMINAL)
                self.tally.completed = states.get("Completed", 0)
            if time.monotonic() - said >= 10:
                said = time.monotonic()
                self.say(
                    f"accepted {len(self.tally.accepted)}/{self.options.runs}, "
                    f"states {self.tally.states}, faults {len(self.faults)} {failure}"
                )
            await asyncio.sleep(0.5)

    async def _settle(self) -> bool:
        """Wait until every accepted run is terminal (by id: a run whose acceptance the driver
        never heard of must not stand in for one it did)."""
        query = text(
            "SELECT count(*) FROM runs WHERE tenant_id = :t AND run_id = ANY(CAST(:ids AS uuid[])) "
            "AND state IN ('Completed', 'Failed', 'Cancelled')"
        )
        ids = list(self.tally.accepted.values())

        def finished() -> int:
            with self.owner.connect() as conn:
                return int(conn.execute(query, {"t": self.tenant, "ids": ids}).scalar_one())

        deadline = time.monotonic() + self.options.settle_timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # the database may be starting
                if await asyncio.to_thread(finished) >= len(ids):
                    return True
            await asyncio.sleep(0.5)
        return False

    # ------------------------------------------------------------------ faults

    async def _inject_faults(self, http: httpx.AsyncClient) -> None:
        o = self.options
        if o.mode == "each":
            kinds = list(o.kinds)
            self.rng.shuffle(kinds)
            for n, kind in enumerate(kinds):
                threshold = (n + 1) * o.runs // (len(kinds) + 1)
                while self.submitted < threshold:
                    await asyncio.sleep(0.1)
                await asyncio.sleep(self.rng.uniform(0.0, 2.0))
                await self._fault(http, kind)
        else:
            while self.submitted < o.runs - 1:
                await asyncio.sleep(self.rng.uniform(*o.gap_s))
                if self.submitted >= o.runs - 1:
                    break
                await self._fault(http, self._random_kind())

    def _random_kind(self) -> str:
        """A random kind; the second node only while it is up (a service restart brings it
        back), and once per service start."""
        removed = sum(f.kind == "node" for f in self.faults) >= len(self.service.ready)
        kinds = [k for k in self.options.kinds if not (k == "node" and removed)]
        return self.rng.choice(kinds)

    async def _fault(self, http: httpx.AsyncClient, kind: str) -> None:
        completed = self.tally.completed
        fault = Fault(kind, self._now(), len(self.tally.accepted) - self.tally.terminal, {})
        began = time.monotonic()
        if kind == "run-host":
            host = self.rng.randrange(HOST_COUNT)
            fault.detail = await asyncio.to_thread(self.service.inject, f"kill-host {host}")
        elif kind == "scheduler":
            fault.detail = await asyncio.to_thread(self.service.inject, "kill-scheduler")
        elif kind == "serve-replica":
            fault.detail = await asyncio.to_thread(self.service.inject, "kill-replica")
        elif kind == "node":
            fault.detail = await asyncio.to_thread(self.service.inject, "kill-node")
        elif kind == "postgres":
            await asyncio.to_thread(self.pg.crash)
            outage = self.rng.uniform(*self.options.pg_outage_s)
            # The scheduler and a run host killed while the server is down: they restart
            # during the outage and must wait for the database (a constructor that raised is
            # never restarted by Ray: a scheduler lost that way relayed nothing again).
            host = self.rng.randrange(HOST_COUNT)
            killed = [
                await asyncio.to_thread(self.service.inject, line)
                for line in ("kill-scheduler", f"kill-host {host}")
            ]
            await asyncio.sleep(outage)
            start_s = await asyncio.to_thread(self.pg.start)
            fault.detail = {
                "outage_s": round(outage, 2),
                "start_s": round(start_s, 2),
                "killed_during_outage": [k.get("actor") for k in killed if k.get("ok")],
            }
        elif kind == "service":
            code = await asyncio.to_thread(self.service.terminate)
            stop_s = time.monotonic() - began
            startup = await asyncio.to_thread(self.service.start)
            self.startups.append(startup)
            fault.detail = {
                "exit_code": code,
                "stop_s": round(stop_s, 1),
                "start_s": round(startup, 1),
                "drained": self.service.drained,
            }
        self.faults.append(fault)
        self.say(f"fault {kind}: {fault.detail}")
        if fault.detail.get("ok") is False:
            return
        fault.recovered_s = await self._recovered(http, began, completed)
        self.say(f"fault {kind}: recovered after {fault.recovered_s}s")

    async def _recovered(
        self, http: httpx.AsyncClient, began: float, completed: int
    ) -> float | None:
        deadline = began + self.options.recover_timeout_s
        while time.monotonic() < deadline:
            unfinished = len(self.tally.accepted) - self.tally.terminal
            if self.tally.completed > completed or unfinished == 0:
                try:
                    r = await http.get("/health/ready")
                    if r.status_code == 200:
                        return round(time.monotonic() - began, 2)
                except httpx.TransportError:
                    pass
            await asyncio.sleep(0.25)
        return None


def summary(chaos: Chaos, outcome: dict[str, Any], found: dict[str, Any]) -> dict[str, Any]:
    by_kind: dict[str, Any] = {}
    for kind in chaos.options.kinds:
        mine = [f for f in chaos.faults if f.kind == kind]
        times = [f.recovered_s for f in mine if f.recovered_s is not None]
        by_kind[kind] = {
            "injected": len(mine),
            "recovered": len(times),
            "recover_p50_s": percentile(times, 50),
            "recover_p99_s": percentile(times, 99),
            "recover_max_s": max(times) if times else None,
        }
    for u in found["uncertain"]:  # wall clock -> seconds into the load, as faults have it
        for key in ("grantedAt", "settledAt"):
            if u.get(key) is not None:
                u[key] = round(u[key] - chaos.began_wall, 1)
    return {
        "options": asdict(chaos.options),
        **outcome,
        "faults_by_kind": by_kind,
        "faults": [asdict(f) for f in chaos.faults],
        "service_startups_s": [round(s, 1) for s in chaos.startups],
        "service_ready": chaos.service.ready,
        "submit_resends": chaos.tally.submit_resends,
        "submit_draining": chaos.tally.submit_draining,
        "submit_refused": chaos.tally.submit_refused,
        "decided": chaos.tally.decided,
        "decide_refused": chaos.tally.decide_refused,
        "decide_errors": chaos.tally.decide_errors,
        "checks": found,
    }


def run(options: ChaosOptions, root: Path) -> dict[str, Any]:
    chaos = Chaos(options, root)
    try:
        outcome = asyncio.run(chaos.run())
        found = check(chaos.owner, chaos.tenant, chaos.tally.accepted, chaos.refusals)
        found["outbox_unpublished"] = chaos.unpublished
        if chaos.publication_stuck is not None:
            found["publication_stuck"] = chaos.publication_stuck
    finally:
        chaos.close()
    return summary(chaos, outcome, found)
