"""The per-tenant command rate of a replica, which both doors meter (``api.limits`` in the
HTTP caller's dependency, ``rpc.service`` through ``edge.commands.Outside``).

A token bucket per tenant in each replica (no shared state: with N replicas a tenant gets up
to N times the configured rate; one replica's HTTP routes and gRPC methods share its buckets).
It meters the commands that write; reads are not metered.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from ..config import ApiOptions, RateLimit
from .errors import RateLimited


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
