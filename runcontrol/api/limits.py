"""Request limits of the HTTP edge: a cap on body size and a per-tenant command rate.

The rate limit is a token bucket per tenant in each replica (no shared state: with N replicas a
tenant gets up to N times the configured rate). It meters the commands that write (submit,
cancel, decide); reads are not metered here.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Annotated, Any

from fastapi import Depends, Request

from ..config import ApiOptions, RateLimit
from .auth import ApprovalsDecider, Caller, RunCanceller, RunSubmitter
from .problems import PayloadTooLarge, RateLimited, from_error

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


class TokenBucket:
    """``rate.burst`` tokens, refilled at ``rate.per_second``; time from ``clock`` (seconds)."""

    def __init__(self, rate: RateLimit, clock: Callable[[], float]) -> None:
        self.rate = rate
        self._clock = clock
        self._tokens = float(rate.burst)
        self._at = clock()

    def _refill(self) -> None:
        now = self._clock()
        self._tokens = min(self.rate.burst, self._tokens + (now - self._at) * self.rate.per_second)
        self._at = now

    def take(self) -> float:
        """Take one token: 0.0 if there was one, else the seconds until there will be."""
        self._refill()
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self.rate.per_second

    @property
    def full(self) -> bool:
        self._refill()
        return self._tokens >= self.rate.burst


class TenantRateLimiter:
    """One bucket per tenant that has a rate (the default or its own)."""

    MAX_IDLE_BUCKETS = 10_000

    def __init__(self, options: ApiOptions, clock: Callable[[], float] = time.monotonic) -> None:
        self._default = options.command_rate
        self._rates = options.tenant_command_rates
        self._clock = clock
        self._buckets: dict[str, TokenBucket] = {}

    def check(self, tenant_id: str) -> None:
        """Raise ``RateLimited`` (with the seconds to wait) when the tenant is over its rate."""
        rate = self._rates.get(tenant_id, self._default)
        if rate is None:
            return
        bucket = self._buckets.get(tenant_id)
        if bucket is None:
            if len(self._buckets) >= self.MAX_IDLE_BUCKETS:
                # a full bucket holds no state a new one would not: dropping it is free
                self._buckets = {t: b for t, b in self._buckets.items() if not b.full}
            bucket = self._buckets[tenant_id] = TokenBucket(rate, self._clock)
        wait = bucket.take()
        if wait > 0:
            retry_after = max(1, math.ceil(wait))
            raise RateLimited(
                f"tenant {tenant_id} is over its command rate ({rate.per_second}/s, burst "
                f"{rate.burst}); retry in {retry_after} s",
                retry_after=retry_after,
            )


def _metered(caller: Caller, request: Request) -> Caller:
    limiter: TenantRateLimiter = request.app.state.rate_limiter
    limiter.check(caller.tenant_id)
    return caller


async def _metered_submit(caller: RunSubmitter, request: Request) -> Caller:
    return _metered(caller, request)


async def _metered_cancel(caller: RunCanceller, request: Request) -> Caller:
    return _metered(caller, request)


async def _metered_decide(caller: ApprovalsDecider, request: Request) -> Caller:
    return _metered(caller, request)


# The verified caller of a command route, after its tenant's rate limit let the call through.
MeteredSubmitter = Annotated[Caller, Depends(_metered_submit)]
MeteredCanceller = Annotated[Caller, Depends(_metered_cancel)]
MeteredDecider = Annotated[Caller, Depends(_metered_decide)]
