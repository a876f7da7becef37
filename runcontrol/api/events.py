"""Per-run events: the persisted history (JSON) and the live stream (Server-Sent Events).

The SSE ``id`` is the run's gap-free event ``seq``, so a client that reconnects with
``Last-Event-ID`` (or ``?after=``) resumes exactly after the last event it saw. Live streams
never call a run host: the replica's one LISTEN connection (``Services.feed``, channel
``runcontrol_events``, the run id as payload, NOTIFYed by every commit) wakes the streams of
that run, and each reads its new events from the database. While none arrive a stream sends a
comment line every ``api.sse_heartbeat_seconds`` (and reads once, in case a notification was
lost). The stream ends after the run's terminal event.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar
from uuid import UUID

from fastapi import Depends, Header, Path, Query
from fastapi.responses import Response, StreamingResponse
from sqlalchemy import Connection

from schemas.api import EventEnvelope

from ..domain import RunState, errors
from ..domain.events import TERMINAL_EVENTS
from ..edge.follow import Notified, Page, follow
from ..store import queries as q
from ..store.commit import EVENTS_CHANNEL
from . import routes
from .auth import Caller, RunsReader
from .context import Services, Streams, Svc, found
from .problems import TooManySubscribers, responses

router = routes.router("/factory/runs", "events")

T = TypeVar("T")
RunIdPath = Annotated[UUID, Path(alias="runId")]
Item = TypeVar("Item")  # what a counted stream sends (an SSE frame, an A2A event)
MAX_SEQ = 2**63 - 1
REPLAY_BATCH = 500
# A history read's cursor (the last seq or position seen) and page size.
AfterQuery = Annotated[int, Query(ge=0, le=MAX_SEQ)]
LimitQuery = Annotated[int, Query(ge=1, le=REPLAY_BATCH)]
RETRY_MS = 2000
FEED_APPLICATION_NAME = "runcontrol-sse-feed"  # the feed's session in pg_stat_activity


def sse_frame(event: dict[str, Any]) -> str:
    """One event as an SSE frame; ``data`` is the same envelope the history answers with."""
    data = EventEnvelope.model_validate(event).model_dump_json(by_alias=True)
    return f"id: {event['seq']}\nevent: {event['type']}\ndata: {data}\n\n"


async def resume_after(
    after: Annotated[int | None, Query(ge=0, le=MAX_SEQ)] = None,
    last_event_id: Annotated[int | None, Header(alias="Last-Event-ID", ge=0, le=MAX_SEQ)] = None,
) -> int:
    """Where a stream starts: after ``Last-Event-ID`` (an EventSource reconnecting), else
    after ``?after=``, else from the start."""
    return last_event_id if last_event_id is not None else (after or 0)


# A stream route's position to resume after (``resume_after``).
ResumeAfter = Annotated[int, Depends(resume_after)]


def admit_live_stream(svc: Services, history: str) -> None:
    """Refuse a live stream (429) while this replica serves ``api.sse_max_streams`` already,
    pointing at the ``history`` read instead; else make sure the replica listens."""
    if svc.streams.live >= svc.settings.api.sse_max_streams:
        raise TooManySubscribers(
            f"this replica already serves {svc.streams.live} live event streams; "
            f"retry later (another replica may take it) or read {history}"
        )
    svc.feed.start()


def sse_response(frames: AsyncIterator[str]) -> StreamingResponse:
    """A stream of SSE frames as the answer, never cached nor buffered by a proxy."""
    return StreamingResponse(
        frames,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


def stream_responses(frames: str, ended: str | None = None) -> dict[int | str, dict[str, Any]]:
    """A Server-Sent Events route's answers: the stream (``frames``: what each frame holds),
    204 when the stream has ``ended`` before it starts, 429 with too many streams open."""
    answers: dict[int | str, dict[str, Any]] = {
        200: {
            "description": f"A text/event-stream: {frames}.",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        }
    }
    if ended is not None:
        answers[204] = {"description": ended}
    return {**answers, **responses(429)}


Rows = list[dict[str, Any]]
RunAndRows = tuple[dict[str, Any] | None, Rows]
# A run's rows after a cursor, in cursor order: ``q.events_after``, ``store.output.output_after``.
RowsAfter = Callable[[Connection, UUID, int, int], Rows]


def run_and_rows(
    rows_after: RowsAfter, run_id: UUID, project_id: str | None, after: int, limit: int
) -> Callable[[Connection], RunAndRows]:
    """A read of the run (None: not in this tenant or not in ``project_id``) and then its rows
    after ``after``: read in that order, a terminal run's rows are read to their end."""

    def read(conn: Connection) -> RunAndRows:
        run = q.get_run(conn, run_id, project_id=project_id)
        if run is None:
            return None, []
        return run, rows_after(conn, run_id, after, limit)

    return read


def not_found(run_id: UUID) -> errors.RunNotFound:
    return errors.RunNotFound(f"run {run_id} not found")


@dataclass(frozen=True)
class RunPage:
    """A page of a run's history: the rows after ``after`` (the last seq or position seen)."""

    run_id: UUID
    after: int
    limit: int


async def run_page(run_id: RunIdPath, after: AfterQuery = 0, limit: LimitQuery = 100) -> RunPage:
    return RunPage(run_id, after, limit)


async def history(svc: Services, caller: Caller, page: RunPage, rows_after: RowsAfter) -> Rows:
    """A page of the run's history in the caller's scope; 404 for a run it may not see."""
    read = run_and_rows(rows_after, page.run_id, caller.project_scope, page.after, page.limit)
    run, rows = await svc.read_in_scope(caller, read)
    found(run, not_found(page.run_id))
    return rows


RunPageQuery = Annotated[RunPage, Depends(run_page)]


@router.get("/{runId}/events/history", response_model=list[EventEnvelope])
async def get_run_event_history(caller: RunsReader, svc: Svc, page: RunPageQuery) -> Rows:
    """The run's persisted events after a cursor, in sequence order.

    Scope `factory.runs.read`. `after` is the last seq seen (0: from the start).
    """
    return await history(svc, caller, page, q.events_after)


async def _replay(
    svc: Services, tenant_id: str, project_id: str | None, run_id: UUID, first: list[dict[str, Any]]
) -> AsyncIterator[str]:
    """A terminal run's remaining events, straight from the store."""
    batch = first
    while batch:
        for event in batch:
            yield sse_frame(event)
        if len(batch) < REPLAY_BATCH:
            return
        read = run_and_rows(q.events_after, run_id, project_id, batch[-1]["seq"], REPLAY_BATCH)
        _, batch = await svc.read(tenant_id, read, project_id=project_id)


def _events_after(run_id: UUID, after: int) -> Callable[[Connection], list[dict[str, Any]]]:
    return lambda conn: q.events_after(conn, run_id, after, REPLAY_BATCH)


# Reads in flight, each shared by the streams of one run woken by the same notification at the
# same cursor (a replica's streams of a run all receive the same events).
_SHARED_READS: dict[tuple[Any, ...], asyncio.Future[list[dict[str, Any]]]] = {}


async def _shared_read(
    svc: Services, tenant_id: str, project_id: str | None, run_id: UUID, after: int, since: int
) -> list[dict[str, Any]]:
    """The run's events after ``after``, read once for all of this replica's streams of the
    run that ask at feed generation ``since``: a read started at ``since`` sees every commit
    notified up to it, so a stream may share it."""
    key = (id(svc), tenant_id, project_id, run_id, after, since)
    read = _SHARED_READS.get(key)
    if read is None:
        read = asyncio.ensure_future(
            svc.read(tenant_id, _events_after(run_id, after), project_id=project_id)
        )
        _SHARED_READS[key] = read
        read.add_done_callback(lambda _: _SHARED_READS.pop(key, None))
    return await asyncio.shield(read)


def event_page(events: list[dict[str, Any]], after: int) -> Page[dict[str, Any], int]:
    """A read of the run's events as a page: it ends at the run's terminal event."""
    for i, event in enumerate(events):
        if event["type"] in TERMINAL_EVENTS:
            return Page(events[: i + 1], event["seq"], done=True)
    return Page(events, events[-1]["seq"] if events else after, full=len(events) >= REPLAY_BATCH)


async def sse_stream(
    items: AsyncIterator[T | None], frame: Callable[[T], str]
) -> AsyncIterator[str]:
    """A followed stream (``edge.follow``) as SSE: the reconnect delay first (it also sends
    the headers at once), then each item's frame, a comment line for each heartbeat."""
    yield f"retry: {RETRY_MS}\n\n"
    async for item in items:
        yield ": heartbeat\n\n" if item is None else frame(item)


def _live(
    svc: Services,
    tenant_id: str,
    project_id: str | None,
    run_id: UUID,
    first: list[dict[str, Any]],
    after: int,
    since: int,
) -> AsyncIterator[str]:
    """Events as the run commits them; a heartbeat comment whenever none came for a while.
    ``since`` is the feed's generation for the run taken before ``first`` was read, so a
    commit after that read wakes this stream at once."""

    async def read(cursor: int, generation: int) -> Page[dict[str, Any], int]:
        found = await _shared_read(svc, tenant_id, project_id, run_id, cursor, generation)
        return event_page(found, cursor)

    notified = Notified(svc.feed, (EVENTS_CHANNEL,), (str(run_id),))
    heartbeat_s = svc.settings.api.sse_heartbeat_seconds
    events = follow(notified, read, after, heartbeat_s, first=event_page(first, after), since=since)
    return sse_stream(events, sse_frame)


async def counted(streams: Streams, frames: AsyncIterator[Item]) -> AsyncIterator[Item]:
    """The stream, counted as one of the replica's live streams from its first frame until it
    ends. Counting starts here, not in the route: a response never streamed (the client went
    away first) never runs this, so it cannot leak a count. Two requests racing past the
    route's check may both stream: the limit is a guard, not an exact quota."""
    streams.live += 1
    try:
        async for frame in frames:
            yield frame
    finally:
        streams.live -= 1
        with contextlib.suppress(Exception):
            await frames.aclose()  # type: ignore[attr-defined]


@router.get(
    "/{runId}/events",
    response_class=StreamingResponse,
    responses=stream_responses(
        "`id` = seq, `event` = type, `data` = envelope",
        "The run is terminal and no event follows the cursor.",
    ),
)
async def stream_run_events(
    caller: RunsReader,
    svc: Svc,
    run_id: RunIdPath,
    cursor: ResumeAfter,
) -> Response:
    """Subscribe to the run's events (Server-Sent Events, resumable).

    Scope `factory.runs.read`. Resumes after `Last-Event-ID` (or `?after=`); heartbeats are comment
    lines; the stream ends after RunCompleted, RunFailed or RunCancelled.
    """
    tenant_id, project_id = caller.tenant_id, caller.project_scope
    since = svc.feed.generation(EVENTS_CHANNEL, (str(run_id),))
    run, first = await svc.read_in_scope(
        caller, run_and_rows(q.events_after, run_id, project_id, cursor, REPLAY_BATCH)
    )
    run = found(run, not_found(run_id))
    frames: AsyncIterator[str]
    if RunState(run["state"]).terminal:
        if not first:
            return Response(status_code=204)  # nothing more will come: EventSource stops
        frames = _replay(svc, tenant_id, project_id, run_id, first)
    else:
        admit_live_stream(svc, "/events/history")
        frames = counted(
            svc.streams, _live(svc, tenant_id, project_id, run_id, first, cursor, since)
        )
    return sse_response(frames)
