"""``create_app``: the FastAPI application of the HTTP front door (wiring only)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.util import find_spec

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig

from ..client import RunControlClient
from ..config import Settings
from ..drain import Drain
from ..edge.metering import TenantRateLimiter
from ..store import Database
from ..store.commit import EVENTS_CHANNEL
from ..store.notify import Listener
from ..store.output import OUTPUT_CHANNEL
from ..store.shards import follow_directory
from ..store.webhooks import FEED_CHANNEL
from ..telemetry import tracing
from . import (
    approvals,
    catalog,
    console,
    controls,
    events,
    feed,
    health,
    output,
    policies,
    problems,
    queues,
    replays,
    runs,
    schedules,
    schemas,
    signals,
    templates,
    webhooks,
)
from .auth import TokenVerifier
from .context import HostProbe, Services
from .limits import BodyLimit

log = logging.getLogger(__name__)

# The replica's LISTEN connection closes once no event stream waited on it for this long
# (issue 24: a replica nobody watches is not sent every commit's NOTIFY).
STREAMS_IDLE_S = 30.0


def create_app(
    client: RunControlClient,
    db: Database,
    settings: Settings | None = None,
    *,
    host_probe: HostProbe | None = None,
    drain: Drain | None = None,
    rate_limiter: TenantRateLimiter | None = None,
) -> FastAPI:
    """The HTTP API over ``client`` (commands) and ``db`` (tenant-scoped reads, and the event
    feed: one LISTEN connection for all of this app's streams).

    ``host_probe`` is awaited by ``/health/ready``: it should ping every run host. ``drain``
    is the replica's (shared with its gRPC methods); while it drains, submissions answer 503
    ``draining`` and readiness 503. ``rate_limiter``, the replica's tenant command rate, is
    shared with its gRPC methods too (None: this app's own).
    """
    settings = settings or Settings()
    services = Services(
        client,
        db,
        settings,
        # Started by the first stream; closed once no stream waited on it for a while.
        Listener(
            db.app_urls,
            (EVENTS_CHANNEL, FEED_CHANNEL, OUTPUT_CHANNEL),
            application_name=events.FEED_APPLICATION_NAME,
            idle_s=STREAMS_IDLE_S,
        ),
        host_probe,
        drain=drain or Drain(settings.drain.retry_after_seconds),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        directory = follow_directory(db)  # a tenant's placement, as the directory changes
        yield
        if directory is not None:
            directory.cancel()
        await services.feed.close()

    app = FastAPI(
        lifespan=lifespan,
        title="runcontrol",
        version="0.1.0",
        description="Run Control: runs, approvals, events and webhooks.",
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
        # FastAPI's own server span per request, only when this process exports spans; no
        # operation spans, metrics or logs (runcontrol/telemetry.py says why)
        telemetry=TelemetryConfig(
            tracing=tracing(),
            operation_spans=False,
            metrics=False,
            logs=False,
            auto_configure=False,
        ),
    )
    app.state.services = services
    app.state.verifier = TokenVerifier(settings.auth)  # AuthNotConfigured: refuse to start
    app.state.rate_limiter = rate_limiter or TenantRateLimiter(settings.api)
    problems.install(app)
    app.add_middleware(BodyLimit, max_bytes=settings.api.max_body_bytes)
    for module in (runs, events, output, feed, approvals, webhooks, policies, schemas, health):
        app.include_router(module.router)
    app.include_router(approvals.runs_router)
    app.include_router(controls.router)  # operator controls (issue 14)
    app.include_router(signals.router)  # input from outside for a signal step (issue 22)
    for router in (catalog.releases_router, catalog.workflows_router, catalog.graph_router):
        app.include_router(router)  # the workflow catalog and run graphs (issue 22)
    app.include_router(queues.router)  # flow control, seen (issue 21)
    app.include_router(schedules.router)  # schedules (issue 32)
    app.include_router(templates.router)  # run templates (issue 44)
    app.include_router(replays.router)  # replays against a newer release (issue 44)
    app.include_router(console.router)  # the web console's static files (runcontrol/console/)
    # Workflows as A2A agents (issue 31): /a2a/{workflowId}/..., a2a-sdk's bindings, when the
    # ``a2a`` extra is installed (make installs it; without it there is no agent door).
    if find_spec("a2a") is not None:
        from ..a2a.grpc_binding import A2aGrpc
        from ..a2a.routes import agent_mount, host_card_route

        public = settings.api.a2a_public_agent
        door = agent_mount(services, app.state.verifier, app.state.rate_limiter, public)
        app.router.routes.append(door)
        app.router.routes.append(host_card_route(services, app.state.verifier, public))
        # The gRPC binding, which the replica's gRPC ingress serves (actors/grpc_ingress.py).
        app.state.a2a_grpc = A2aGrpc(services, app.state.verifier, app.state.rate_limiter)
    else:
        log.warning("a2a-sdk is not installed (the a2a extra): no A2A agents are served")
    # runcontrol as an MCP server (issue 45): /mcp, the mcp SDK's streamable HTTP, when the
    # ``mcp`` extra is installed (make installs it).
    if find_spec("mcp") is not None:
        from ..mcp_server.door import mcp_route

        app.router.routes.append(mcp_route(services, app.state.verifier, app.state.rate_limiter))
    return app
