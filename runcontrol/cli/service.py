"""The service: ``runcontrol up`` starts all of it (database, Ray, run hosts, scheduler, the
HTTP + gRPC app, the demo's workers) and drains and stops it on a signal; ``runcontrol hosts``
starts the run hosts alone for a Serve app deployed apart. Both run on the Ray runtime handed in
(``cluster.py``)."""

from __future__ import annotations

import argparse
import asyncio
import atexit
import json
import os
import signal
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any, NoReturn

from .. import embedded, lifeline
from ..bootstrap import build, build_database, database_url
from ..config import AuthNotConfigured, Settings
from ..domain import WorkerIdentity, WorkflowDefinition
from ..telemetry import configure as configure_telemetry
from .cluster import ClusterLoader, load
from .demo import (
    DEMO_PROJECT,
    DEMO_TENANT,
    DEMO_WORKFLOW,
    demo_workers,
    hint_workers,
    start_workers,
    stop_workers,
)
from .output import say
from .tokens import mint, with_dev_auth

# What a stop may take beyond the drain's grace: Serve, Ray and PostgreSQL stopping. The
# promise (README): gone within drain.grace_seconds + STOP_MARGIN_S of the signal.
STOP_MARGIN_S = 5.0


class _Stop:
    """The stop of ``runcontrol up``: the first SIGINT/SIGTERM starts it, with a deadline of
    the grace plus ``STOP_MARGIN_S``; a second signal, or the deadline, ends the process at
    once, and the lifeline's watchdog stops what it leaves running (``lifeline.py``)."""

    def __init__(self, grace_s: float) -> None:
        self.grace_s = grace_s
        self.started: float | None = None
        self.deadline: float | None = None
        self.stages: dict[str, float] = {}

    def begin(self) -> None:
        if self.started is not None:
            self.now("second signal")
            return
        self.started = time.monotonic()
        self.deadline = self.started + self.grace_s + STOP_MARGIN_S
        # Half a second early: the watchdog's reaping of what is left fits in the margin too.
        timer = threading.Timer(self.grace_s + STOP_MARGIN_S - 0.5, self.now, ("deadline",))
        timer.daemon = True
        timer.start()

    def now(self, why: str) -> None:
        say(f"{why}: stopping at once (what is still running is killed)")
        os._exit(130)

    def remaining(self) -> float:

        return 0.0 if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)

    def stage(self, name: str, since: float) -> float:

        now = time.monotonic()
        self.stages[name] = round(now - since, 2)
        return now

    def handle_signals(self) -> None:
        """Outside the event loop (Serve's and Ray's stop): a signal goes to ``begin``."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.begin())


def _exit_stopped() -> NoReturn:
    """Exit once everything is stopped: the exit handlers (the embedded PostgreSQL's stop
    among them) run, the interpreter's teardown does not. That teardown is Ray's client of a
    cluster already gone, which took another 2.6 s here after all else was stopped."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _start_lifeline(settings: Settings, host: str, port: int) -> lifeline.Lifeline:
    """Stop what a killed ``runcontrol up`` of this install left running (one line), refuse
    to start beside a live one, and tie what this one starts to its life. An install is its
    embedded data dir; with a configured database, that database and the HTTP address."""
    data_dir = Path(settings.data_dir or embedded.default_data_dir()).expanduser().resolve()
    if settings.database_url:
        where = f"{host}:{port} with the configured database"
        key = lifeline.key_of(f"{settings.database_url}|{where}")
        record = data_dir.with_name(f"up-{key}.processes.json")
    else:
        where = str(data_dir)
        key, record = lifeline.key_for(data_dir), lifeline.record_path(data_dir)
    record.parent.mkdir(parents=True, exist_ok=True)
    running, owner, left = lifeline.leftovers(key, record)
    if running is not None:
        raise SystemExit(f"runcontrol: runcontrol up (pid {running}) is running on {where}")
    if left:
        names = lifeline.reap(left)
        say(f"stopped what a killed runcontrol up (pid {owner}) left: {lifeline.describe(names)}")
    record.unlink(missing_ok=True)
    guard = lifeline.Lifeline(key, record)
    guard.start()
    return guard


def _check_ports(host: str, ports: dict[str, int]) -> None:
    """A port held by another process is a one-line error naming it (not Serve's traceback)."""
    for what, port in ports.items():
        holder = lifeline.port_holder(port)
        if holder is not None:
            pid, name = holder
            raise SystemExit(
                f"runcontrol: {what} port {port} is held by pid {pid} ({name}): stop it or "
                f"choose another port (--{'grpc-' if what == 'gRPC' else ''}port)"
            )


def _with_shards(settings: Settings, count: int) -> Settings:
    """The settings with ``count`` shard databases on the one server (``--shards``): the
    configured or embedded database first, the others created beside it. Set in the
    environment too, which every process this one starts (run hosts, scheduler, API
    replicas) reads."""
    if settings.shards.databases:
        raise SystemExit("runcontrol: --shards with RUNCONTROL_SHARDS__DATABASES set: choose one")
    urls = embedded.shard_databases(database_url(settings), count)
    os.environ["RUNCONTROL_DATABASE_URL"] = urls[0]
    os.environ["RUNCONTROL_SHARDS__DATABASES"] = ",".join(urls)
    say(f"{count} shard databases: {', '.join(u.rsplit('/', 1)[1].split('?')[0] for u in urls)}")
    return Settings()


def _cmd_up(args: argparse.Namespace, cluster: ClusterLoader | None) -> int:
    runtime = load(cluster, "up")
    settings = Settings()
    if args.shards > 1:
        settings = _with_shards(settings, args.shards)
    app_settings = with_dev_auth(settings) if args.dev else None
    try:
        settings.auth.check()
    except AuthNotConfigured as exc:
        raise SystemExit(f"runcontrol: {exc}") from None
    guard = _start_lifeline(settings, args.host, args.port)
    if args.address is None:
        _check_ports(args.host, {"HTTP": args.port, "gRPC": args.grpc_port})
    say("starting PostgreSQL " + ("(configured URL)" if settings.database_url else "(embedded)"))
    owner_url = database_url(settings)
    db = build_database(settings, owner_url=owner_url)
    container = build(settings, db=db, migrate=False)
    say("database migrated" if len(container.shards) == 1 else "shard databases migrated")
    if container.shards.spread():
        say(f"virtual shards spread over the {len(container.shards)} databases")
    if not args.no_demo:
        release = container.releases.publish(
            DEMO_TENANT,
            WorkflowDefinition.from_dict(DEMO_WORKFLOW),
            "runcontrol-up",
            container.env.clock.now(),
        )
        say(f"demo release {release.release_id} published for tenant 'demo'")
        if args.dev and settings.api.a2a_public_agent is None:
            # the demo agent's card at the root, for anonymous A2A discovery (docs/a2a.md)
            app_settings = {
                **(app_settings or {}),
                "api": {"a2a_public_agent": f"{DEMO_TENANT}/{DEMO_WORKFLOW['workflowId']}"},
            }
    if settings.api.a2a_grpc_address is None and args.host not in ("0.0.0.0", "::", ""):
        # The cards name this service's gRPC ingress as the agents' gRPC binding (docs/a2a.md);
        # listening on every interface, which address clients reach is the operator's to set.
        # (loopback by its name: the conformance kit calls a card naming 127.0.0.1 a leak)
        api = {**(app_settings or {}).get("api", {})}
        reached = "localhost" if args.host in ("127.0.0.1", "::1") else args.host
        api["a2a_grpc_address"] = f"{reached}:{args.grpc_port}"
        app_settings = {**(app_settings or {}), "api": api}
    say("starting Ray, run hosts, scheduler and the HTTP app (Ray Serve) ...")
    if args.metrics_export_port is not None:
        settings.telemetry.metrics_export_port = args.metrics_export_port
    configure_telemetry(settings.telemetry, "worker")  # the demo workers' process
    runtime.start_ray(args.address, settings.telemetry.metrics_export_port)
    service = runtime.start_service(
        settings,
        owner_url,
        args.host,
        args.port,
        app_settings=app_settings,
        grpc_port=args.grpc_port,
    )
    transport = runtime.session_transport(settings, owner_url)
    requester = mint(settings, "alice", ["Requester"], DEMO_TENANT, DEMO_PROJECT)
    reviewer = mint(settings, "bob", ["Reviewer"], DEMO_TENANT, DEMO_PROJECT)
    worker = mint(settings, "demo-worker", ["Worker"], DEMO_TENANT, DEMO_PROJECT)
    body = json.dumps(
        {
            "workflowId": "demo-review",
            "releaseAlias": "latest",
            "modelProfileId": "code-agent",
            "input": {"repository": "example/repo", "revision": "a1b2c3d"},
            "limits": {"maxCostUsd": 12, "maxMinutes": 45},
        }
    )
    print(
        f"""
runcontrol is up at {service.url}  (OpenAPI: {service.url}/docs)
web console: {service.url}/console/  (paste one of the tokens below)
gRPC (runcontrol.v1.RunControl, health, reflection) at {service.grpc_target}
two reference workers are claiming attempts of agents planner, applier, reporter.

export RC={service.url}
export REQUESTER_TOKEN={requester}
export REVIEWER_TOKEN={reviewer}
export WORKER_TOKEN={worker}

# submit a run (idempotent on the key):
curl -sS -X POST $RC/factory/runs -H "Authorization: Bearer $REQUESTER_TOKEN" \\
  -H "Idempotency-Key: demo-1" -H "Content-Type: application/json" \\
  -d '{body}'

Then follow README.md: watch events, approve as the reviewer, see it complete.
The same workflow is an A2A agent (docs/a2a.md, examples/a2a_client/walkthrough.py):
  {service.url}/a2a/demo-review/.well-known/agent-card.json
Ctrl-C (or SIGTERM) drains for at most {settings.drain.grace_seconds:g} s and stops everything \
within {settings.drain.grace_seconds + STOP_MARGIN_S:g} s; a second Ctrl-C stops at once.
""",
        flush=True,
    )
    stopping = _Stop(settings.drain.grace_seconds)

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def on_signal() -> None:
            stopping.begin()
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        holders = [
            WorkerIdentity(DEMO_TENANT, "demo-worker", f"worker-{n}")
            for n in ((1, 2) if not args.no_workers else ())
        ]
        workers = demo_workers(transport, holders, settings)
        tasks = start_workers(workers)
        hints = asyncio.create_task(
            hint_workers(container.db, settings.api.dispatch_stall_seconds, stop)
        )
        await stop.wait()
        hints.cancel()
        say(f"draining (at most {settings.drain.grace_seconds:g} s) ...")
        report = await runtime.drain_service(
            settings.drain.grace_seconds,
            lambda grace_s: stop_workers(workers, tasks, grace_s),
        )
        say(f"drained: {json.dumps(report, default=str)}")

    try:
        asyncio.run(main())
    finally:
        stopping.handle_signals()
        if stopping.started is None:  # not a signal: an error, or the loop ended otherwise
            stopping.begin()
        assert stopping.started is not None
        since = stopping.stage("drain", stopping.started)
        say("stopping Serve and Ray ...")
        # What is left of the margin after the drain, less what Ray's and PostgreSQL's own
        # stops take (about 1 s together, measured), is Serve's.
        timings = runtime.stop_service(stopping.remaining() - 2.0)
        since = stopping.stage("serve_and_ray", since)
        db.dispose()
        if not settings.database_url:
            embedded.stop(settings.data_dir or embedded.default_data_dir())
        since = stopping.stage("database", since)
        left = guard.reap_now()
        stopping.stage("leftovers", since)
        total = round(time.monotonic() - stopping.started, 2)
        say(
            f"stopped in {total:g} s: {json.dumps({**stopping.stages, **timings})}"
            + (f"; killed what Serve left: {lifeline.describe(left)}" if left else "")
        )
    _exit_stopped()


def _cmd_hosts(args: argparse.Namespace, cluster: ClusterLoader | None) -> int:
    runtime = load(cluster, "hosts")
    settings = Settings()
    if args.replace is not None:
        runtime.start_ray(args.address)
        try:
            report = asyncio.run(runtime.replace_host(args.replace, settings.drain.grace_seconds))
        except RuntimeError as exc:  # it did not come back (e.g. it refused the schema)
            raise SystemExit(f"runcontrol: {exc}") from None
        say(f"run host {args.replace} drained and serving again: {json.dumps(report)}")
        return 0
    owner_url = database_url(settings)
    build_database(settings, owner_url=owner_url).dispose()  # migrates
    runtime.start_ray(args.address)
    hosts = runtime.start_hosts(settings, owner_url)
    say(f"{hosts} run hosts and the scheduler are running (detached)")
    return 0


def add_up(sub: Any, cluster: ClusterLoader | None) -> None:
    up = sub.add_parser("up", help="start the whole service (database, Ray, HTTP, workers)")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000)
    up.add_argument("--grpc-port", type=int, default=9000, help="Serve's gRPC ingress")
    up.add_argument("--address", default=None, help="join this Ray cluster instead of starting one")
    up.add_argument("--no-workers", action="store_true", help="do not run the reference workers")
    up.add_argument("--no-demo", action="store_true", help="do not publish the demo workflow")
    up.add_argument(
        "--metrics-export-port",
        type=int,
        default=None,
        help="Prometheus endpoint of the local Ray node's metrics agent (default: "
        "RUNCONTROL_TELEMETRY__METRICS_EXPORT_PORT, else a port Ray picks)",
    )
    up.add_argument(
        "--shards",
        type=int,
        default=1,
        help="shard databases to run on (issue 41, docs/sharding.md): more than one creates the "
        "others beside the first on the same server and lists them all",
    )
    up.add_argument(
        "--dev",
        action="store_true",
        help="local development: with no token key configured, sign tokens with a random "
        "secret kept beside the data dir (`make run` does this)",
    )
    up.set_defaults(func=partial(_cmd_up, cluster=cluster))


def add_hosts(sub: Any, cluster: ClusterLoader | None) -> None:
    hosts = sub.add_parser(
        "hosts",
        help="migrate, start the run hosts and scheduler as detached actors, and exit "
        "(for a Serve app deployed apart: serve deploy, KubeRay RayService)",
    )
    hosts.add_argument("--address", default="auto")
    hosts.add_argument(
        "--replace",
        type=int,
        default=None,
        metavar="K",
        help="instead: drain run host K (its runs move to the other hosts at once) and restart it",
    )
    hosts.set_defaults(func=partial(_cmd_hosts, cluster=cluster))
