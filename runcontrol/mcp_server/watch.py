"""A tool call that waits for its run: the run's events and streamed output as MCP progress
notifications, as they are stored, until the run ends or the wait is up.

The loop is every stream's (``edge.follow``): a read of the run, its events after a seq and
its output after a position, in the caller's scope (row-level security), woken by the
replica's LISTEN connection on either channel; nothing is kept here, so a client that goes
away loses nothing (the run goes on; ``wait_run`` or ``read_events`` pick it up after the
last seq seen). The wait is bounded as ``Prefer: wait`` is (``api.prefer_wait_max_seconds``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from schemas.api import EventEnvelope, OutputChunkView

from ..api.context import Services, found
from ..api.events import REPLAY_BATCH, not_found
from ..api.runs import get_run
from ..domain import RunState
from ..edge.auth import Caller
from ..edge.follow import Notified, Page, follow
from ..store import queries as q
from ..store.commit import EVENTS_CHANNEL
from ..store.output import OUTPUT_CHANNEL, output_after

# A progress notification: its count (growing with each one) and its message.
Progress = Callable[[float, str], Awaitable[None]]
Cursor = tuple[int, int]  # the last event seq and output position sent
Item = tuple[str, dict[str, Any]]  # ("event", an envelope) or ("output", a chunk)


def message(item: Item) -> str:
    """A progress message: the event's envelope, or the chunk, as the HTTP API shows them
    (JSON: ``{"event": ...}`` or ``{"output": ...}``)."""
    kind, row = item
    view = EventEnvelope if kind == "event" else OutputChunkView
    shown = view.model_validate(row).model_dump(mode="json", by_alias=True, exclude_none=True)
    return json.dumps({kind: shown}, separators=(",", ":"))


class Changes:
    """A run's events after a seq and output after a position, as they are stored, until the
    run ended (``edge.follow``: None for each heartbeat without any); ``latest`` is the run
    as the last read found it."""

    def __init__(self, svc: Services, caller: Caller, run_id: UUID, after: Cursor) -> None:
        self.svc = svc
        self.caller = caller
        self.run_id = run_id
        self.after = after
        self.latest: dict[str, Any] | None = None

    def _rows(self, cursor: Cursor) -> Callable[[Connection], tuple[Any, Any, Any]]:
        run_id, project = self.run_id, self.caller.project_scope

        def read(conn: Connection) -> tuple[Any, Any, Any]:
            run = q.get_run(conn, run_id, project_id=project)
            if run is None:
                return None, [], []
            seq, position = cursor
            return (
                run,
                q.events_after(conn, run_id, seq, REPLAY_BATCH),
                output_after(conn, run_id, position, REPLAY_BATCH),
            )

        return read

    async def _read(self, cursor: Cursor, _: int) -> Page[Item, Cursor]:
        run, rows, chunks = await self.svc.read_in_scope(self.caller, self._rows(cursor))
        self.latest = found(run, not_found(self.run_id))
        full = len(rows) >= REPLAY_BATCH or len(chunks) >= REPLAY_BATCH
        after = (
            rows[-1]["seq"] if rows else cursor[0],
            chunks[-1]["position"] if chunks else cursor[1],
        )
        items = [("event", r) for r in rows] + [("output", c) for c in chunks]
        done = RunState(self.latest["state"]).terminal and not full
        return Page(items, after, full=full, done=done)

    def __aiter__(self) -> AsyncIterator[Item | None]:
        svc = self.svc
        svc.feed.start()
        notified = Notified(svc.feed, (EVENTS_CHANNEL, OUTPUT_CHANNEL), (str(self.run_id),))
        return follow(notified, self._read, self.after, svc.settings.api.sse_heartbeat_seconds)


async def watch(
    svc: Services,
    caller: Caller,
    run_id: UUID,
    seconds: float | None,
    progress: Progress,
    after: Cursor = (0, 0),
) -> dict[str, Any]:
    """The run as ``get_run`` shows it once it ended, or as it is when ``seconds`` (None or
    more: ``api.prefer_wait_max_seconds``) are up; each event after the seq and chunk after
    the position ``after`` is sent to ``progress``."""
    cap = svc.settings.api.prefer_wait_max_seconds
    seconds = cap if seconds is None else min(seconds, cap)
    changes = Changes(svc, caller, run_id, after)
    items = aiter(changes)
    sent = 0
    try:
        async with asyncio.timeout(seconds):
            async for item in items:
                if item is not None:
                    sent += 1
                    await progress(sent, message(item))
    except TimeoutError:
        pass
    finally:
        await items.aclose()  # type: ignore[attr-defined]
    return changes.latest or await get_run(caller, svc, run_id)
