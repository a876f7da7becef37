"""``runcontrol worker``: run a worker, an app of the worker SDK, in the cluster (over Ray, its
sessions are actor calls) or anywhere (over gRPC: no Ray in the process)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable
from datetime import timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from ..config import Settings
from ..domain import WorkerIdentity, errors
from ..telemetry import configure as configure_telemetry
from .cluster import ClusterLoader, load
from .output import say

if TYPE_CHECKING:
    from ..sdk import Worker

log = logging.getLogger(__name__)


def _cmd_worker(args: argparse.Namespace, cluster: ClusterLoader | None) -> int:
    from ..sdk import AppNotFound

    try:
        app = _worker_app(args)  # before Ray or a channel: a bad --app is one line, exit 2
    except (AppNotFound, ValueError) as exc:
        print(f"runcontrol worker: {exc}", file=sys.stderr)
        return 2
    settings = Settings()
    configure_telemetry(settings.telemetry, "worker")
    if args.transport == "grpc":
        return _grpc_worker(args, settings, app)
    runtime = load(cluster, "worker --transport ray")
    runtime.start_ray(args.address or "auto")
    holder: str | WorkerIdentity = args.holder
    if args.tenant:
        holder = WorkerIdentity(args.tenant, args.sub, args.holder)
    _run_worker(
        args,
        settings,
        app,
        lambda: runtime.session_transport(settings, settings.database_url or ""),
        holder,
    )
    return 0


def _worker_app(args: argparse.Namespace) -> Worker:
    """The ``Worker`` to run: ``--app``'s, or the echo agents (``--agents``, ``--work-seconds``)."""
    from ..sdk import load_app
    from ..sdk.echo import DEMO_AGENTS, echo_worker

    if args.app is None:
        return echo_worker(args.agents or DEMO_AGENTS, args.work_seconds)
    app = load_app(args.app)
    return app.only(args.agents) if args.agents else app


def _grpc_worker(args: argparse.Namespace, settings: Settings, app: Worker) -> int:
    """The worker over gRPC: no Ray in this process (the ``grpc`` extra). Its lease holders
    are the token's subject and ``--holder`` (one instance per slot: ``HOLDER.k``)."""
    from ..rpc.exchange import GrpcSessionTransport  # grpcio: the `grpc` extra
    from ..sdk import token_identity

    token = args.token or os.environ.get("RUNCONTROL_WORKER_TOKEN")
    if not token:
        raise SystemExit("--transport grpc needs --token or RUNCONTROL_WORKER_TOKEN (role Worker)")
    try:
        identity = token_identity(token, args.holder)
    except errors.ValidationFailed as exc:
        raise SystemExit(f"runcontrol worker: {exc}") from None
    direct = not args.via_ingress

    def transport() -> GrpcSessionTransport:
        return GrpcSessionTransport(args.target, token, direct=direct)

    _run_worker(args, settings, app, transport, identity)
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
        say(f"worker {args.holder} ({app.name}) serving agents {', '.join(app.agents)}")
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


def add_worker(sub: Any, cluster: ClusterLoader | None) -> None:
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
        "--via-ingress",
        action="store_true",
        help="gRPC: every exchange through --target, relayed to the hosts (not on each run "
        "host's own server: a worker that cannot reach the nodes)",
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
    worker.set_defaults(func=partial(_cmd_worker, cluster=cluster))
