"""The ``runcontrol`` command: up, worker, token, db, release."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys
from typing import TYPE_CHECKING, Any

from .bootstrap import build, build_database, database_url
from .config import Settings
from .domain import WorkflowDefinition

if TYPE_CHECKING:
    from .worker import ReferenceWorker

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


def _token(settings: Settings, subject: str, roles: list[str], tenant: str, project: str) -> str:
    from .api.auth import mint_dev_token

    secret = settings.auth.hs256_secret
    if secret is None:
        raise SystemExit("RUNCONTROL_AUTH__HS256_SECRET is not set: cannot mint a dev token")
    return mint_dev_token(secret.get_secret_value(), tenant, project, subject, roles)


def _demo_executors(seconds: float) -> dict[str, Any]:
    from .worker import EchoExecutor

    return {s["agentId"]: EchoExecutor(s["agentId"], seconds) for s in DEMO_WORKFLOW["steps"]}


async def _supervise_workers(workers: list[ReferenceWorker], stop: asyncio.Event) -> None:
    """Run each worker under supervision (a loop that dies anyway is logged and restarted)
    until ``stop``; then drain: attempts in hand finish first, for up to 30 s."""
    tasks = [asyncio.create_task(w.run_supervised(), name=f"worker {w.holder}") for w in workers]
    await stop.wait()
    for w in workers:
        w.stop()
    if not tasks:
        return
    done, pending = await asyncio.wait(tasks, timeout=30)
    for task in pending:
        log.warning("%s did not drain within 30 s; cancelling it", task.get_name())
        task.cancel()
    for task in done:
        if not task.cancelled() and task.exception() is not None:
            log.error("%s ended with an error", task.get_name(), exc_info=task.exception())


async def _run_workers(
    client: Any, holders: list[str], stop: asyncio.Event, settings: Settings
) -> None:
    from .worker import ReferenceWorker

    renew = max(settings.leases.duration_seconds / 3, 0.5)
    grace = settings.leases.renewal_grace_seconds + 5.0
    workers = [
        ReferenceWorker(client, h, _demo_executors(0.5), renew_every_s=renew, lease_grace_s=grace)
        for h in holders
    ]
    await _supervise_workers(workers, stop)


def _cmd_up(args: argparse.Namespace) -> int:
    from actors.run_host import host_config, make_router
    from actors.service import start_ray, start_service, stop_service

    from .client import RunControlClient

    settings = Settings()
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
    start_ray(address=args.address)
    service = start_service(settings, owner_url, args.host, args.port)
    client = RunControlClient(make_router(host_config(settings, owner_url)))
    requester = _token(settings, "alice", ["Requester"], DEMO_TENANT, DEMO_PROJECT)
    reviewer = _token(settings, "bob", ["Reviewer"], DEMO_TENANT, DEMO_PROJECT)
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
two reference workers are claiming attempts of agents planner, applier, reporter.

export RC={service.url}
export REQUESTER_TOKEN={requester}
export REVIEWER_TOKEN={reviewer}

# submit a run (idempotent on the key):
curl -sS -X POST $RC/factory/runs -H "Authorization: Bearer $REQUESTER_TOKEN" \\
  -H "Idempotency-Key: demo-1" -H "Content-Type: application/json" \\
  -d '{body}'

Then follow README.md: watch events, approve as the reviewer, see it complete.
Ctrl-C stops everything.
""",
        flush=True,
    )

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        holders = [] if args.no_workers else ["worker-1", "worker-2"]
        await _run_workers(client, holders, stop, settings)

    try:
        asyncio.run(main())
    finally:
        _say("stopping (draining workers, Serve, Ray) ...")
        stop_service()
        db.dispose()
    return 0


def _cmd_hosts(args: argparse.Namespace) -> int:
    from actors.service import start_hosts, start_ray

    settings = Settings()
    owner_url = database_url(settings)
    build_database(settings, owner_url=owner_url).dispose()  # migrates
    start_ray(address=args.address)
    hosts, _ = start_hosts(settings, owner_url)
    _say(f"{len(hosts)} run hosts and the scheduler are running (detached)")
    return 0


def _cmd_worker(args: argparse.Namespace) -> int:
    from actors.run_host import host_config, make_router
    from actors.service import start_ray

    from .client import RunControlClient

    settings = Settings()
    start_ray(address=args.address or "auto")
    client = RunControlClient(make_router(host_config(settings, settings.database_url or "")))

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        _say(f"worker {args.holder} claiming for agents {', '.join(args.agents)}")
        from .worker import EchoExecutor, ReferenceWorker

        worker = ReferenceWorker(
            client,
            args.holder,
            {a: EchoExecutor(a, args.work_seconds) for a in args.agents},
            renew_every_s=max(settings.leases.duration_seconds / 3, 0.5),
            lease_grace_s=settings.leases.renewal_grace_seconds + 5.0,
        )
        await _supervise_workers([worker], stop)

    asyncio.run(main())
    return 0


def _cmd_token(args: argparse.Namespace) -> int:
    roles = [r.strip() for r in args.roles.split(",") if r.strip()]
    print(_token(Settings(), args.sub, roles, args.tenant, args.project))
    return 0


def _cmd_db(args: argparse.Namespace) -> int:
    db = build_database(Settings())
    print(f"database ready and migrated: {db.owner_url}")
    print(f"  app role:    {db.app_url}")
    print(f"  system role: {db.system_url}")
    return 0


def _cmd_release(args: argparse.Namespace) -> int:
    with open(args.file, encoding="utf-8") as fh:
        definition = WorkflowDefinition.from_dict(json.load(fh))
    container = build(Settings())
    release = container.releases.publish(
        args.tenant, definition, args.publisher, container.env.clock.now(), aliases=args.alias
    )
    print(json.dumps({"releaseId": release.release_id, "contentHash": release.content_hash}))
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
    up.add_argument("--address", default=None, help="join this Ray cluster instead of starting one")
    up.add_argument("--no-workers", action="store_true", help="do not run the reference workers")
    up.add_argument("--no-demo", action="store_true", help="do not publish the demo workflow")
    up.set_defaults(func=_cmd_up)

    hosts = sub.add_parser(
        "hosts",
        help="migrate, start the run hosts and scheduler as detached actors, and exit "
        "(for a Serve app deployed apart: serve deploy, KubeRay RayService)",
    )
    hosts.add_argument("--address", default="auto")
    hosts.set_defaults(func=_cmd_hosts)

    worker = sub.add_parser("worker", help="run a reference worker against a running cluster")
    worker.add_argument("--holder", default="worker-cli")
    worker.add_argument("--agents", nargs="+", default=["planner", "applier", "reporter"])
    worker.add_argument("--work-seconds", type=float, default=0.5)
    worker.add_argument("--address", default=None)
    worker.set_defaults(func=_cmd_worker)

    token = sub.add_parser("token", help="mint a local development bearer token (HS256)")
    token.add_argument("--tenant", required=True)
    token.add_argument("--project", required=True)
    token.add_argument("--sub", required=True)
    token.add_argument("--roles", default="Requester")
    token.set_defaults(func=_cmd_token)

    sub.add_parser("db", help="start/attach the database and apply migrations").set_defaults(
        func=_cmd_db
    )

    release = sub.add_parser("release", help="publish a workflow definition (JSON) as a release")
    release.add_argument("file")
    release.add_argument("--tenant", required=True)
    release.add_argument("--publisher", default="cli")
    release.add_argument("--alias", action="append", default=None)
    release.set_defaults(func=_cmd_release)

    args = parser.parse_args(argv)
    if getattr(args, "alias", "unset") is None:
        args.alias = ["latest"]
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
