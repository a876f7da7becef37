"""``step.stream``: one attempt's streamed output as the worker batches it (docs/streaming.md).

Chunks are numbered per lease from 1 and held for up to ``linger_s`` (or until
``flush_chunks`` / ``flush_bytes`` of them wait), then written as one ``AppendOutput``: a model
streaming 100 tokens a second costs about ``1 / linger_s`` writes a second, not 100. One write
is in flight at a time, so the stream stays in order; a write whose answer was lost is resent
as it was (the same numbers: the store drops what it has). ``stream`` returns once the chunk
is queued; ``flush`` returns once every chunk queued is stored (the worker flushes before it
reports the outcome, before an approval parks the attempt and before a hand-back).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from typing import Any, Protocol

from ..commands import AppendOutput
from ..domain import errors
from ..domain.output import (
    OUTPUT_ATTEMPT_MAX_BYTES,
    OUTPUT_WRITE_MAX_BYTES,
    OUTPUT_WRITE_MAX_CHUNKS,
    OutputChunk,
    chunk,
)

log = logging.getLogger(__name__)

LINGER_S = 0.2  # how long a chunk waits for others to share its write
FLUSH_CHUNKS = 200  # ... unless this many wait
FLUSH_BYTES = 32 * 1024  # ... or this many bytes
# ``stream`` waits for the write in flight while this much is queued behind it (a function
# that produces faster than the store takes it slows down rather than buffering without end).
MAX_QUEUED_BYTES = 512 * 1024


class Holder(Protocol):
    """The attempt a stream writes for (``_step.AttemptContext``)."""

    def fenced(self) -> dict[str, Any]: ...

    async def fenced_send(self, command: AppendOutput) -> Any: ...


class OutputStream:
    def __init__(
        self,
        attempt: Holder,
        *,
        linger_s: float = LINGER_S,
        flush_chunks: int = FLUSH_CHUNKS,
        flush_bytes: int = FLUSH_BYTES,
    ) -> None:
        self._attempt = attempt
        self.linger_s = linger_s
        self.flush_chunks = min(flush_chunks, OUTPUT_WRITE_MAX_CHUNKS)
        self.flush_bytes = min(flush_bytes, OUTPUT_WRITE_MAX_BYTES)
        self._seq = 0  # the last chunk numbered
        self._queued: deque[tuple[OutputChunk, int]] = deque()  # (chunk, its bytes)
        self._queued_bytes = 0
        self._written = 0  # bytes this lease queued in all (the attempt's cap, checked early)
        self._now = asyncio.Event()  # write without lingering
        self._writer: asyncio.Future[None] | None = None
        self._failed: BaseException | None = None
        self.writes = 0  # AppendOutput commands answered (tests, benchmarks)

    async def add(self, value: Any) -> None:
        """Queue ``value`` (text, or a JSON value) as the next chunk."""
        if self._failed is not None:
            raise self._failed
        made = chunk(self._seq + 1, value)  # OutputChunkTooLarge, ValidationFailed
        size = len(made.body)
        if self._written + size > OUTPUT_ATTEMPT_MAX_BYTES:
            raise errors.OutputLimitExceeded(
                f"the attempt's output is at most {OUTPUT_ATTEMPT_MAX_BYTES} bytes",
                acked_seq=self._seq,
                limit=OUTPUT_ATTEMPT_MAX_BYTES,
            )
        self._seq += 1
        self._written += size
        self._queued.append((made, size))
        self._queued_bytes += size
        if len(self._queued) >= self.flush_chunks or self._queued_bytes >= self.flush_bytes:
            self._now.set()
        if self._writer is None or self._writer.done():
            self._writer = asyncio.ensure_future(self._write())
        if self._queued_bytes > MAX_QUEUED_BYTES:
            await asyncio.wait({self._writer})
            if self._failed is not None:
                raise self._failed

    async def flush(self) -> None:
        """Return once every chunk queued is stored; raise why not if the stream failed."""
        writer = self._writer
        if writer is not None and not writer.done():
            self._now.set()
            await asyncio.wait({writer})
        if self._failed is not None:
            raise self._failed

    def close(self) -> None:
        """Drop what is queued (the attempt ended without an outcome to report)."""
        if self._writer is not None:
            self._writer.cancel()
        self._queued.clear()

    async def _write(self) -> None:
        while self._queued:
            if not self._now.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._now.wait(), self.linger_s)
            self._now.clear()
            batch = self._take()
            command = AppendOutput(**self._attempt.fenced(), chunks=batch)
            try:
                # resent as it is after a lost answer; a refusal for good stops the attempt
                # (``LeaseLost``), the attempt's total reached is ``OutputLimitExceeded``
                await self._attempt.fenced_send(command)
            except asyncio.CancelledError:
                raise
            except BaseException as exc:  # noqa: BLE001 - kept for the function's next call
                self._fail(exc)
                return
            self.writes += 1

    def _take(self) -> tuple[OutputChunk, ...]:
        taken: list[OutputChunk] = []
        size = 0
        while self._queued and len(taken) < self.flush_chunks:
            made, weight = self._queued[0]
            if taken and size + weight > OUTPUT_WRITE_MAX_BYTES:
                break
            self._queued.popleft()
            taken.append(made)
            size += weight
        self._queued_bytes -= size
        if len(self._queued) >= self.flush_chunks or self._queued_bytes >= self.flush_bytes:
            self._now.set()
        return tuple(taken)

    def _fail(self, exc: BaseException) -> None:
        attempt_id = self._attempt.fenced()["attempt_id"]
        log.warning("attempt %s: streamed output stopped: %r", attempt_id, exc)
        self._failed = exc
        self._queued.clear()
        self._queued_bytes = 0
