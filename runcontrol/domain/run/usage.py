"""Worker-reported usage of a named rate limit (issue 21 item 2): the lease holder says how
many units of a named limit (model tokens, say) its attempt used; the bucket moves by them
after the commit (the grain's after-commit effect of ``ConsumeRateLimit``), so later
dispatches wait."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from .. import errors
from .. import events as ev
from ..limits import MAX_BURST, MAX_RATE_WINDOW_S, number
from ..rates import Draw, RateLimits, named_bucket
from ..workflow import PolicyDocument
from .core import RunAggregate
from .leases import held_lease
from .values import CommandContext, Options


@dataclass(frozen=True, slots=True)
class RateConsumed:
    """What a consumption answers: the named limit, its tenant's bucket, the units taken and
    when (a resend of the command gets the same answer, the units taken once)."""

    name: str
    bucket: str
    units: float
    at: datetime


def rate_draw(limits: RateLimits | None, name: str, units: float) -> Draw:
    """What ``units`` of the named limit ``name`` take from its bucket (the policy's rate)."""
    rate = limits.named.get(name) if limits is not None else None
    if rate is None:
        raise errors.ValidationFailed(
            f"the run's policy revision defines no rate limit {name!r} (rateLimits.named)",
            limit=name,
        )
    return Draw(named_bucket(name), rate.per_second, rate.burst, float(units))


def consume_rate(
    agg: RunAggregate,
    ctx: CommandContext,
    attempt_id: UUID,
    holder: str,
    fencing_token: int,
    name: str,
    units: float,
    policy: PolicyDocument,
    options: Options,
    *,
    lease_id: UUID | None = None,
) -> RateConsumed:
    """Check the report (from the current lease holder, of a limit the run's pinned
    policy revision defines) and record it as a ``RateLimitConsumed`` event; answers what
    the bucket takes."""
    units = number(units, "units", 0, MAX_BURST, above=True)
    draw = rate_draw(policy.rate_limits, name, units)
    if draw.units / draw.per_second > MAX_RATE_WINDOW_S:  # the bucket's interval fits
        raise errors.ValidationFailed(
            f"units must take at most {MAX_RATE_WINDOW_S:g} s of {name!r}'s rate"
        )
    attempt = agg.attempt(attempt_id)
    held_lease(agg, ctx, attempt, holder, fencing_token, options, lease_id)
    agg.record(ctx, ev.RateLimitConsumed, attempt, name=name, bucket=draw.bucket, units=draw.units)
    return RateConsumed(name, draw.bucket, draw.units, ctx.now)
