"""The Ray runtime of runcontrol's service commands (``runcontrol.cli.cluster.Cluster``): the
service's start, drain and stop (``service.py``), the detached run hosts, and a worker session
over actor calls (the hosts' router, ``placement.py``)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from runcontrol.config import Settings
from runcontrol.workers.protocol import SessionTransport

from .run_host import host_config, make_router
from .service import (
    Service,
    drain_service,
    replace_host,
    start_hosts,
    start_ray,
    start_service,
    stop_service,
)


class RayCluster:
    def __init__(self) -> None:
        self.service: Service | None = None

    def start_ray(self, address: str | None, metrics_export_port: int | None = None) -> None:
        start_ray(address=address, metrics_export_port=metrics_export_port)

    def start_service(
        self,
        settings: Settings,
        owner_url: str,
        host: str,
        port: int,
        *,
        app_settings: dict[str, Any] | None,
        grpc_port: int,
    ) -> Service:
        self.service = start_service(
            settings, owner_url, host, port, app_settings=app_settings, grpc_port=grpc_port
        )
        return self.service

    async def drain_service(
        self, grace_s: float, stop_workers: Callable[[float], Awaitable[None]]
    ) -> dict[str, Any]:
        assert self.service is not None, "drain_service before start_service"
        return await drain_service(self.service, grace_s, stop_workers)

    def stop_service(self, serve_timeout_s: float) -> dict[str, float]:
        return stop_service(serve_timeout_s=serve_timeout_s)

    def start_hosts(self, settings: Settings, owner_url: str) -> int:
        hosts, _ = start_hosts(settings, owner_url)
        return len(hosts)

    async def replace_host(self, index: int, grace_s: float) -> dict[str, Any]:
        return await replace_host(index, grace_s)

    def session_transport(self, settings: Settings, owner_url: str) -> SessionTransport:
        return make_router(host_config(settings, owner_url))  # an exchange is one actor call
