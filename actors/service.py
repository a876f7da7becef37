"""Start the whole service on a Ray runtime: run hosts, scheduler, the Serve app, workers."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ray
from ray import serve

from runcontrol.config import Settings

from .ingress import ACCESS_LOG_OFF, use_fast_ingress
from .placement import NAMESPACE
from .run_host import ensure_hosts
from .scheduler import ensure_scheduler

log = logging.getLogger(__name__)

APP_NAME = "runcontrol"


@dataclass
class Service:
    hosts: list[Any]
    scheduler: Any
    url: str
    grpc_target: str


def start_ray(num_cpus: int | None = None, address: str | None = None) -> None:
    """Join the cluster at ``address``, or start a local one with Serve's fast ingress
    (``ingress.py``); a cluster started by ``ray start`` must have had it set there."""
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
    from grpc_ingress import grpc_options
    from serve_app import RunControlApi

    # Serve's gRPC proxy listens on every interface ([::]:port) whatever ``host`` is.
    serve.start(
        proxy_location=proxy_location,
        http_options={"host": host, "port": port},
        grpc_options=grpc_options(grpc_port),
        logging_config=ACCESS_LOG_OFF,
    )
    serve.run(
        RunControlApi.bind(  # type: ignore[attr-defined]
            database_url=owner_url, settings=app_settings
        ),
        name=APP_NAME,
        route_prefix="/",
    )
    return Service(hosts, scheduler, f"http://{host}:{port}", f"{host}:{grpc_port}")


def stop_service() -> None:
    try:
        serve.shutdown()  # type: ignore[no-untyped-call]
    finally:
        ray.shutdown()
