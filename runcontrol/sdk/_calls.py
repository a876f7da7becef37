"""Journaled calls as one execution of a step sees them (``step.run``, docs/workers.md).

The grant carries the values its step recorded (``Grant.calls``), so replaying a call costs
no round trip; this execution numbers its calls per name (the n-th call of a name is its
``occurrence``), finds each in what the grant carried, and records the ones it runs.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from ..domain import FailureClass, JournaledCall, RecordedCall, canonical_hash, canonical_json
from ..domain.run.journaled_calls import MAX_ERROR_MESSAGE
from ._errors import AgentError, CallFailed

# A value nobody stored yet (None is a value a call may return).
MISSING: Any = object()


class CallJournal:
    """This execution's journaled calls: what the grant carried, and how many calls of each
    name it made so far."""

    def __init__(self, calls: Sequence[JournaledCall]) -> None:
        self._stored = {(c.name, c.occurrence): c for c in calls}
        self._made: dict[str, int] = {}

    def next_occurrence(self, name: str) -> int:
        occurrence = self._made.get(name, 0) + 1
        self._made[name] = occurrence
        return occurrence

    def stored(self, name: str, occurrence: int) -> JournaledCall | None:
        return self._stored.get((name, occurrence))


def inline(call: JournaledCall) -> bool:
    """Whether the grant carried the call's content (past its cap it carries the hash only)."""
    return call.value_json is not None or call.error is not None


def replayed(
    name: str, occurrence: int, value_json: str | None, error: dict[str, Any] | None
) -> Any:
    """The value a stored call answers (its JSON value), or its final error raised."""
    if error is not None:
        raise CallFailed(name, occurrence, error)
    return None if value_json is None else json.loads(value_json)


def arguments_hash(args: Sequence[Any], kwargs: dict[str, Any]) -> str | None:
    """The canonical hash of a call's arguments, stored with its value: what a replay matches
    the call by (docs/replay.md). None without arguments, or when they are not JSON (the call
    is then matched by its name and occurrence alone)."""
    if not args and not kwargs:
        return None
    try:
        return canonical_hash({"args": list(args), "kwargs": kwargs})
    except (TypeError, ValueError):
        return None


def as_json(value: Any) -> tuple[Any, bytes]:
    """What a call's value is stored as: its JSON value (what ``step.run`` answers in every
    execution alike: a tuple comes back a list) and its canonical JSON."""
    text = canonical_json(value)
    return json.loads(text), text


def final_error(exc: BaseException) -> dict[str, str] | None:
    """The stored form of an exception a call's function raised, if it is final (recorded):
    an ``AgentError`` that is not ``Transient``. Anything else is not recorded: a ``Transient``
    (the next execution calls the function again), any other exception (a bug or an
    unexpected failure: it fails the attempt as it would outside ``step.run``, and a retry
    after a fix calls the function again), a cancellation or a lost lease."""
    if not isinstance(exc, AgentError) or exc.failure_class is FailureClass.TRANSIENT:
        return None
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:MAX_ERROR_MESSAGE],
        "failure_class": str(exc.failure_class),
    }


def answered(name: str, occurrence: int, answer: RecordedCall, own: Any) -> Any:
    """What a record's answer makes of the call: ``own`` when it is the stored value, else
    the value (or error) stored first by another execution."""
    if answer.recorded:
        return own
    return replayed(name, occurrence, answer.value_json, answer.error)
