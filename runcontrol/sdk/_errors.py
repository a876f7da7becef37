"""What an agent function raises to say how it failed, and the outcome each one reports.

Whether a failure is worth retrying is data on the error (STYLE: the error carries it), and
the data is the spec's failure class: ``Transient`` -> Failed/transient (the control plane
retries while the step has attempts left), ``Permanent`` -> Failed/permanent (never retried),
``Uncertain`` -> Uncertain (a side effect may have happened: never retried automatically
for a step of side-effect class shared-write or above; an operator resolves it). Any other
exception is a bug of the function, reported as Failed/permanent.
"""

from __future__ import annotations

from ..domain import AttemptOutcome, FailureClass


class AgentError(Exception):
    """Base of the errors an agent function raises on purpose."""

    outcome: AttemptOutcome = AttemptOutcome.FAILED
    failure_class: FailureClass = FailureClass.PERMANENT


class Transient(AgentError):
    """A failure a retry may fix (a timeout, a rate limit, a flaky dependency)."""

    failure_class = FailureClass.TRANSIENT


class Permanent(AgentError):
    """A failure no retry fixes (bad input, a refused request)."""

    failure_class = FailureClass.PERMANENT


class Uncertain(AgentError):
    """The function cannot tell whether its side effect happened."""

    outcome = AttemptOutcome.UNCERTAIN
    failure_class = FailureClass.UNCERTAIN


def outcome_of(exc: BaseException) -> tuple[AttemptOutcome, FailureClass]:
    """The outcome and failure class an exception out of an agent function reports."""
    if isinstance(exc, AgentError):
        return exc.outcome, exc.failure_class
    return AttemptOutcome.FAILED, FailureClass.PERMANENT
