"""Outcomes: the lease holder's one report per attempt (invariant 5), and the lease expiry
reconciler's settlement of an attempt nobody reported (invariant 6 for side effects)."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any
from uuid import UUID

from .. import errors
from .. import events as ev
from ..hashing import HASH_PREFIX, canonical_hash, canonical_json, is_hash
from ..machines import (
    RunCommand,
    allows,
)
from ..model import (
    Attempt,
    AttemptResult,
)
from ..states import (
    AttemptOutcome,
    AttemptState,
    FailureClass,
    SideEffectClass,
)
from .core import RunAggregate
from .leases import held_lease, refused
from .settlement import after_settled, settle, settle_unreported
from .values import (
    WORKER_OUTCOMES,
    CommandContext,
    Options,
    failure_class_for,
)


def report_outcome(
    agg: RunAggregate,
    ctx: CommandContext,
    attempt_id: UUID,
    holder: str,
    fencing_token: int,
    outcome: AttemptOutcome,
    options: Options,
    *,
    failure_class: FailureClass | None = None,
    outcome_hash: str | None = None,
    lease_id: UUID | None = None,
    result: Any = None,
    result_ref: dict[str, Any] | None = None,
) -> Attempt:
    attempt = agg.attempt(attempt_id)
    if outcome not in WORKER_OUTCOMES:
        raise errors.ValidationFailed(f"a worker cannot report {outcome}")
    if outcome_hash is not None and not is_hash(outcome_hash):
        raise errors.ValidationFailed("outcomeHash must be a sha256 canonical hash")
    stored = _stored_result(ctx, attempt, result, result_ref, options)
    if stored is not None:
        # outcomeHash is the server's canonical hash of what it stores
        if outcome_hash is not None and outcome_hash != stored.outcome_hash:
            raise errors.OutcomeHashMismatch(
                "outcomeHash is not the canonical hash of the result sent",
                attempt_id=str(attempt_id),
                expected=stored.outcome_hash,
            )
        outcome_hash = stored.outcome_hash
    failure_class = failure_class_for(outcome, failure_class)
    if attempt.state.terminal:
        if (
            attempt.settled_by == holder
            and attempt.fencing_token == fencing_token
            and attempt.outcome is outcome
            and attempt.outcome_hash == outcome_hash
            and attempt.failure_class == failure_class
        ):
            return attempt  # the same report retried (at-least-once delivery): no effect
        if attempt.settled_by == holder and attempt.fencing_token == fencing_token:
            raise refused(
                agg,
                ctx,
                "duplicate-outcome",
                errors.OutcomeAlreadyRecorded(
                    "this attempt already has its outcome", attempt_id=str(attempt_id)
                ),
                attempt_id,
                holder,
                fencing_token=fencing_token,
                outcome=str(outcome),
            )
        raise refused(
            agg,
            ctx,
            "stale-fencing-token",
            errors.StaleFencingToken(
                f"the attempt was settled as {attempt.state}; this lease is stale",
                attempt_id=str(attempt_id),
            ),
            attempt_id,
            holder,
            fencing_token=fencing_token,
            reason=f"attempt settled as {attempt.state}",
        )
    held_lease(agg, ctx, attempt, holder, fencing_token, options, lease_id)
    if any(a.attempt_id == attempt_id for a in agg.pending_approvals()):
        raise errors.IllegalTransition(
            "the attempt awaits an approval decision; report after the decision"
        )
    settle(
        agg, ctx, attempt, outcome, failure_class, outcome_hash, settled_by=holder, result=stored
    )
    after_settled(agg, ctx, attempt, options)
    return attempt


def expire_lease(
    agg: RunAggregate, ctx: CommandContext, attempt_id: UUID, options: Options
) -> bool:
    """LeaseExpiryReconciler: settle an attempt whose lease passed expiry + grace."""
    attempt = agg.attempts.get(attempt_id)
    lease = agg.leases.get(attempt_id)
    if attempt is None or lease is None or attempt.state is not AttemptState.LEASED:
        return False
    if not allows(RunCommand.EXPIRE_LEASE, agg.run.state):
        return False  # the lease is suspended while a human decides
    if ctx.now <= lease.expires_at + timedelta(seconds=options.renewal_grace_seconds):
        return False
    agg.record(ctx, ev.LeaseExpired, lease, attempt)
    _settle_unheld(agg, ctx, attempt, "lease-expiry-reconciler", options)
    return True


def hand_back(
    agg: RunAggregate,
    ctx: CommandContext,
    attempt_id: UUID,
    holder: str,
    fencing_token: int,
    reason: str,
    options: Options,
    *,
    lease_id: UUID | None = None,
) -> Attempt:
    """The lease holder gives its attempt back before its lease ends (it cannot run it now:
    the worker is going away, a resource it needs is missing): the attempt settles at once as
    an expired lease would settle it, and its step is retried under its policy, instead of
    after the lease's expiry plus grace. ``TimedOut``, or ``Uncertain`` for a step whose side
    effect may have happened (invariant 6: the holder's word that it did nothing is not proof)."""
    attempt = agg.attempt(attempt_id)
    if not reason.strip():
        raise errors.ValidationFailed("a hand-back names its reason", field="reason")
    lease = held_lease(agg, ctx, attempt, holder, fencing_token, options, lease_id)
    if any(a.attempt_id == attempt_id for a in agg.pending_approvals()):
        raise errors.IllegalTransition(
            "the attempt awaits an approval decision; hand it back after the decision"
        )
    agg.record(ctx, ev.LeaseHandedBack, lease, attempt, reason=reason)
    _settle_unheld(agg, ctx, attempt, holder, options)
    return attempt


def _settle_unheld(
    agg: RunAggregate, ctx: CommandContext, attempt: Attempt, settled_by: str, options: Options
) -> None:
    """Its lease ended: the attempt settles with no outcome reported."""
    step = agg.step(attempt.step_id)
    if step.side_effect_class.at_least(SideEffectClass.SHARED_WRITE):
        # invariant 6: the side effect may have happened
        settle_unreported(
            agg, ctx, attempt, options, settled_by=settled_by, cause="OutcomeReported"
        )
    else:
        settle_unreported(
            agg,
            ctx,
            attempt,
            options,
            settled_by=settled_by,
            cause="LeaseExpired",
            outcome=AttemptOutcome.TIMED_OUT,
            failure_class=FailureClass.TRANSIENT,
        )


REF_KEYS = frozenset({"uri", "sha256", "bytes"})


def _stored_result(
    ctx: CommandContext,
    attempt: Attempt,
    result: Any,
    result_ref: dict[str, Any] | None,
    options: Options,
) -> AttemptResult | None:
    """What an outcome's result stores (checked before anything changes): the JSON result in
    canonical form, at most ``options.result_max_bytes`` of it, or a reference."""
    if result is None and result_ref is None:
        return None
    if result is not None and result_ref is not None:
        raise errors.ValidationFailed("an outcome carries a result or a result_ref, not both")
    if result_ref is not None:
        ref = _reference(result_ref)
        digest, size, text = canonical_hash(ref), ref["bytes"], None
    else:
        text = canonical_json(result)
        size = len(text)
        if size > options.result_max_bytes:
            raise errors.ResultTooLarge(
                f"the result is {size} bytes of canonical JSON, over the inline cap of "
                f"{options.result_max_bytes}: store it elsewhere and report a result_ref",
                attempt_id=str(attempt.attempt_id),
                bytes=size,
                max_bytes=options.result_max_bytes,
            )
        ref, digest = None, HASH_PREFIX + hashlib.sha256(text).hexdigest()
    return AttemptResult(
        attempt_id=attempt.attempt_id,
        step_id=attempt.step_id,
        run_id=attempt.run_id,
        tenant_id=attempt.tenant_id,
        outcome_hash=digest,  # canonical_hash of the stored value, from the bytes in hand
        bytes=size,
        created_at=ctx.now,
        result_json=None if text is None else text.decode(),
        result_ref=ref,
    )


def _reference(ref: Any) -> dict[str, Any]:
    """A ``{uri, sha256, bytes}`` reference to an artifact stored elsewhere."""
    if not isinstance(ref, dict) or set(ref) != REF_KEYS:
        raise errors.ValidationFailed("result_ref must be an object {uri, sha256, bytes}")
    uri, digest, size = ref["uri"], ref["sha256"], ref["bytes"]
    if not isinstance(uri, str) or not uri or len(uri) > 2048:
        raise errors.ValidationFailed("result_ref.uri must be a URI of at most 2048 characters")
    if not isinstance(digest, str) or not is_hash(
        digest if digest.startswith(HASH_PREFIX) else HASH_PREFIX + digest
    ):
        raise errors.ValidationFailed("result_ref.sha256 must be a sha256 hex digest")
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise errors.ValidationFailed("result_ref.bytes must be a non-negative integer")
    return {"uri": uri, "sha256": digest, "bytes": size}
