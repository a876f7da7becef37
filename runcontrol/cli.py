"""The ``runcontrol`` command: up, worker, token, db, release; and over HTTP, for people,
runs, approvals, webhooks and events (``ops_cli``)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from . import embedded, lifeline, ops_cli
from .bootstrap import build, build_database, database_url
from .config import AuthNotConfigured, Settings
from .domain import Role, WorkerIdentity, WorkflowDefinition, errors
from .ports.policy import DEFAULT_POLICY_ID, document_from_dict, document_to_dict, publish_policy
from .store.schema import SchemaMismatch
from .telemetry import configure as configure_telemetry

if TYPE_CHECKING:
    from .sdk import Worker
    from .workers.protocol import SessionTransport

log = logging.getLogger(__name__)

DEMO_TENANT = "demo"
DEMO_PROJECT = "demo"
DEMO_WORKFLOW: dict[str, Any] = {
    "workflowId": "demo-review",
    "steps": [
        {"name": "plan", "agentId": "planner", "sideEffectClass": "read"},
        {"name": "apply", "agentId": "applier", "sideEffectClass": "shared-write"},
        {"name": "report", "agentId": "reporter", "sideEffectClass": "read"},
    ],
}


def _say(message: str) -> None:
    print(f"runcontrol: {message}", flush=True)


def dev_secret_file(settings: Settings) -> Path:
    """Where ``runcontrol up --dev`` keeps its random HS256 secret: beside the data dir, so
    each install (data dir) has its own and ``runcontrol token`` finds it."""
    data_dir = Path(settings.data_dir or embedded.default_data_dir()).expanduser().resolve()
    return data_dir.with_name(data_dir.name + ".dev-secret")


def _ensure_dev_secret(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(secrets.token_urlsafe(48) + "\n")


def _with_dev_auth(settings: Settings) -> dict[str, Any] | None:
    """``--dev``: with no key configured, sign with a random secret of this data dir. Answers
    the HTTP app's settings override, or None when a key is configured (it is used as is)."""
    auth = settings.auth
    if auth.uses_jwks or auth.hs256_secret is not None or auth.hs256_secret_file:
        return None
    path = dev_secret_file(settings)
    _ensure_dev_secret(path)
    settings.auth = auth.model_copy(update={"hs256_secret_file": str(path)})
    _say(f"dev mode: tokens are signed with the random secret in {path}")
    return {"auth": {"hs256_secret_file": str(path)}}


def _token(
    settings: Settings,
    subject: str,
    roles: list[str],
    tenant: str,
    project: str,
    scopes: list[str] | None = None,
) -> str:
    from .api.auth import mint_dev_token

    auth = settings.auth
    if auth.uses_jwks and not auth.hs256_with_jwks:
        raise SystemExit(
            "runcontrol: this configuration verifies RS256 tokens against a JWKS and refuses "
            "HS256: get a token from your identity provider"
        )
    try:
        secret = auth.shared_secret()
    except AuthNotConfigured as exc:
        raise SystemExit(f"runcontrol: {exc}") from None
    if secret is None:
        dev = dev_secret_file(settings)
        if not dev.exists():
            raise SystemExit(
                "runcontrol: no HS256 secret to sign with: set RUNCONTROL_AUTH__HS256_SECRET "
                f"(or _HS256_SECRET_FILE), or start `runcontrol up --dev` once (it keeps {dev})"
            )
        secret = dev.read_text(encoding="utf-8").strip()
    return mint_dev_token(
        secret,
        tenant,
        project,
        subject,
        roles,
        scopes,
        issuer=auth.issuer,
        audience=auth.audience,
    )


# A demo worker: an app of the SDK, the transport it runs over and its identity.
_DemoWorker = tuple["Worker", "SessionTransport", WorkerIdentity]


def _start_workers(workers: list[_DemoWorker]) -> list[asyncio.Task[None]]:
    return [
        asyncio.create_task(app.run_supervised(transport, who), name=f"worker {who.holder}")
        for app, transport, who in workers
    ]


async def _stop_workers(
    workers: list[_DemoWorker], tasks: list[asyncio.Task[None]], grace_s: float
) -> None:
    """Stop offering slots; wait up to ``grace_s`` for the attempts in hand to finish and
    report (a stopping SDK worker withdraws its credits at once: no long poll to sit out)."""
    for app, _, _ in workers:
        app.stop()
    if not tasks:
        return
    done, pending = await asyncio.wait(tasks, timeout=grace_s)
    for task in pending:
        log.warning("%s did not drain within %.0f s; cancelling it", task.get_name(), grace_s)
        task.cancel()
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s ended with an error", task.get_name(), exc_info=task.exception())


def _workers(
    transport: SessionTransport, holders: list[WorkerIdentity], settings: Settings
) -> list[_DemoWorker]:
    """The demo workers of ``runcontrol up``: the SDK's echo app (``runcontrol.sdk.echo``,
    what ``runcontrol worker`` runs without ``--app``), one per holder, in this process."""
    from .sdk.echo import echo_worker

    agents = [s["agentId"] for s in DEMO_WORKFLOW["steps"]]
    renew = max(settings.leases.duration_seconds / 3, 0.5)
    grace = settings.leases.renewal_grace_seconds + 5.0
    return [
        (
            echo_worker(agents, 0.5, renew_every_s=renew, lease_grace_s=grace),
            transport,
            who,
        )
        for who in holders
    ]


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
        import threading
        import time

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
        _say(f"{why}: stopping at once (what is still running is killed)")
        os._exit(130)

    def remaining(self) -> float:
        import time

        return 0.0 if self.deadline is None else max(self.deadline - time.monotonic(), 0.0)

    def stage(self, name: str, since: float) -> float:
        import time

        now = time.monotonic()
        self.stages[name] = round(now - since, 2)
        return now

    def handle_signals(self) -> None:
        """Outside the event loop (Serve's and Ray's stop): a signal goes to ``begin``."""
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self.begin())


async def _hint_workers(db: Any, stall_s: float | None, stop: asyncio.Event) -> None:
    """Say once per (tenant, agent) how to start a worker for work nobody takes (a tenant
    that published a workflow but runs no worker: the demo workers take tenant demo's only)."""
    from .store import queries as q

    if stall_s is None:
        return
    said: set[tuple[str, str]] = set()

    def stalled() -> list[tuple[str, str, int, datetime]]:
        with db.system_tx() as conn:
            return q.stalled_attempts(conn, datetime.now(UTC), stall_s)

    while not stop.is_set():
        try:
            found = await asyncio.to_thread(stalled)
        except Exception as exc:  # noqa: BLE001 - a hint; the next look may work
            log.warning("could not look for work nobody takes: %r", exc)
            found = []
        for tenant, agent, n, _ in found:
            if (tenant, agent) not in said:
                said.add((tenant, agent))
                _say(
                    f"tenant {tenant!r}: {n} attempt(s) of agent {agent!r} waiting over "
                    f"{stall_s:g} s with no worker; start one: runcontrol worker --tenant "
                    f"{tenant} --sub worker --agents {agent} (or over gRPC: --transport grpc "
                    f"--token of role Worker for tenant {tenant})"
                )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), min(stall_s, 30.0))


def _exit_stopped() -> NoReturn:
    """Exit once everything is stopped: the exit handlers (the embedded PostgreSQL's stop
    among them) run, the interpreter's teardown does not. That teardown is Ray's client of a
    cluster already gone, which took another 2.6 s here after all else was stopped."""
    import atexit

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
        _say(f"stopped what a killed runcontrol up (pid {owner}) left: {lifeline.describe(names)}")
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


def _cmd_up(args: argparse.Namespace) -> int:
    from actors.run_host import host_config, make_router
    from actors.service import drain_service, start_ray, start_service, stop_service

    from .client import RunControlClient

    settings = Settings()
    app_settings = _with_dev_auth(settings) if args.dev else None
    try:
        settings.auth.check()
    except AuthNotConfigured as exc:
        raise SystemExit(f"runcontrol: {exc}") from None
    guard = _start_lifeline(settings, args.host, args.port)
    if args.address is None:
        _check_ports(args.host, {"HTTP": args.port, "gRPC": args.grpc_port})
    _say("starting PostgreSQL " + ("(configured URL)" if settings.database_url else "(embedded)"))
    owner_url = database_url(settings)
    db = build_database(settings, owner_url=owner_url)
    container = build(settings, db=db, migrate=False)
    _say("database migrated")
    if not args.no_demo:
        release = container.releases.publish(
            DEMO_TENANT,
            WorkflowDefinition.from_dict(DEMO_WORKFLOW),
            "runcontrol-up",
            container.env.clock.now(),
        )
        _say(f"demo release {release.release_id} published for tenant 'demo'")
    _say("starting Ray, run hosts, scheduler and the HTTP app (Ray Serve) ...")
    if args.metrics_export_port is not None:
        settings.telemetry.metrics_export_port = args.metrics_export_port
    configure_telemetry(settings.telemetry, "worker")  # the demo workers' process
    start_ray(address=args.address, metrics_export_port=settings.telemetry.metrics_export_port)
    service = start_service(
        settings,
        owner_url,
        args.host,
        args.port,
        app_settings=app_settings,
        grpc_port=args.grpc_port,
    )
    client = RunControlClient(make_router(host_config(settings, owner_url)))
    requester = _token(settings, "alice", ["Requester"], DEMO_TENANT, DEMO_PROJECT)
    reviewer = _token(settings, "bob", ["Reviewer"], DEMO_TENANT, DEMO_PROJECT)
    worker = _token(settings, "demo-worker", ["Worker"], DEMO_TENANT, DEMO_PROJECT)
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
        workers = _workers(client, holders, settings)
        tasks = _start_workers(workers)
        hints = asyncio.create_task(
            _hint_workers(container.db, settings.api.dispatch_stall_seconds, stop)
        )
        await stop.wait()
        hints.cancel()
        _say(f"draining (at most {settings.drain.grace_seconds:g} s) ...")
        report = await drain_service(
            service,
            settings.drain.grace_seconds,
            lambda grace_s: _stop_workers(workers, tasks, grace_s),
        )
        _say(f"drained: {json.dumps(report, default=str)}")

    import time

    try:
        asyncio.run(main())
    finally:
        stopping.handle_signals()
        if stopping.started is None:  # not a signal: an error, or the loop ended otherwise
            stopping.begin()
        assert stopping.started is not None
        since = stopping.stage("drain", stopping.started)
        _say("stopping Serve and Ray ...")
        # What is left of the margin after the drain, less what Ray's and PostgreSQL's own
        # stops take (about 1 s together, measured), is Serve's.
        timings = stop_service(serve_timeout_s=stopping.remaining() - 2.0)
        since = stopping.stage("serve_and_ray", since)
        db.dispose()
        if not settings.database_url:
            embedded.stop(settings.data_dir or embedded.default_data_dir())
        since = stopping.stage("database", since)
        left = guard.reap_now()
        stopping.stage("leftovers", since)
        total = round(time.monotonic() - stopping.started, 2)
        _say(
            f"stopped in {total:g} s: {json.dumps({**stopping.stages, **timings})}"
            + (f"; killed what Serve left: {lifeline.describe(left)}" if left else "")
        )
    _exit_stopped()


def _cmd_hosts(args: argparse.Namespace) -> int:
    from actors.service import replace_host, start_hosts, start_ray

    settings = Settings()
    if args.replace is not None:
        start_ray(address=args.address)
        try:
            report = asyncio.run(replace_host(args.replace, settings.drain.grace_seconds))
        except RuntimeError as exc:  # it did not come back (e.g. it refused the schema)
            raise SystemExit(f"runcontrol: {exc}") from None
        _say(f"run host {args.replace} drained and serving again: {json.dumps(report)}")
        return 0
    owner_url = database_url(settings)
    build_database(settings, owner_url=owner_url).dispose()  # migrates
    start_ray(address=args.address)
    hosts, _ = start_hosts(settings, owner_url)
    _say(f"{len(hosts)} run hosts and the scheduler are running (detached)")
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    from .sdk import AppNotFound

    try:
        app = _worker_app(args)  # before Ray or a channel: a bad --app is one line, exit 2
    except (AppNotFound, ValueError) as exc:
        print(f"runcontrol worker: {exc}", file=sys.stderr)
        return 2
    settings = Settings()
    configure_telemetry(settings.telemetry, "worker")
    if args.transport == "grpc":
        return _grpc_worker(args, settings, app)
    from actors.run_host import host_config, make_router
    from actors.service import start_ray

    start_ray(address=args.address or "auto")
    router = make_router(host_config(settings, settings.database_url or ""))
    holder: str | WorkerIdentity = args.holder
    if args.tenant:
        holder = WorkerIdentity(args.tenant, args.sub, args.holder)
    _run_worker(args, settings, app, lambda: router, holder)
    return 0


def _worker_app(args: argparse.Namespace) -> Worker:
    """The ``Worker`` to run: ``--app``'s, or the echo agents (``--agents``, ``--work-seconds``)."""
    from .sdk import load_app
    from .sdk.echo import DEMO_AGENTS, echo_worker

    if args.app is None:
        return echo_worker(args.agents or DEMO_AGENTS, args.work_seconds)
    app = load_app(args.app)
    return app.only(args.agents) if args.agents else app


def _grpc_worker(args: argparse.Namespace, settings: Settings, app: Worker) -> int:
    """The worker over gRPC: no Ray in this process (the ``grpc`` extra). Its lease holders
    are the token's subject and ``--holder`` (one instance per slot: ``HOLDER.k``)."""
    import os

    from .rpc.exchange import GrpcSessionTransport
    from .sdk import token_identity

    token = args.token or os.environ.get("RUNCONTROL_WORKER_TOKEN")
    if not token:
        raise SystemExit("--transport grpc needs --token or RUNCONTROL_WORKER_TOKEN (role Worker)")
    try:
        identity = token_identity(token, args.holder)
    except errors.ValidationFailed as exc:
        raise SystemExit(f"runcontrol worker: {exc}") from None
    _run_worker(args, settings, app, lambda: GrpcSessionTransport(args.target, token), identity)
    return 0


def _run_worker(
    args: argparse.Namespace,
    settings: Settings,
    app: Worker,
    make_transport: Callable[[], Any],
    holder: str | WorkerIdentity,
) -> None:
    if args.renew_seconds is not None:
        app.renew_every_s = args.renew_seconds
    app.wait_s = args.claim_seconds
    app.lease_grace = timedelta(seconds=settings.leases.renewal_grace_seconds + 5.0)

    async def main() -> None:
        # on this loop (a gRPC channel belongs to the loop it is made on)
        transport = make_transport()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        _say(f"worker {args.holder} ({app.name}) serving agents {', '.join(app.agents)}")
        task = asyncio.create_task(
            app.run_supervised(transport, holder, concurrency=args.concurrency)
        )
        stopping = asyncio.create_task(stop.wait())
        try:
            await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
            app.stop()  # drain: attempts in hand finish and report first
            grace = settings.drain.grace_seconds
            try:
                await asyncio.wait_for(task, grace)
            except TimeoutError:
                log.warning("the worker did not drain within %.0f s; stopped", grace)
        finally:
            stopping.cancel()
            close = getattr(transport, "close", None)
            if close is not None:
                await close()

    asyncio.run(main())


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [v.strip() for v in value.split(",") if v.strip()]


def _cmd_token(args: argparse.Namespace) -> int:
    roles = _names(args.roles) or []
    unknown = sorted(set(roles) - {r.value for r in Role})
    if unknown:
        raise SystemExit(f"runcontrol: unknown roles {unknown}; known: {[r.value for r in Role]}")
    scopes = _names(args.scopes)
    print(_token(Settings(), args.sub, roles, args.tenant, args.project, scopes))
    return 0


def _cmd_db(args: argparse.Namespace) -> int:
    db = build_database(Settings())
    version = db.schema_version()
    print(f"database ready and migrated: {db.owner_url}")
    print(f"  schema:      revision {version.revision}, runs code from {version.oldest_code} on")
    print(f"  app role:    {db.app_url}")
    print(f"  system role: {db.system_url}")
    return 0


def _cmd_release(args: argparse.Namespace) -> int:
    """Publish a workflow definition: over the HTTP API with ``--url`` (the token's tenant;
    ``POST /factory/releases`` checks it again), otherwise straight into the database
    (``--tenant``). Bad input is one line on stderr and exit 2, never a traceback."""
    try:
        with open(args.file, encoding="utf-8") as fh:
            data = json.load(fh)
        definition = WorkflowDefinition.from_dict(data)
    except OSError as exc:
        print(f"runcontrol release: cannot read {args.file}: {exc.strerror}", file=sys.stderr)
        return 2
    except json.JSONDecodeError as exc:
        print(f"runcontrol release: {args.file} is not JSON: {exc}", file=sys.stderr)
        return 2
    except errors.ValidationFailed as exc:
        print(f"runcontrol release: invalid workflow definition: {exc}", file=sys.stderr)
        return 2
    aliases = args.alias or ["latest"]
    if args.url:
        body = {"definition": data, "aliases": aliases}

        def publish(api: ops_cli.Api, _: argparse.Namespace, out: Any) -> None:
            found = api.call("POST", "/factory/releases", json=body)
            release = {"releaseId": found["releaseId"], "contentHash": found["contentHash"]}
            print(json.dumps(release), file=out)

        return ops_cli.run(publish, args)
    if not args.tenant:
        print("runcontrol release: --tenant is required without --url", file=sys.stderr)
        return 2
    container = build(Settings())
    release = container.releases.publish(
        args.tenant, definition, args.publisher, container.env.clock.now(), aliases=aliases
    )
    print(json.dumps({"releaseId": release.release_id, "contentHash": release.content_hash}))
    return 0


def _cmd_policy(args: argparse.Namespace) -> int:
    """Publish an approval policy revision (the JSON of ``POST /factory/policies``)."""
    try:
        with open(args.file, encoding="utf-8") as fh:
            data = json.load(fh)
        doc = document_from_dict(DEFAULT_POLICY_ID, "", data)
    except (OSError, json.JSONDecodeError, errors.ValidationFailed) as exc:
        print(f"runcontrol policy: {exc}", file=sys.stderr)
        return 2
    db = build_database(Settings())
    try:
        published = publish_policy(db, args.tenant, doc, datetime.now(UTC))
    finally:
        db.dispose()
    print(
        json.dumps(
            {
                "policyId": published.policy_id,
                "revision": published.revision,
                "document": document_to_dict(published),
            }
        )
    )
    return 0


def _cmd_restore_check(args: argparse.Namespace) -> int:
    """After a restore from a backup: settle the open leases it holds (docs/operations.md)."""
    from .restore import restore_check

    container = build(Settings())

    async def main() -> list[Any]:
        try:
            return await restore_check(container)
        finally:
            await container.store.close()

    try:
        settled = asyncio.run(main())
    finally:
        container.db.dispose()
    for run in settled:
        print(
            json.dumps(
                {
                    "tenantId": run.tenant_id,
                    "runId": str(run.run_id),
                    "settledUncertain": run.attempts,
                    "runState": run.run_state,
                }
            ),
            flush=True,
        )
    attempts = sum(len(run.attempts) for run in settled)
    _say(f"restore-check: {attempts} open lease(s) of {len(settled)} run(s) settled Uncertain")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(
        prog="runcontrol", description="Run-control plane for agent runs"
    )
    sub = parser.add_subparsers(dest="command", required=True)

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
        "--dev",
        action="store_true",
        help="local development: with no token key configured, sign tokens with a random "
        "secret kept beside the data dir (`make run` does this)",
    )
    up.set_defaults(func=_cmd_up)

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
    hosts.set_defaults(func=_cmd_hosts)

    worker = sub.add_parser(
        "worker", help="run a worker: an app of the worker SDK (Ray client or gRPC)"
    )
    worker.add_argument(
        "--app",
        default=None,
        metavar="PACKAGE.MODULE:WORKER",
        help="the runcontrol.sdk.Worker to run (default: the echo agents of make run)",
    )
    worker.add_argument("--transport", choices=("ray", "grpc"), default="ray")
    worker.add_argument(
        "--target", default="127.0.0.1:9000", help="gRPC: HOST:PORT of the gRPC ingress"
    )
    worker.add_argument(
        "--token", default=None, help="gRPC: a Worker token (or RUNCONTROL_WORKER_TOKEN)"
    )
    worker.add_argument(
        "--holder",
        default="worker-cli",
        help="the worker instance id (gRPC and --tenant: the lease holder is SUB/HOLDER)",
    )
    worker.add_argument("--tenant", default=None, help="ray: claim only this tenant's attempts")
    worker.add_argument("--sub", default="worker", help="ray with --tenant: the worker subject")
    worker.add_argument(
        "--agents",
        nargs="+",
        default=None,
        help="serve only these agents of the app (the echo agents: which to make; default "
        "planner applier reporter)",
    )
    worker.add_argument("--work-seconds", type=float, default=0.5, help="the echo agents' work")
    worker.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="attempts run at once (default: the app's Worker(concurrency=...), 8)",
    )
    worker.add_argument("--renew-seconds", type=float, default=None)
    worker.add_argument("--claim-seconds", type=float, default=20.0)
    worker.add_argument("--address", default=None, help="ray: the cluster to join")
    worker.set_defaults(func=_cmd_worker)

    token = sub.add_parser("token", help="mint a local development bearer token (HS256)")
    token.add_argument("--tenant", required=True)
    token.add_argument("--project", required=True)
    token.add_argument("--sub", required=True)
    token.add_argument("--roles", default="Requester", help="comma-separated roles")
    token.add_argument(
        "--scopes",
        default=None,
        help="comma-separated scopes (default: those the roles grant; the server honours "
        "only scopes a role of the token grants)",
    )
    token.set_defaults(func=_cmd_token)

    sub.add_parser(
        "db",
        aliases=["migrate"],
        help="start/attach the database and apply migrations (the first step of an upgrade)",
    ).set_defaults(func=_cmd_db)

    release = sub.add_parser("release", help="publish a workflow definition (JSON) as a release")
    release.add_argument("file")
    release.add_argument("--tenant", help="straight into the database (without --url)")
    release.add_argument("--publisher", default="cli")
    release.add_argument("--alias", action="append", default=None)
    release.add_argument(
        "--url", default=None, help="publish through the HTTP API (a WorkspaceAdmin's token)"
    )
    release.add_argument("--token", default=None, help="with --url: bearer (RUNCONTROL_TOKEN)")
    release.set_defaults(func=_cmd_release)

    policy = sub.add_parser(
        "policy", help="publish an approval policy revision (JSON) for a tenant"
    )
    policy.add_argument("file")
    policy.add_argument("--tenant", required=True)
    policy.set_defaults(func=_cmd_policy)
    sub.add_parser(
        "restore-check",
        help="after restoring the database from a backup: settle its open leases as Uncertain",
    ).set_defaults(func=_cmd_restore_check)

    ops_cli.add_commands(sub)

    args = parser.parse_args(argv)
    if getattr(args, "alias", "unset") is None:
        args.alias = ["latest"]
    try:
        return int(args.func(args))
    except SchemaMismatch as exc:  # a process that may not run on this schema: say why, once
        raise SystemExit(f"runcontrol: {exc}") from None


if __name__ == "__main__":
    sys.exit(main())
