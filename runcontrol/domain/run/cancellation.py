"""Cancellation: intent first, then settlement (invariant 8), and the reminder's deadlines
(wall clock, lifetime, the holders' stop timeout)."""

from __future__ import annotations

from datetime import timedelta

from .. import errors
from ..machines import (
    RunCommand,
    allows,
)
from ..states import (
    AttemptOutcome,
    AttemptState,
    FailureClass,
    RunState,
    StepState,
)
from .settlement import Settlement
from .values import (
    LIFETIME_EXCEEDED,
    RUN_CONTROL,
    WALL_CLOCK_EXCEEDED,
    CommandContext,
    Options,
)


class Cancellation(Settlement):
    def cancel(
        self,
        ctx: CommandContext,
        requested_by: str,
        reason: str,
        options: Options | None = None,
    ) -> bool:
        """Record intent, then settle what can settle now; True if intent was recorded."""
        if not reason or not reason.strip():
            raise errors.ValidationFailed("a cancellation needs a reason")
        if not allows(RunCommand.CANCEL, self.run.state):
            return False
        intent = self._record_intent(ctx, requested_by, reason)
        if self.run.state is RunState.ACCEPTED:
            self._move_run(ctx, RunState.CANCELLED)
            self._close_remaining(ctx, FailureClass.CANCELLATION)
            self._emit_cancelled(ctx, intent)
            return True
        if self.run.state is RunState.WAITING_FOR_APPROVAL:
            # The leases were suspended while a human decided: give each holder a full term
            # to observe the cancellation and settle its attempt itself.
            term = timedelta(seconds=(options or Options()).lease_seconds)
            for lease in self.leases.values():
                lease.expires_at = ctx.now + term
                self._changes.leases[lease.lease_id] = lease
        self._move_run(ctx, RunState.CANCELLING)
        self._cancel_unheld(ctx)
        self._finish_cancelling(ctx)
        return True

    def enforce_deadlines(self, ctx: CommandContext, options: Options) -> str | None:
        """The reminder's part: past its deadline a run gets a cancellation intent (reason
        ``wall-clock-exceeded`` or ``lifetime-exceeded``); past the stop deadline a Cancelling
        run's open attempts are settled Uncertain (cause ``StopTimeout``: a holder that never
        reported may have acted), their leases revoked, and the run ends Cancelled. Answers
        what it did, or None."""
        if not allows(RunCommand.ENFORCE_DEADLINES, self.run.state):
            # A human decision is never cut short by the run's clock: the approval's expiry
            # bounds that wait, and a run past its deadline is cancelled once it resumes.
            return None
        if self.run.state is not RunState.CANCELLING:
            if ctx.now < self.deadline(options):
                return None
            lifetime = self.run.created_at + timedelta(seconds=options.max_run_lifetime_seconds)
            reason = LIFETIME_EXCEEDED if ctx.now >= lifetime else WALL_CLOCK_EXCEEDED
            self.cancel(ctx, RUN_CONTROL, reason, options)
            return reason
        stop = self.stop_deadline(options)
        if stop is None or ctx.now < stop:
            return None
        for attempt in self.open_attempts():
            if attempt.state is not AttemptState.LEASED:
                self._cancel_unleased(ctx, attempt)
                self._move_step(
                    ctx, self.step(attempt.step_id), StepState.CANCELLED, "RunCancelled"
                )
                continue
            self._settle(
                ctx,
                attempt,
                AttemptOutcome.UNCERTAIN,
                FailureClass.UNCERTAIN,
                None,
                settled_by=RUN_CONTROL,
                cause="StopTimeout",
            )
            self._after_settled(ctx, attempt, options)
        self._finish_cancelling(ctx)
        return "stop-timeout"
