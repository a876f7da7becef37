"""The web console: static files under ``/console/`` and the sign-in settings they read.

The assets carry no data and need no token; every call the console makes to the API carries
the bearer token the user pasted or got from the configured OAuth2 provider, and the API
decides as it does for any other client. A Content-Security-Policy keeps the page to its own
scripts and to this origin (plus the provider's token endpoint).
"""

from __future__ import annotations

from importlib import resources
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import RedirectResponse, Response

from ..config import ConsoleOptions
from ..domain import errors
from .context import Svc

router = APIRouter(prefix="/console", include_in_schema=False)

ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}


def _asset(name: str) -> bytes:
    return (resources.files("runcontrol") / "console" / name).read_bytes()


def _origin(url: str | None) -> str:
    parts = urlsplit(url or "")
    return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else ""


def content_security_policy(options: ConsoleOptions) -> str:
    token_origin = _origin(options.oauth_token_url) if options.oauth_configured else ""
    return "; ".join(
        (
            "default-src 'self'",
            f"connect-src 'self' {token_origin}".rstrip(),
            "img-src 'self' data:",
            "frame-ancestors 'none'",
            "base-uri 'none'",
            "form-action 'self'",
        )
    )


def _serve(name: str, options: ConsoleOptions) -> Response:
    return Response(
        _asset(name),
        media_type=ASSETS[name],
        headers={
            "Cache-Control": "no-cache",
            "Content-Security-Policy": content_security_policy(options),
            "X-Content-Type-Options": "nosniff",
        },
    )


@router.get("")
async def console_root(request: Request) -> RedirectResponse:
    # The page's asset and API URLs are relative to /console/.
    return RedirectResponse(str(request.url.replace(path=request.url.path + "/")), 308)


@router.get("/")
async def console_index(svc: Svc) -> Response:
    return _serve("index.html", svc.settings.console)


@router.get("/config.json")
async def console_config(svc: Svc) -> dict[str, Any]:
    """How the console signs in: the OAuth2 provider's public settings, or null."""
    o = svc.settings.console
    if not o.oauth_configured:
        return {"oauth": None}
    return {
        "oauth": {
            "authorizeUrl": o.oauth_authorize_url,
            "tokenUrl": o.oauth_token_url,
            "clientId": o.oauth_client_id,
            "scope": o.oauth_scope,
            "audience": o.oauth_audience,
        }
    }


@router.get("/{name}")
async def console_asset(name: str, svc: Svc) -> Response:
    if name not in ASSETS:
        raise errors.NotFound(f"/console/{name} is not a file of the console")
    return _serve(name, svc.settings.console)
