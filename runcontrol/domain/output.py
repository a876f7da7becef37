"""Streamed output (issue 30, docs/streaming.md): what a step's ``step.stream(chunk)`` writes,
its bounds, and what a write answers. Pure: the fenced insert is the store's
(``store.output``), the batching the SDK's (``sdk._output``).

A chunk is text (a ``str``) or any other JSON value. The lease holder numbers its chunks from 1
(``seq``, per lease: each lease of an attempt starts again at 1); the store gives each stored
chunk its number in the attempt (gap-free across the attempt's leases) and its ``position`` in
the run (gap-free, in commit order: the readers' cursor and the SSE id).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from . import errors
from .hashing import canonical_json

# The largest chunk, as UTF-8 text or canonical JSON bytes.
OUTPUT_CHUNK_MAX_BYTES = 64 * 1024
# What one attempt may write in all (its leases together); past it, writes are refused.
OUTPUT_ATTEMPT_MAX_BYTES = 8 * 1024 * 1024
# One write (one ``AppendOutput``): at most this many chunks and bytes (under gRPC's 4 MiB).
OUTPUT_WRITE_MAX_CHUNKS = 500
OUTPUT_WRITE_MAX_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class OutputChunk:
    """One chunk of a lease holder's output: ``seq`` from 1 per lease, without gaps; ``text``
    for text, else ``data`` (any JSON value but null)."""

    seq: int
    text: str | None = None
    data: Any = None

    @property
    def body(self) -> bytes:
        """What the chunk weighs against the limits (UTF-8 text, or canonical JSON)."""
        return self.text.encode() if self.text is not None else canonical_json(self.data)


@dataclass(frozen=True, slots=True)
class OutputAck:
    """The answer to a write: every chunk of this lease up to ``acked_seq`` is stored (a
    cumulative ack), ``stored`` of this write's were new and ``duplicates`` were resends."""

    attempt_id: UUID
    acked_seq: int
    stored: int
    duplicates: int


def chunk(seq: int, value: Any) -> OutputChunk:
    """The chunk ``value`` as the lease holder's ``seq``-th: a ``str`` is text, anything else
    a JSON value (None is refused); ``OutputChunkTooLarge`` past ``OUTPUT_CHUNK_MAX_BYTES``."""
    if value is None:
        raise errors.ValidationFailed("an output chunk is text or a JSON value, not None")
    made = OutputChunk(seq, text=value) if isinstance(value, str) else OutputChunk(seq, data=value)
    size = len(made.body)  # ValidationFailed for a value that is not JSON
    if size > OUTPUT_CHUNK_MAX_BYTES:
        raise errors.OutputChunkTooLarge(
            f"an output chunk is {size} bytes; at most {OUTPUT_CHUNK_MAX_BYTES}",
            bytes=size,
            limit=OUTPUT_CHUNK_MAX_BYTES,
        )
    return made


def check_write(chunks: Sequence[OutputChunk]) -> int:
    """A write's chunks as the store takes them: numbered from 1, in order, each within its
    limit, at most ``OUTPUT_WRITE_MAX_CHUNKS`` and ``OUTPUT_WRITE_MAX_BYTES``; answers the
    write's bytes."""
    if not chunks:
        raise errors.ValidationFailed("an output write needs at least one chunk")
    if len(chunks) > OUTPUT_WRITE_MAX_CHUNKS:
        raise errors.ValidationFailed(
            f"at most {OUTPUT_WRITE_MAX_CHUNKS} chunks per output write", count=len(chunks)
        )
    total = 0
    for i, c in enumerate(chunks):
        if c.seq < 1 or (i and c.seq != chunks[i - 1].seq + 1):
            raise errors.ValidationFailed("a write's chunks are numbered from 1, in sequence")
        if (c.text is None) == (c.data is None) or c.text == "":
            raise errors.ValidationFailed("an output chunk is non-empty text or a JSON value")
        total += len(chunk(c.seq, c.text if c.text is not None else c.data).body)
    if total > OUTPUT_WRITE_MAX_BYTES:
        raise errors.ValidationFailed(
            f"an output write is {total} bytes; at most {OUTPUT_WRITE_MAX_BYTES}", bytes=total
        )
    return total


def refusal(
    code: str, message: str, acked_seq: int, attempt_id: UUID, limit: int
) -> errors.RunControlError:
    """The typed error of a write the store refused (``code`` as the store names it): a stale
    lease, a gap (resend from ``acked_seq + 1``), the attempt's total (``limit``) reached."""
    cls: type[errors.RunControlError] = {
        errors.StaleFencingToken.code: errors.StaleFencingToken,
        errors.LeaseNotHeld.code: errors.LeaseNotHeld,
        errors.OutputGap.code: errors.OutputGap,
        errors.OutputLimitExceeded.code: errors.OutputLimitExceeded,
    }.get(code, errors.RunControlError)
    details: dict[str, Any] = {"attempt_id": str(attempt_id), "acked_seq": acked_seq}
    if cls is errors.OutputLimitExceeded:
        details["limit"] = limit
    return cls(message, **details)
