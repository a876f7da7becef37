"""Typed errors of Run Control.

Every error carries a stable ``code`` and whether retrying the same command may succeed
(``retryable``). The code is the class's name in kebab-case (``StaleFencingToken``:
``stale-fencing-token``) unless the class sets one; clients match on it, so a rename changes
the wire. Only the HTTP and gRPC edges map codes to status codes. Errors pickle by value so
they cross the Ray boundary as themselves (a stale token stays a ``StaleFencingToken``).
"""

from __future__ import annotations

import re
from typing import Any, ClassVar


def _rebuild(cls: type[RunControlError], message: str, details: dict[str, Any]) -> RunControlError:
    return cls(message, **details)


class RunControlError(Exception):
    code: ClassVar[str] = "run-control-error"
    retryable: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """An error's ``code`` is its name in kebab-case unless it sets its own."""
        super().__init_subclass__(**kwargs)
        if "code" not in vars(cls):
            cls.code = re.sub(r"(?<!^)(?=[A-Z])", "-", cls.__name__).lower()

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


class ValidationFailed(RunControlError): ...


class ResultTooLarge(ValidationFailed):
    """An outcome's inline result is over ``RunControl:Results:MaxInlineBytes``: nothing is
    stored and the attempt stays open, so its holder can report a ``result_ref`` instead."""


class CallValueTooLarge(ValidationFailed):
    """A journaled call's value is over ``RunControl:Results:MaxInlineBytes`` of canonical
    JSON (the results' cap): nothing is stored. Keep the data elsewhere and return a reference
    to it ({uri, sha256, bytes}) from the function instead."""


class CallLimitReached(ValidationFailed):
    """The step has recorded as many journaled calls, or as many bytes of them, as
    ``RunControl:Calls:MaxPerStep`` / ``MaxBytesPerStep`` allow: nothing more is stored."""


class CallNotRecorded(ValidationFailed):
    """A read of a journaled call that has no stored value (a worker reads only the calls its
    grant listed)."""


class ReplayDiverged(ValidationFailed):
    """A replay run's call the original never made (or made with other arguments), a side
    effect in a replay, or an approval of a proposal the original never decided when the
    replay fails on those (docs/replay.md): the step's function fails it ``replay-diverged``
    (or, with ``liveCalls``, calls a model live)."""


class OutputChunkTooLarge(ValidationFailed):
    """A streamed chunk is over ``OUTPUT_CHUNK_MAX_BYTES`` (``domain.output``): not sent."""


class OutputLimitExceeded(ValidationFailed):
    """The attempt wrote ``OUTPUT_ATTEMPT_MAX_BYTES`` of output already: the chunks before the
    one that would pass it are stored, no later one of the attempt is."""


class OutcomeHashMismatch(ValidationFailed):
    """The ``outcomeHash`` sent is not the canonical hash of the result sent with it."""


class NotFound(RunControlError): ...


class RunNotFound(NotFound): ...


class ScheduleNotFound(NotFound): ...


class TemplateNotFound(NotFound): ...


class StepNotFound(NotFound): ...


class SignalNotAwaited(NotFound):
    """No step of the run waits for a signal of this name (nor ever will)."""


class AttemptNotFound(NotFound): ...


class ApprovalNotFound(NotFound): ...


class WorkflowNotFound(NotFound): ...


class ReleaseNotFound(NotFound): ...


class WebhookNotFound(NotFound): ...


class InvalidWebhookUrl(ValidationFailed): ...


class Conflict(RunControlError): ...


class IllegalTransition(Conflict): ...


class IdempotencyConflict(Conflict): ...


class ConcurrencyConflict(Conflict):
    """Another activation committed first (optimistic concurrency): reload and retry."""

    retryable = True


class PreApprovalUsedUp(Conflict):
    """A template's pre-approval reached its maxUses in another run's statement after this
    decision read its uses (the guard in ``runcontrol_template_use``): decided again on fresh
    uses, the request waits for a human."""

    retryable = True


class WebhookDisabled(Conflict): ...


class RunTerminal(Conflict): ...


class SignalAlreadyReceived(Conflict):
    """The steps waiting for this signal have theirs (a resend with the same key is answered
    with the first answer instead)."""


class LeaseHeld(Conflict):
    """The attempt's lease is held by another worker and has not expired."""

    retryable = True


class LeaseRejected(Conflict): ...


class StaleFencingToken(LeaseRejected): ...


class LeaseNotHeld(LeaseRejected): ...


class LeaseExpired(LeaseRejected): ...


class OutcomeAlreadyRecorded(Conflict): ...


class ApprovalVersionMismatch(Conflict): ...


class ApprovalAlreadyDecided(Conflict): ...


class ProposalHashMismatch(Conflict): ...


class ToolCallNotFound(NotFound): ...


class ToolCallConflict(Conflict):
    """The call id names a different request, or was claimed by another attempt, or already
    has a different result."""


class ToolCallRefused(Conflict):
    """No new side effect may start: the run is being cancelled."""


class ToolCallExpired(RunControlError):
    """The claim was closed without a result (claim timeout): its result is never stored."""


class DataLoss(RunControlError): ...


class ProgressGap(DataLoss):
    """A progress batch skipped a sequence number: the messages before the gap are stored,
    none after it. ``details``: ``acked_seq`` (resend from the next one) and ``gap_at``."""


class OutputGap(DataLoss):
    """An output write skipped a chunk number: the chunks before the gap are stored, none
    after it. ``details``: ``acked_seq`` (resend from the next one)."""


class ApprovalGone(RunControlError):
    """The approval request expired or went stale: the decision can never apply. ``details``:
    ``gone`` is ``expired`` or ``stale`` (a bulk decision's outcome tells them apart)."""


class Forbidden(RunControlError): ...


class SeparationOfDuties(Forbidden): ...


class BreakGlassReasonRequired(ValidationFailed): ...


class CapacityDenied(RunControlError):
    retryable = True


class FlowDenied(RunControlError):
    """The dispatching statement refused a slot of a concurrency key (or of the tenant's cap,
    migration 0017): its details say which key and what it found. The grain decides again,
    holding the step; never an answer to a caller."""

    retryable = True


class BudgetReservationDenied(RunControlError): ...


class Unavailable(RunControlError):
    """A dependency did not answer; it is unknown whether the command ran. Retry it."""

    retryable = True


class Draining(RunControlError):
    """This process is draining (shutting down or being replaced): it takes no new work and
    did nothing with this command. Send it again after ``retry_after`` seconds: elsewhere, or
    here once the replacement answers (a router re-routes it at once)."""

    retryable = True


class ShardMoving(Unavailable):
    """The tenant's virtual shard is moving to another database (docs/sharding.md): nothing
    was done; send the command again after ``retry_after`` seconds."""


class ShardMoved(Unavailable):
    """The database the command reached no longer holds the tenant's rows (a fence of a
    shard's move refused it, in its own transaction): nothing was done; route it again by a
    fresh directory and send it again."""


# ---------------------------------------------------------------------- operator controls


class RunSuspended(Conflict):
    """The run is suspended: it dispatches nothing new until an operator resumes it."""


class RunNotSuspended(Conflict): ...


class RunNotFinished(Conflict):
    """A rerun repeats a finished run only (Completed, Failed or Cancelled)."""
