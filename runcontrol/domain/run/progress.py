"""Progress: the lease holder's ordered messages, each a per-run event (duplicates dropped,
a gap stops the batch)."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from .. import errors
from .. import events as ev
from ..model import (
    ProgressAck,
    ProgressMessage,
)
from .core import RunAggregate
from .leases import held_lease
from .values import (
    PROGRESS_BATCH_MAX,
    CommandContext,
    Options,
)


def report_progress(
    agg: RunAggregate,
    ctx: CommandContext,
    attempt_id: UUID,
    holder: str,
    fencing_token: int,
    messages: Sequence[ProgressMessage],
    options: Options,
    *,
    lease_id: UUID | None = None,
) -> ProgressAck:
    """Store the lease holder's progress messages in sequence, each as a per-run event
    (``ProgressReported``). A message at or below the attempt's last stored seq is a
    duplicate (a resend) and is dropped; a message past the next seq is a gap: the batch
    stops there, keeping what came before it (the answer's ``gap_at`` says where)."""
    if not messages:
        raise errors.ValidationFailed("a progress report needs at least one message")
    if len(messages) > PROGRESS_BATCH_MAX:
        raise errors.ValidationFailed(
            f"at most {PROGRESS_BATCH_MAX} progress messages per report",
            count=len(messages),
        )
    for message in messages:
        if message.seq < 1:
            raise errors.ValidationFailed("progress messages are numbered from 1")
    attempt = agg.attempt(attempt_id)
    held_lease(agg, ctx, attempt, holder, fencing_token, options, lease_id)
    stored = duplicates = 0
    gap_at: int | None = None
    for message in messages:
        if message.seq <= attempt.progress_seq:
            duplicates += 1
            continue
        if message.seq != attempt.progress_seq + 1:
            gap_at = message.seq
            break
        attempt.progress_seq = message.seq
        agg.changed(attempt)
        agg.record(ctx, ev.ProgressReported, attempt, message)
        stored += 1
    return ProgressAck(attempt_id, attempt.progress_seq, stored, duplicates, gap_at)


def gap_refusal(ack: ProgressAck) -> errors.ProgressGap | None:
    """The refusal a report answered with a gap gets, after the messages before the gap were
    stored (a resend of the command gets the same ack, so the same refusal)."""
    if ack.gap_at is None:
        return None
    return errors.ProgressGap(
        f"progress message {ack.gap_at} follows {ack.acked_seq}: resend from {ack.acked_seq + 1}",
        attempt_id=str(ack.attempt_id),
        acked_seq=ack.acked_seq,
        gap_at=ack.gap_at,
    )
