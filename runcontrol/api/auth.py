"""The HTTP edge's authentication: FastAPI dependencies over ``runcontrol.edge.auth``.

A route names the operation it performs (``RunsReader``, ``ApprovalsDecider`` ...) and gets the
verified caller, or 401/403 before it runs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..domain.access import (
    ALL_SCOPES,
    APPROVALS_DECIDE,
    APPROVALS_READ,
    RUNS_READ,
    RUNS_WRITE,
    RUNTIME,
    Operation,
)
from ..edge.auth import Caller, TokenVerifier, jwks_document, mint_dev_token, permit
from ..edge.errors import Unauthorized

__all__ = [
    "ALL_SCOPES",
    "APPROVALS_DECIDE",
    "APPROVALS_READ",
    "RUNS_READ",
    "RUNS_WRITE",
    "RUNTIME",
    "Caller",
    "TokenVerifier",
    "jwks_document",
    "mint_dev_token",
]

bearer = HTTPBearer(
    auto_error=False,
    bearerFormat="JWT",
    description="OAuth2 bearer JWT with claims tid, pid, sub, roles and scope.",
)


async def get_verifier(request: Request) -> TokenVerifier:
    # async: FastAPI runs a plain ``def`` dependency on a thread pool, a hop per request
    verifier: TokenVerifier = request.app.state.verifier
    return verifier


async def authenticate(
    credentials: Annotated[HTTPAuthorizationCredentials | None, Security(bearer)],
    verifier: Annotated[TokenVerifier, Depends(get_verifier)],
) -> Caller:
    if credentials is None or not credentials.credentials:
        raise Unauthorized("a bearer token is required")
    return await verifier.verify_async(credentials.credentials)


def require(operation: Operation) -> Callable[..., Awaitable[Caller]]:
    """A dependency answering the verified caller, or 403 unless one of its roles grants
    ``operation`` and its effective scopes hold the operation's scope (``edge.auth.permit``).
    A command's builder (``edge.commands``) checks its operation again: the route's check
    only refuses such a caller before its body is read (403 before 422)."""

    async def dependency(caller: Annotated[Caller, Depends(authenticate)]) -> Caller:
        permit(caller, operation)
        return caller

    return dependency


async def verified(request: Request, operation: Operation) -> Caller:
    """What ``require(operation)`` answers, for a plain route (``routes.plain``): the bearer
    token read as ``bearer`` reads it, verified, and the operation permitted."""
    caller = await authenticate(await bearer(request), await get_verifier(request))
    permit(caller, operation)
    return caller


# The verified caller of a route, by the operation the route performs.
RunsReader = Annotated[Caller, Depends(require(Operation.READ_RUNS))]
RunSubmitter = Annotated[Caller, Depends(require(Operation.SUBMIT_RUN))]
RunCanceller = Annotated[Caller, Depends(require(Operation.CANCEL_RUN))]
ApprovalsReader = Annotated[Caller, Depends(require(Operation.READ_APPROVALS))]
ApprovalsDecider = Annotated[Caller, Depends(require(Operation.DECIDE_APPROVAL))]
WebhooksManager = Annotated[Caller, Depends(require(Operation.MANAGE_WEBHOOKS))]
PolicyManager = Annotated[Caller, Depends(require(Operation.MANAGE_POLICY))]
ReleasePublisher = Annotated[Caller, Depends(require(Operation.PUBLISH_RELEASE))]
