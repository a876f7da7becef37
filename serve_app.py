"""Ray Serve entry point: ``serve run serve_app:app`` or ``serve deploy serve-config.yaml``.

Wiring only: settings from the environment (``RUNCONTROL_*``), the database, a client routed
to the run hosts, and the FastAPI app from ``runcontrol.api``. The database URL comes from
``RUNCONTROL_DATABASE_URL``, set by whoever starts the service (or passed as ``database_url``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve.config import BackpressureConfig

from actors.grpc_ingress import GrpcIngress
from actors.ingress import ACCESS_LOG_OFF, log_in_replica
from actors.placement import host_name
from actors.run_host import host_config, make_router
from runcontrol.api import create_app
from runcontrol.bootstrap import build_database
from runcontrol.client import RunControlClient
from runcontrol.config import Settings
from runcontrol.drain import Drain
from runcontrol.edge.metering import TenantRateLimiter
from runcontrol.telemetry import configure


@serve.deployment(
    num_replicas=1,
    ray_actor_options={"num_cpus": 0},
    # Each live event stream holds one of these for its whole life: room for
    # api.sse_max_streams (4,000) of them plus 256 other requests.
    max_ongoing_requests=4256,
    # Past that, at most this many wait for a slot; more are shed at once with 503 and
    # Retry-After (Serve's backpressure), as commands past api.max_commands_in_flight are.
    max_queued_requests=1024,
    backpressure_config=BackpressureConfig(status_code=503, retry_after_s=1),
    logging_config=ACCESS_LOG_OFF,
)
@serve.ingress()  # the app is built per replica by __serve_build_asgi_app__, after __init__
class RunControlApi(GrpcIngress):  # + the gRPC methods (actors/grpc_ingress.py)
    def __init__(
        self, database_url: str | None = None, settings: dict[str, Any] | None = None
    ) -> None:
        self.settings = Settings(**(settings or {}))
        self.settings.auth.check()  # no way to verify tokens: refuse to start, and say why
        configure(self.settings.telemetry, "api")
        log_in_replica()  # an unexpected error's line, with its correlation id and traceback
        url = database_url or self.settings.database_url
        if not url:
            raise RuntimeError("set RUNCONTROL_DATABASE_URL to the database's owner URL")
        self.db = build_database(self.settings, owner_url=url, migrate=False)
        self.router = make_router(host_config(self.settings, url))
        self.client = RunControlClient(self.router)
        # One drain for the replica's HTTP routes and gRPC methods (runcontrol/drain.py).
        self.edge_drain = Drain(self.settings.drain.retry_after_seconds)
        self.edge_limiter = TenantRateLimiter(self.settings.api)  # and one command rate

    async def ping_hosts(self) -> None:
        names = [host_name(k) for k in range(self.router.host_count)]
        await asyncio.gather(*(self.router.call_named(name, "ping") for name in names))

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_app(self.client, self.db, self.settings, **self.edge_shared)

    # Called through the app's handle (``actors.service.drain_service``), not routed: Serve
    # gives a replica no hook when its own stop begins (``__del__`` runs after its requests
    # drained), so whoever stops the service drains the edge first.

    async def drain(self, grace_s: float | None = None) -> dict[str, Any]:
        """Refuse new work from now on (503 ``draining``) and wait for the commands in flight,
        at most ``grace_s`` (default ``drain.grace_seconds``)."""
        grace = self.settings.drain.grace_seconds if grace_s is None else grace_s
        return dataclasses.asdict(await self.edge_drain.wait(grace))

    async def resume(self) -> None:
        """Call a drain off: take new work again."""
        self.edge_drain.resume()


app = RunControlApi.bind()  # type: ignore[attr-defined]
