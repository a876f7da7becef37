"""Tool calls: at most one execution per run and call id, claimed before the side effect;
a claim without a result past its timeout is closed and never executed."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from .. import errors
from .. import events as ev
from ..hashing import HASH_PREFIX, canonical_json, is_hash
from ..machines import (
    RunCommand,
    refusal,
)
from ..model import (
    Attempt,
    ToolCall,
    ToolCallClaim,
)
from ..states import (
    ToolCallState,
    ToolCallStatus,
)
from .core import RunAggregate
from .leases import held_lease, refused
from .values import (
    CLAIM_TIMED_OUT,
    MAX_CALL_ID,
    CommandContext,
    Options,
)


def _tool_call_checks(
    agg: RunAggregate,
    ctx: CommandContext,
    attempt_id: UUID,
    holder: str,
    fencing_token: int,
    call_id: str,
    options: Options,
    lease_id: UUID | None,
) -> Attempt:
    """What claims and completions share: a live run, and the caller's current lease."""
    if not call_id or len(call_id) > MAX_CALL_ID:
        raise errors.ValidationFailed(f"a call id has 1 to {MAX_CALL_ID} characters")
    attempt = agg.attempt(attempt_id)
    ended = refusal(RunCommand.USE_TOOL_CALL, agg.run.state)
    if ended is not None:
        raise refused(
            agg,
            ctx,
            "tool-call-after-run-ended",
            ended,
            attempt_id,
            holder,
            fencing_token=fencing_token,
            call_id=call_id,
            run_state=str(agg.run.state),
        )
    held_lease(agg, ctx, attempt, holder, fencing_token, options, lease_id)
    return attempt


def claim_tool_call(
    agg: RunAggregate,
    ctx: CommandContext,
    attempt_id: UUID,
    holder: str,
    fencing_token: int,
    call_id: str,
    request_hash: str,
    options: Options,
    *,
    lease_id: UUID | None = None,
) -> ToolCallClaim:
    """Claim ``call_id`` before its side effect. The first claim answers ``proceed``; any
    later one (another command, another attempt) answers what became of the first:
    ``in-progress``, ``completed`` (with its result hash) or ``expired``; never
    ``proceed`` again."""
    if not is_hash(request_hash):
        raise errors.ValidationFailed("requestHash must be a sha256 canonical hash")
    _tool_call_checks(agg, ctx, attempt_id, holder, fencing_token, call_id, options, lease_id)
    if agg.run.replay_of is not None:
        raise errors.ReplayDiverged(
            f"a replay executes no side effect (tool call {call_id!r}): the original's result "
            "answers the journaled call around it, or the step fails",
            call_id=call_id,
            why="side-effect",
        )
    existing = agg.tool_calls.get(call_id)
    if existing is not None:
        if existing.request_hash != request_hash:
            raise refused(
                agg,
                ctx,
                "tool-call-conflict",
                errors.ToolCallConflict(
                    "this call id was claimed for a different request", call_id=call_id
                ),
                attempt_id,
                holder,
                call_id=call_id,
                reason="another request under this call id",
            )
        return _claim_answer(existing, ctx.now)
    cancelling = refusal(RunCommand.START_TOOL_CALL, agg.run.state)
    if cancelling is not None:
        raise refused(
            agg,
            ctx,
            "tool-call-refused",
            cancelling,
            attempt_id,
            holder,
            call_id=call_id,
            reason="the run is being cancelled",
        )
    call = agg.new(
        ToolCall,
        tool_call_id=ctx.new_id(),
        call_id=call_id,
        attempt_id=attempt_id,
        request_hash=request_hash,
        claimed_by=holder,
        fencing_token=fencing_token,
        claimed_at=ctx.now,
        expires_at=ctx.now + timedelta(seconds=options.tool_call_claim_timeout_seconds),
    )
    agg.journal(ctx, "ToolCall", call.tool_call_id, None, call.state, "ToolCallClaimed")
    _emit_tool_call(agg, ctx, ev.ToolCallClaimed, call)
    return ToolCallClaim(call.tool_call_id, call_id, ToolCallStatus.PROCEED)


def complete_tool_call(
    agg: RunAggregate,
    ctx: CommandContext,
    attempt_id: UUID,
    holder: str,
    fencing_token: int,
    call_id: str,
    result_hash: str,
    options: Options,
    *,
    lease_id: UUID | None = None,
    result: Any = None,
) -> ToolCallClaim:
    """Store the result hash of a call this attempt claimed (the same result again is a
    no-op), and the result itself when sent (a repeat claim answers it). A claim past its
    timeout takes no result: it is closed, or about to be."""
    if not is_hash(result_hash):
        raise errors.ValidationFailed("resultHash must be a sha256 canonical hash")
    result_json = _result_text(result, result_hash, options)
    _tool_call_checks(agg, ctx, attempt_id, holder, fencing_token, call_id, options, lease_id)
    call = agg.tool_calls.get(call_id)
    if call is None:
        raise errors.ToolCallNotFound(f"no claim of call {call_id!r}", call_id=call_id)
    if call.attempt_id != attempt_id:
        raise refused(
            agg,
            ctx,
            "tool-call-conflict",
            errors.ToolCallConflict("another attempt claimed this call", call_id=call_id),
            attempt_id,
            holder,
            call_id=call_id,
            reason="claimed by another attempt",
        )
    if call.state is ToolCallState.COMPLETED:
        if call.result_hash == result_hash:
            return _claim_answer(call, ctx.now)  # the same completion retried
        raise errors.ToolCallConflict("the call already has a different result", call_id=call_id)
    if call.state is ToolCallState.EXPIRED or ctx.now >= call.expires_at:
        raise refused(
            agg,
            ctx,
            "tool-call-late-result",
            errors.ToolCallExpired(
                "the claim timed out without a result; the result is not stored",
                call_id=call_id,
            ),
            attempt_id,
            holder,
            call_id=call_id,
            result_hash=result_hash,
        )
    agg.move_tool_call(ctx, call, ToolCallState.COMPLETED)
    call.result_hash = result_hash
    call.result_json = result_json
    call.completed_at = ctx.now
    _emit_tool_call(agg, ctx, ev.ToolCallCompleted, call)
    return _claim_answer(call, ctx.now)


def _result_text(result: Any, result_hash: str, options: Options) -> str | None:
    """The canonical JSON of a completion's result (None: none sent), which must hash to
    ``result_hash`` and stay within the results' cap."""
    if result is None:
        return None
    text = canonical_json(result)
    if len(text) > options.result_max_bytes:
        raise errors.ResultTooLarge(
            f"the result is {len(text)} bytes of canonical JSON, over the cap of "
            f"{options.result_max_bytes}: complete the call with its hash only",
            bytes=len(text),
            max_bytes=options.result_max_bytes,
        )
    if HASH_PREFIX + hashlib.sha256(text).hexdigest() != result_hash:
        raise errors.OutcomeHashMismatch("resultHash is not the canonical hash of the result")
    return text.decode()


def expire_tool_calls(agg: RunAggregate, ctx: CommandContext) -> int:
    """The reminder's part: close every claim past its timeout without a result (it is
    never executed: a repeat claim answers ``expired``). Answers how many it closed."""
    closed = 0
    for call in agg.open_tool_calls():
        if ctx.now < call.expires_at:
            continue
        agg.move_tool_call(ctx, call, ToolCallState.EXPIRED)
        call.completed_at = ctx.now
        call.error = CLAIM_TIMED_OUT
        _emit_tool_call(agg, ctx, ev.ToolCallExpired, call)
        closed += 1
    return closed


def _emit_tool_call(
    agg: RunAggregate, ctx: CommandContext, event: type[ev.ToolCallEventBody], call: ToolCall
) -> None:
    agg.record(ctx, event, call, agg.attempt(call.attempt_id))


def _claim_answer(call: ToolCall, now: datetime) -> ToolCallClaim:
    """What a repeat claim of ``call`` answers (never ``proceed``)."""
    if call.state is ToolCallState.COMPLETED:
        status = ToolCallStatus.COMPLETED
    elif call.state is ToolCallState.EXPIRED or now >= call.expires_at:
        status = ToolCallStatus.EXPIRED  # past its timeout: closed by the next reminder
    else:
        status = ToolCallStatus.IN_PROGRESS
    error = call.error
    if status is ToolCallStatus.EXPIRED and error is None:
        error = CLAIM_TIMED_OUT
    return ToolCallClaim(
        call.tool_call_id, call.call_id, status, call.result_hash, error, call.result_json
    )
