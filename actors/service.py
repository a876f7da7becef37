"""Start the whole service on a Ray runtime: run hosts, scheduler, the Serve app, workers."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve
from ray.exceptions import RayActorError

from runcontrol.config import Settings
from runcontrol.rpc.exchange import SERVE_APPLICATION

from .ingress import ACCESS_LOG_OFF, use_fast_ingress
from .placement import NAMESPACE, host_name
from .run_host import ensure_hosts
from .scheduler import ensure_scheduler

log = logging.getLogger(__name__)

APP_NAME = SERVE_APPLICATION  # the gRPC workers name it (runcontrol.rpc.exchange)


@dataclass
class Service:
    hosts: list[Any]
    scheduler: Any
    url: str
    grpc_target: str


def start_ray(
    num_cpus: int | None = None,
    address: str | None = None,
    *,
    metrics_export_port: int | None = None,
) -> None:
    """Join the cluster at ``address``, or start a local one with Serve's fast ingress
    (``ingress.py``); a cluster started by ``ray start`` must have had it set there.

    ``metrics_export_port``: where the local node's metrics agent serves Prometheus (the
    spec's metrics, ``actors/metrics.py``); a cluster takes ``ray start --metrics-export-port``.
    """
    os.environ.setdefault("RAY_worker_maximum_startup_concurrency", "4")
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    else:
        use_fast_ingress(local_ports=True)
        ray.init(
            address="local",  # our own, with these settings, even if another one runs here
            num_cpus=num_cpus or os.cpu_count() or 2,
            include_dashboard=False,
            namespace=NAMESPACE,
            log_to_driver=False,
            configure_logging=False,
            _metrics_export_port=metrics_export_port,  # None: Ray picks one
        )


def start_hosts(settings: Settings, owner_url: str) -> tuple[list[Any], Any]:
    """Create (or find) the run hosts and the scheduler as detached actors: they outlive this
    driver, for a cluster whose Serve app is deployed apart (serve deploy, KubeRay)."""
    hosts = ensure_hosts(settings, owner_url, detached=True)
    return hosts, ensure_scheduler(settings, owner_url, detached=True)


def start_service(
    settings: Settings,
    owner_url: str,
    host: str,
    port: int,
    *,
    app_settings: dict[str, Any] | None = None,
    grpc_port: int = 9000,
    host_options: Callable[[int], dict[str, Any]] | None = None,
    proxy_location: str | None = None,
) -> Service:
    """Deploy hosts, the scheduler and the HTTP + gRPC app; return once all of them answer.

    ``app_settings`` override the HTTP app's settings (over its ``RUNCONTROL_*`` environment).
    ``host_options`` places the run hosts (``ensure_hosts``); ``proxy_location`` is Serve's
    (``HeadOnly`` for several nodes on one machine, whose proxies would share one port)."""
    os.environ["RUNCONTROL_DATABASE_URL"] = owner_url
    hosts = ensure_hosts(settings, owner_url, host_options=host_options)
    scheduler = ensure_scheduler(settings, owner_url)
    from serve_app import RunControlApi

    from .grpc_ingress import grpc_options

    # Serve's gRPC proxy listens on every interface ([::]:port) whatever ``host`` is.
    serve.start(
        proxy_location=proxy_location,
        http_options={"host": host, "port": port},
        grpc_options=grpc_options(grpc_port),
        logging_config=ACCESS_LOG_OFF,
    )
    serve.run(
        # Serve's own stop of a replica (a replacement, `serve shutdown`) lets the requests in
        # flight finish within the same grace as our drain; an idle replica stops at once.
        RunControlApi.options(  # type: ignore[attr-defined]
            graceful_shutdown_timeout_s=max(settings.drain.grace_seconds, 1.0),
            graceful_shutdown_wait_loop_s=0.5,
        ).bind(database_url=owner_url, settings=app_settings),
        name=APP_NAME,
        route_prefix="/",
    )
    return Service(hosts, scheduler, f"http://{host}:{port}", f"{host}:{grpc_port}")


def stop_service(serve_timeout_s: float = 30.0) -> dict[str, float]:
    """Stop Serve, then Ray; answer how long each took (s).

    Serve's controller stops the proxies first (HAProxy ends within milliseconds, measured),
    then each replica, which stays reachable for the direct-ingress draining period (30 s by
    default; a local cluster takes less, ``ingress.LOCAL_DRAINING_PERIOD_S``) so that load
    balancers can drop it. That wait was 30 of the 46 s an idle Ctrl-C took (issue 23), and
    ``serve.shutdown()`` waits up to 30 s for it, whatever grace the caller has left: here
    the wait is bounded by ``serve_timeout_s``. What Serve has not stopped by then,
    ``ray.shutdown()`` ends with the rest of the local cluster; the edge's own drain
    (``drain_service``) has already let its requests in flight finish."""
    timings: dict[str, float] = {}
    started = time.monotonic()
    try:
        _stop_serve(max(serve_timeout_s, 0.1))
    except Exception as exc:  # noqa: BLE001 - Ray is stopped below whatever Serve did
        log.warning("Serve did not stop cleanly: %r", exc)
    finally:
        timings["serve_s"] = round(time.monotonic() - started, 2)
        started = time.monotonic()
        ray.shutdown()
        timings["ray_s"] = round(time.monotonic() - started, 2)
    return timings


def _stop_serve(timeout_s: float) -> None:
    # ``serve.shutdown()`` with its controller wait bounded: the same calls, in the same
    # order, with the timeout that ``serve.shutdown()`` does not expose.
    from ray.serve import context

    client, _ = context._check_cached_client_alive()
    if client is None:
        return
    client.shutdown(timeout_s=timeout_s)
    context._disconnect()  # type: ignore[no-untyped-call]


async def drain_service(
    service: Service, grace_s: float, stop_workers: Callable[[float], Awaitable[None]]
) -> dict[str, Any]:
    """Drain in order, all within ``grace_s``: the edge refuses new submissions and claims
    (503 ``draining``) at once; ``stop_workers(remaining_s)`` stops the workers' claims and
    lets the attempts in hand finish and report (through the edge's gRPC or the hosts, both
    still taking the commands of accepted work); the edge's commands in flight finish; then
    each run host finishes its commands in flight and releases its grains. What is left once
    the grace is spent is what a crash would leave: leases expire, the reconcilers resume."""
    deadline = time.monotonic() + grace_s

    def remaining() -> float:
        return max(deadline - time.monotonic(), 0.0)

    report: dict[str, Any] = {}
    try:
        api = serve.get_app_handle(APP_NAME)
        await api.drain.remote(0.0)  # begin: refuse new work now, wait below
    except Exception as exc:  # noqa: BLE001 - the edge may be gone already; drain the rest
        log.warning("drain: the HTTP app did not answer (%r)", exc)
        api = None
    await stop_workers(remaining())
    if api is not None:
        try:
            report["api"] = await api.drain.remote(remaining())
        except Exception as exc:  # noqa: BLE001
            log.warning("drain: the HTTP app did not answer (%r)", exc)
    answers = await asyncio.gather(
        *(host.drain.remote(remaining()) for host in service.hosts), return_exceptions=True
    )
    report["hosts"] = [a if isinstance(a, dict) else repr(a) for a in answers]
    return report


# How long a replaced host may take to serve again (a cold start imports Ray, SQLAlchemy and the
# app: 3-6 s here; under load, more).
REPLACE_READY_S = 120.0


async def replace_host(
    index: int, grace_s: float, ready_timeout_s: float = REPLACE_READY_S
) -> dict[str, Any]:
    """Replace run host ``index`` without waiting for lease expiry: drain it (its runs go to
    the other hosts at once, its commands in flight commit, at most ``grace_s``), then kill it
    so Ray restarts it under its name (``max_restarts=-1``): the new process re-runs the
    constructor (the schema check included, ``store/schema.py``) and serves again. Returns
    once it answers, so hosts replaced one after another are never two down at once; answers
    the drain's report and the new process's ``pid``."""
    name = host_name(index)
    handle = ray.get_actor(name, namespace=NAMESPACE)
    old = int((await handle.stats.remote())["pid"])
    report: dict[str, Any] = await handle.drain.remote(grace_s)
    ray.kill(handle, no_restart=False)
    report["pid"] = await _serving_again(name, old, ready_timeout_s)
    return report


async def _serving_again(name: str, old_pid: int, timeout_s: float) -> int:
    """The pid of actor ``name`` once a process other than ``old_pid`` answers (the kill is
    asynchronous: the old one may answer first), within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    why = f"still pid {old_pid}"
    while time.monotonic() < deadline:
        try:
            pid = int((await ray.get_actor(name, namespace=NAMESPACE).stats.remote())["pid"])
        except (RayActorError, ValueError) as exc:  # restarting; ValueError: not registered
            lines = [line for line in str(exc).splitlines() if line.strip()]
            why = lines[-1] if lines else type(exc).__name__
            # Its constructor raised (it refused the schema, say): Ray does not restart it.
            if getattr(exc, "actor_init_failed", False):
                message = f"{name} did not serve again (it failed to start): {why}"
                raise RuntimeError(message) from None
        else:
            if pid != old_pid:
                return pid
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{name} did not serve again within {timeout_s:g} s: {why}")
