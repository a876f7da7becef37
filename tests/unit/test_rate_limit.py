"""The per-tenant token bucket, on an injected clock (no sleeps)."""

from __future__ import annotations

import pytest

from runcontrol.config import ApiOptions, RateLimit
from runcontrol.edge.errors import RateLimited
from runcontrol.edge.metering import TenantRateLimiter, TokenBucket


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_bucket_spends_its_burst_then_refills_at_its_rate() -> None:
    clock = Clock()
    bucket = TokenBucket(RateLimit(per_second=2, burst=3), clock)
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]
    assert bucket.take() == pytest.approx(0.5)
    clock.now += 0.5
    assert bucket.take() == 0.0
    clock.now += 100
    assert bucket.full
    assert [bucket.take() for _ in range(3)] == [0.0, 0.0, 0.0]


def test_the_limiter_is_per_tenant_with_overrides_and_off_by_default() -> None:
    clock = Clock()
    assert ApiOptions().command_rate is None
    off = TenantRateLimiter(ApiOptions(), clock)
    for _ in range(1000):
        off.check("any")
    options = ApiOptions(
        command_rate=RateLimit(per_second=1, burst=1),
        tenant_command_rates={"big": RateLimit(per_second=10, burst=5)},
    )
    limiter = TenantRateLimiter(options, clock)
    limiter.check("a")
    with pytest.raises(RateLimited) as raised:
        limiter.check("a")
    assert raised.value.details["retry_after"] == 1
    limiter.check("b")  # its own bucket
    for _ in range(5):
        limiter.check("big")
    with pytest.raises(RateLimited):
        limiter.check("big")
    clock.now += 1
    limiter.check("a")
