"""Journaled calls (``step.run``): the first value recorded under (run, step, name,
occurrence) is stored with the run and handed back to every later execution of the step,
instead of calling the function again (DESIGN invariant 12).

A record is fenced by the lease, like an outcome: a stale holder's is refused and audited. The
key is the step's, not the attempt's, so a retried attempt, a re-entry after an approval and
an attempt re-leased on another worker all get the same value. When a value is already stored
under the key (two executions raced, or a worker that did not know of it), the record stores
nothing and answers the stored value: the caller uses it, not its own.
"""

from __future__ import annotations

import hashlib
from typing import Any
from uuid import UUID

from .. import errors
from .. import events as ev
from ..hashing import HASH_PREFIX, canonical_json
from ..model import JournaledCall, RecordedCall
from ..replay import Original, answer_call
from ..states import FailureClass
from .core import RunAggregate
from .leases import held_lease
from .values import MAX_CALL_NAME, CommandContext, Options

# The longest error message a failed call stores (the SDK cuts it to this).
MAX_ERROR_MESSAGE = 2000
ERROR_KEYS = frozenset({"type", "message", "failure_class"})
# What a replay's call keeps of the original's it is answered with.
COPIED = ("name", "occurrence", "value_hash", "bytes", "value_json", "error", "request_hash")


def record_call(
    agg: RunAggregate,
    ctx: CommandContext,
    attempt_id: UUID,
    holder: str,
    fencing_token: int,
    name: str,
    occurrence: int,
    value: Any,
    error: dict[str, Any] | None,
    read_only: bool,
    options: Options,
    *,
    lease_id: UUID | None = None,
    request_hash: str | None = None,
    replay: Original | None = None,
) -> RecordedCall:
    """Store ``value`` (or the final ``error``) of the ``occurrence``-th call named ``name``
    in this execution of the attempt's step, unless a value is stored under that key already:
    then store nothing and answer the stored one. ``read_only``: store nothing, answer the
    stored value (a grant past ``calls_grant_max_bytes`` listed the call without it); in a
    replay (``replay``: its original run), a call not stored yet is answered with the
    original's of the same step name, name, occurrence and arguments, stored as the replay's
    own, or refused (``ReplayDiverged``, docs/replay.md)."""
    if not name or len(name) > MAX_CALL_NAME:
        raise errors.ValidationFailed(
            f"a journaled call's name has 1 to {MAX_CALL_NAME} characters"
        )
    if occurrence < 1:
        raise errors.ValidationFailed("a journaled call's occurrence counts from 1")
    attempt = agg.attempt(attempt_id)
    held_lease(agg, ctx, attempt, holder, fencing_token, options, lease_id)
    stored = agg.calls.get((attempt.step_id, name, occurrence))
    if stored is not None:
        return _answer(stored, recorded=False)
    if read_only and replay is not None:
        step = agg.step(attempt.step_id).name
        found = answer_call(replay, step, name, occurrence, request_hash)
        copied = agg.new(
            JournaledCall,
            **{f: getattr(found, f) for f in COPIED},
            step_id=attempt.step_id,
            attempt_id=attempt_id,
            fencing_token=fencing_token,
            recorded_at=ctx.now,
        )
        agg.record(ctx, ev.CallRecorded, attempt, copied, failed=copied.error is not None)
        return _answer(copied, recorded=False)
    if read_only:
        raise errors.CallNotRecorded(
            f"no journaled call {name!r} #{occurrence} is stored for this step",
            name=name,
            occurrence=occurrence,
        )
    text, failed = _stored_text(value, error, options)
    size = len(text)
    sizes = [c.bytes for c in agg.calls.values() if c.step_id == attempt.step_id]
    if len(sizes) >= options.calls_max_per_step:
        raise errors.CallLimitReached(
            f"the step has recorded {len(sizes)} journaled calls, its maximum "
            "(RunControl:Calls:MaxPerStep)",
            max_calls=options.calls_max_per_step,
        )
    total = sum(sizes) + size
    if total > options.calls_max_bytes_per_step:
        raise errors.CallLimitReached(
            f"the step's journaled calls would hold {total} bytes, over its maximum of "
            f"{options.calls_max_bytes_per_step} (RunControl:Calls:MaxBytesPerStep)",
            max_bytes=options.calls_max_bytes_per_step,
        )
    call = agg.new(
        JournaledCall,
        step_id=attempt.step_id,
        name=name,
        occurrence=occurrence,
        attempt_id=attempt_id,
        fencing_token=fencing_token,
        value_hash=HASH_PREFIX + hashlib.sha256(text).hexdigest(),
        bytes=size,
        recorded_at=ctx.now,
        value_json=None if failed else text.decode(),
        error=error if failed else None,
        request_hash=request_hash,
    )
    agg.record(ctx, ev.CallRecorded, attempt, call, failed=failed)
    return _answer(call, recorded=True)


def _stored_text(value: Any, error: dict[str, Any] | None, options: Options) -> tuple[bytes, bool]:
    """The canonical JSON of what the record stores (the value, or ``{"error": error}``),
    checked against the results' cap; and whether it is an error."""
    if error is not None:
        if value is not None:
            raise errors.ValidationFailed("a journaled call records a value or an error, not both")
        _check_error(error)
        return canonical_json({"error": error}), True
    text = canonical_json(value)
    if len(text) > options.result_max_bytes:
        raise errors.CallValueTooLarge(
            f"the value is {len(text)} bytes of canonical JSON, over the cap of "
            f"{options.result_max_bytes} (RunControl:Results:MaxInlineBytes): keep it "
            "elsewhere and return a reference {uri, sha256, bytes} instead",
            bytes=len(text),
            max_bytes=options.result_max_bytes,
        )
    return text, False


def _check_error(error: dict[str, Any]) -> None:
    if set(error) != ERROR_KEYS:
        raise errors.ValidationFailed("a call's error is {type, message, failure_class}")
    kind, message, failure = error["type"], error["message"], error["failure_class"]
    if not isinstance(kind, str) or not 0 < len(kind) <= MAX_CALL_NAME:
        raise errors.ValidationFailed("a call's error type is a name of 1 to 200 characters")
    if not isinstance(message, str) or len(message) > MAX_ERROR_MESSAGE:
        raise errors.ValidationFailed(f"a call's error message has at most {MAX_ERROR_MESSAGE}")
    if failure not in {str(f) for f in FailureClass}:
        raise errors.ValidationFailed("a call's error failure_class is a failure class")


def _answer(call: JournaledCall, *, recorded: bool) -> RecordedCall:
    """What a record answers: the stored call, its content only when it is not the caller's."""
    return RecordedCall(
        name=call.name,
        occurrence=call.occurrence,
        value_hash=call.value_hash,
        bytes=call.bytes,
        recorded_at=call.recorded_at,
        recorded=recorded,
        value_json=None if recorded else call.value_json,
        error=call.error,
    )
