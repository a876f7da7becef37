"""Typed errors of Run Control.

Every error carries a stable ``code`` and whether retrying the same command may succeed
(``retryable``). Only the HTTP and gRPC edges map codes to status codes. Errors pickle by
value so they cross the Ray boundary as themselves (a stale token stays a ``StaleFencingToken``).
"""

from __future__ import annotations

from typing import Any, ClassVar


def _rebuild(cls: type[RunControlError], message: str, details: dict[str, Any]) -> RunControlError:
    return cls(message, **details)


class RunControlError(Exception):
    code: ClassVar[str] = "run-control-error"
    retryable: ClassVar[bool] = False

    def __init__(self, message: str = "", **details: Any) -> None:
        super().__init__(message or self.code)
        self.message = message or self.code
        self.details = details

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self.message, self.details))

    def __str__(self) -> str:
        return self.message


class InternalError(RunControlError):
    """What a client gets for an unexpected failure (``edge.unexpected``): its
    ``correlation_id`` names the replica's log line."""

    code = "internal-error"


class ValidationFailed(RunControlError):
    code = "validation-failed"


class ResultTooLarge(ValidationFailed):
    """An outcome's inline result is over ``RunControl:Results:MaxInlineBytes``: nothing is
    stored and the attempt stays open, so its holder can report a ``result_ref`` instead."""

    code = "result-too-large"


class CallValueTooLarge(ValidationFailed):
    """A journaled call's value is over ``RunControl:Results:MaxInlineBytes`` of canonical
    JSON (the results' cap): nothing is stored. Keep the data elsewhere and return a reference
    to it ({uri, sha256, bytes}) from the function instead."""

    code = "call-value-too-large"


class CallLimitReached(ValidationFailed):
    """The step has recorded as many journaled calls, or as many bytes of them, as
    ``RunControl:Calls:MaxPerStep`` / ``MaxBytesPerStep`` allow: nothing more is stored."""

    code = "call-limit-reached"


class CallNotRecorded(ValidationFailed):
    """A read of a journaled call that has no stored value (a worker reads only the calls its
    grant listed)."""

    code = "call-not-recorded"


class OutputChunkTooLarge(ValidationFailed):
    """A streamed chunk is over ``OUTPUT_CHUNK_MAX_BYTES`` (``domain.output``): not sent."""

    code = "output-chunk-too-large"


class OutputLimitExceeded(ValidationFailed):
    """The attempt wrote ``OUTPUT_ATTEMPT_MAX_BYTES`` of output already: the chunks before the
    one that would pass it are stored, no later one of the attempt is."""

    code = "output-limit-exceeded"


class OutcomeHashMismatch(ValidationFailed):
    """The ``outcomeHash`` sent is not the canonical hash of the result sent with it."""

    code = "outcome-hash-mismatch"


class NotFound(RunControlError):
    code = "not-found"


class RunNotFound(NotFound):
    code = "run-not-found"


class ScheduleNotFound(NotFound):
    code = "schedule-not-found"


class StepNotFound(NotFound):
    code = "step-not-found"


class SignalNotAwaited(NotFound):
    """No step of the run waits for a signal of this name (nor ever will)."""

    code = "signal-not-awaited"


class AttemptNotFound(NotFound):
    code = "attempt-not-found"


class ApprovalNotFound(NotFound):
    code = "approval-not-found"


class WorkflowNotFound(NotFound):
    code = "workflow-not-found"


class ReleaseNotFound(NotFound):
    code = "release-not-found"


class WebhookNotFound(NotFound):
    code = "webhook-not-found"


class InvalidWebhookUrl(ValidationFailed):
    code = "invalid-webhook-url"


class Conflict(RunControlError):
    code = "conflict"


class IllegalTransition(Conflict):
    code = "illegal-transition"


class IdempotencyConflict(Conflict):
    code = "idempotency-conflict"


class ConcurrencyConflict(Conflict):
    """Another activation committed first (optimistic concurrency): reload and retry."""

    code = "concurrency-conflict"
    retryable = True


class WebhookDisabled(Conflict):
    code = "webhook-disabled"


class RunTerminal(Conflict):
    code = "run-terminal"


class SignalAlreadyReceived(Conflict):
    """The steps waiting for this signal have theirs (a resend with the same key is answered
    with the first answer instead)."""

    code = "signal-already-received"


class LeaseHeld(Conflict):
    """The attempt's lease is held by another worker and has not expired."""

    code = "lease-held"
    retryable = True


class LeaseRejected(Conflict):
    code = "lease-rejected"


class StaleFencingToken(LeaseRejected):
    code = "stale-fencing-token"


class LeaseNotHeld(LeaseRejected):
    code = "lease-not-held"


class LeaseExpired(LeaseRejected):
    code = "lease-expired"


class OutcomeAlreadyRecorded(Conflict):
    code = "outcome-already-recorded"


class ApprovalVersionMismatch(Conflict):
    code = "approval-version-mismatch"


class ApprovalAlreadyDecided(Conflict):
    code = "approval-already-decided"


class ProposalHashMismatch(Conflict):
    code = "proposal-hash-mismatch"


class ToolCallNotFound(NotFound):
    code = "tool-call-not-found"


class ToolCallConflict(Conflict):
    """The call id names a different request, or was claimed by another attempt, or already
    has a different result."""

    code = "tool-call-conflict"


class ToolCallRefused(Conflict):
    """No new side effect may start: the run is being cancelled."""

    code = "tool-call-refused"


class ToolCallExpired(RunControlError):
    """The claim was closed without a result (claim timeout): its result is never stored."""

    code = "tool-call-expired"


class DataLoss(RunControlError):
    code = "data-loss"


class ProgressGap(DataLoss):
    """A progress batch skipped a sequence number: the messages before the gap are stored,
    none after it. ``details``: ``acked_seq`` (resend from the next one) and ``gap_at``."""

    code = "progress-gap"


class OutputGap(DataLoss):
    """An output write skipped a chunk number: the chunks before the gap are stored, none
    after it. ``details``: ``acked_seq`` (resend from the next one)."""

    code = "output-gap"


class ApprovalGone(RunControlError):
    """The approval request expired or went stale: the decision can never apply. ``details``:
    ``gone`` is ``expired`` or ``stale`` (a bulk decision's outcome tells them apart)."""

    code = "approval-gone"


class Forbidden(RunControlError):
    code = "forbidden"


class SeparationOfDuties(Forbidden):
    code = "separation-of-duties"


class BreakGlassReasonRequired(ValidationFailed):
    code = "break-glass-reason-required"


class CapacityDenied(RunControlError):
    code = "capacity-denied"
    retryable = True


class FlowDenied(RunControlError):
    """The dispatching statement refused a slot of a concurrency key (or of the tenant's cap,
    migration 0017): its details say which key and what it found. The grain decides again,
    holding the step; never an answer to a caller."""

    code = "flow-denied"
    retryable = True


class BudgetReservationDenied(RunControlError):
    code = "budget-reservation-denied"


class Unavailable(RunControlError):
    """A dependency did not answer; it is unknown whether the command ran. Retry it."""

    code = "unavailable"
    retryable = True


class Draining(RunControlError):
    """This process is draining (shutting down or being replaced): it takes no new work and
    did nothing with this command. Send it again after ``retry_after`` seconds: elsewhere, or
    here once the replacement answers (a router re-routes it at once)."""

    code = "draining"
    retryable = True


# ---------------------------------------------------------------------- operator controls


class RunSuspended(Conflict):
    """The run is suspended: it dispatches nothing new until an operator resumes it."""

    code = "run-suspended"


class RunNotSuspended(Conflict):
    code = "run-not-suspended"


class RunNotFinished(Conflict):
    """A rerun repeats a finished run only (Completed, Failed or Cancelled)."""

    code = "run-not-finished"
