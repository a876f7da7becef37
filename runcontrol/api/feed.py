"""The tenant feed: every published event of the runs the caller may see, as one stream.

The SSE ``id`` is the event's feed position (``store.webhooks``): tenant-wide, growing in the
order events became visible, so ``Last-Event-ID`` (or ``?after=``) resumes with no gap and no
repeat. Events join the feed when the outbox relay publishes them (``scheduler.
outbox_relay_interval``, 1 s by default), and the relay's NOTIFY on ``runcontrol_feed`` (the
tenant as payload) wakes the tenant's streams on each replica. Project scope is the caller's,
as for per-run events, and row-level security enforces it too (0010). The stream never ends;
idle, it sends a heartbeat comment every ``api.sse_heartbeat_seconds``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

from fastapi import Query
from fastapi.responses import StreamingResponse

from schemas.api import FeedEvent

from ..edge.follow import Notified, Page, follow
from ..store import webhooks as store
from . import routes
from .auth import RunsReader
from .context import Services, Svc
from .events import (
    MAX_SEQ,
    REPLAY_BATCH,
    ResumeAfter,
    admit_live_stream,
    counted,
    sse_response,
    sse_stream,
    stream_responses,
)

router = routes.router("/factory/events", "events")


def feed_frame(event: dict[str, Any]) -> str:
    data = FeedEvent.model_validate(event).model_dump_json(by_alias=True)
    return f"id: {event['position']}\nevent: {event['type']}\ndata: {data}\n\n"


@router.get("/history", response_model=list[FeedEvent])
async def get_event_feed_history(
    caller: RunsReader,
    svc: Svc,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
    limit: Annotated[int, Query(ge=1, le=REPLAY_BATCH)] = 100,
) -> list[dict[str, Any]]:
    """The tenant feed's events after a position, in position order.

    Scope `factory.runs.read`; the caller's project only unless a role spans the tenant. `after` is
    the last position seen (0: from the oldest retained).
    """
    return await svc.read_in_scope(caller, lambda conn: store.feed_after(conn, after, limit))


def _live(
    svc: Services, tenant_id: str, project_id: str | None, after: int, since: int
) -> AsyncIterator[str]:
    async def read(cursor: int, generation: int) -> Page[dict[str, Any], int]:
        found = await svc.read(
            tenant_id,
            lambda conn: store.feed_after(conn, cursor, REPLAY_BATCH),
            project_id=project_id,
        )
        last = found[-1]["position"] if found else cursor
        return Page(found, last, full=len(found) >= REPLAY_BATCH)

    notified = Notified(svc.feed, (store.FEED_CHANNEL,), (tenant_id,))
    heartbeat_s = svc.settings.api.sse_heartbeat_seconds
    events = follow(notified, read, after, heartbeat_s, since=since)
    return sse_stream(events, feed_frame)


@router.get(
    "",
    response_class=StreamingResponse,
    responses=stream_responses(
        "`id` = feed position, `event` = type, `data` = the envelope with its `position`"
    ),
)
async def stream_event_feed(
    caller: RunsReader,
    svc: Svc,
    cursor: ResumeAfter,
) -> StreamingResponse:
    """Subscribe to every event of the runs the caller may see (SSE, resumable).

    Scope `factory.runs.read`. Resumes after `Last-Event-ID` (or `?after=`).
    """
    admit_live_stream(svc, "/factory/events/history")
    since = svc.feed.generation(store.FEED_CHANNEL, (caller.tenant_id,))
    frames = counted(svc.streams, _live(svc, caller.tenant_id, caller.project_scope, cursor, since))
    return sse_response(frames)
