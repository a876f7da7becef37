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


class CallFailed(AgentError):
    """A journaled call's function (``step.run``) ended in a final error, which is stored
    with the run: raised by ``step.run`` in the execution that called the function (from the
    function's exception) and in every later execution of the step, which does not call it
    again. Final: an ``AgentError`` that is not ``Transient`` (``Permanent``, ``Uncertain``,
    your own subclasses); it keeps the failure class of the error it stands for.
    ``error_type`` and ``error_message`` are that error's class name and message."""

    def __init__(self, name: str, occurrence: int, error: dict[str, str]) -> None:
        self.name = name
        self.occurrence = occurrence
        self.error_type = error["type"]
        self.error_message = error["message"]
        self.failure_class = FailureClass(error["failure_class"])
        if self.failure_class is FailureClass.UNCERTAIN:
            self.outcome = AttemptOutcome.UNCERTAIN
        super().__init__(f"{name} #{occurrence} failed: {self.error_type}: {self.error_message}")


class ReplayDiverged(AgentError):
    """A replay run's call its original did not make (or made with other arguments), and the
    replay makes none live; a side effect, or an approval the replay fails on: the step fails
    ``replay-diverged``, never retried (docs/replay.md)."""

    failure_class = FailureClass.REPLAY_DIVERGED


def outcome_of(exc: BaseException) -> tuple[AttemptOutcome, FailureClass]:
    """The outcome and failure class an exception out of an agent function reports."""
    if isinstance(exc, AgentError):
        return exc.outcome, exc.failure_class
    return AttemptOutcome.FAILED, FailureClass.PERMANENT
