"""Request limits of the HTTP edge: a cap on body size and the per-tenant command rate.

The rate is the replica's ``edge.metering.TenantRateLimiter``, which the gRPC door shares. It
meters the commands that write (submit, cancel, decide, signal, the controls), here in the
caller's dependency, before the body is read; reads are not metered.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any

from fastapi import Depends, Request

from ..edge.metering import TenantRateLimiter
from .auth import ApprovalsDecider, Caller, RunCanceller, RunSubmitter
from .problems import PayloadTooLarge, from_error

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Asgi = Callable[[Scope, Receive, Send], Awaitable[None]]


class BodyLimit:
    """ASGI middleware answering 413 to a request body over ``max_bytes``, before any route
    reads it: at once from Content-Length, else after reading (and buffering) at most
    ``max_bytes`` of a chunked body, which the route then gets replayed."""

    def __init__(self, app: Asgi, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None:
            if declared > self.max_bytes:
                await self._refuse(scope, receive, send, declared)
                return
            await self.app(scope, receive, send)  # the server holds the body to its length
            return
        buffered: list[Message] = []
        size = 0
        while True:
            message = await receive()
            buffered.append(message)
            if message["type"] != "http.request":
                break
            size += len(message.get("body", b""))
            if size > self.max_bytes:
                await self._refuse(scope, receive, send, size)
                return
            if not message.get("more_body", False):
                break

        async def replay() -> Message:
            return buffered.pop(0) if buffered else await receive()

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, size: int) -> None:
        error = PayloadTooLarge(
            f"the request body ({size} bytes or more) is over the limit of {self.max_bytes} bytes",
            max_bytes=self.max_bytes,
        )
        await from_error(error)(scope, receive, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def metered(caller: Caller, request: Request) -> Caller:
    """The caller, once its tenant's command rate let the call through (else 429)."""
    limiter: TenantRateLimiter = request.app.state.rate_limiter
    limiter.check(caller.tenant_id)
    return caller


async def _metered_submit(caller: RunSubmitter, request: Request) -> Caller:
    return metered(caller, request)


async def _metered_cancel(caller: RunCanceller, request: Request) -> Caller:
    return metered(caller, request)


async def _metered_decide(caller: ApprovalsDecider, request: Request) -> Caller:
    return metered(caller, request)


# The verified caller of a command route, after its tenant's rate limit let the call through.
MeteredSubmitter = Annotated[Caller, Depends(_metered_submit)]
MeteredCanceller = Annotated[Caller, Depends(_metered_cancel)]
MeteredDecider = Annotated[Caller, Depends(_metered_decide)]
