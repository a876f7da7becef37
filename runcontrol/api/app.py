"""``create_app``: the FastAPI application of the HTTP front door (wiring only)."""

from __future__ import annotations

from collections import Counter

from fastapi import FastAPI

from ..client import RunControlClient
from ..config import Settings
from ..store import Database
from . import approvals, events, health, problems, runs
from .auth import TokenVerifier
from .context import HostProbe, Services
from .limits import BodyLimit, TenantRateLimiter


def create_app(
    client: RunControlClient,
    db: Database,
    settings: Settings | None = None,
    *,
    host_probe: HostProbe | None = None,
) -> FastAPI:
    """The HTTP API over ``client`` (commands) and ``db`` (tenant-scoped reads).

    ``host_probe`` is awaited by ``/health/ready``: it should ping every run host.
    """
    settings = settings or Settings()
    app = FastAPI(
        title="runcontrol",
        version="0.1.0",
        description="Run Control: runs, approvals and per-run events.",
        openapi_url="/openapi.json",
        docs_url="/docs",
        redoc_url=None,
    )
    app.state.services = Services(client, db, settings, host_probe)
    app.state.verifier = TokenVerifier(settings.auth)  # AuthNotConfigured: refuse to start
    app.state.rate_limiter = TenantRateLimiter(settings.api)
    app.state.sse_subscribers = Counter()  # live event streams per run (api.sse_max_per_run)
    problems.install(app)
    app.add_middleware(BodyLimit, max_bytes=settings.api.max_body_bytes)
    for module in (runs, events, approvals, health):
        app.include_router(module.router)
    return app
