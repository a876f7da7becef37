"""Worker-reported usage of a named rate limit (issue 21 item 2): the lease holder says how
many units of a named limit (model tokens, say) its attempt used; the bucket moves by them
after the commit (``grain.handlers.consume_rate_limit``), so later dispatches wait."""

from __future__ import annotations

import math
from uuid import UUID

from .. import errors
from .. import events as ev
from ..rates import Draw, RateLimits, named_bucket
from .leases import Leases
from .values import CommandContext, Options


class RateUsage(Leases):
    def consume_rate(
        self,
        ctx: CommandContext,
        attempt_id: UUID,
        holder: str,
        fencing_token: int,
        name: str,
        units: float,
        limits: RateLimits | None,
        options: Options,
        *,
        lease_id: UUID | None = None,
    ) -> Draw:
        """Check the report (from the current lease holder, of a limit the run's pinned
        policy revision defines) and record it as a ``RateLimitConsumed`` event; answers what
        the bucket takes."""
        if isinstance(units, bool) or not isinstance(units, int | float):
            raise errors.ValidationFailed("units must be a number")
        if not math.isfinite(units) or units <= 0:
            raise errors.ValidationFailed("units must be a positive number")
        rate = limits.named.get(name) if limits is not None else None
        if rate is None:
            raise errors.ValidationFailed(
                f"the run's policy revision defines no rate limit {name!r} (rateLimits.named)",
                limit=name,
            )
        attempt = self.attempt(attempt_id)
        self._held_lease(ctx, attempt, holder, fencing_token, options, lease_id)
        draw = Draw(named_bucket(name), rate.per_second, rate.burst, float(units))
        self._emit(
            ctx,
            ev.RateLimitConsumed(
                run_id=self.run.run_id,
                step_id=attempt.step_id,
                attempt_id=attempt_id,
                name=name,
                bucket=draw.bucket,
                units=draw.units,
            ),
            step_id=attempt.step_id,
            attempt_id=attempt_id,
        )
        return draw
