"""A run's streamed output (issue 30, docs/streaming.md): the plain read of what was written,
paged by position, and the live stream (Server-Sent Events).

Each chunk's ``position`` numbers it in the run, from 1, without gaps, in the order the chunks
were stored: the SSE ``id``, so a client reconnecting with ``Last-Event-ID`` (or ``?after=``)
gets every later chunk once. The live stream is the run events' loop (``edge.follow``): the
replica's LISTEN connection wakes it on ``runcontrol_output`` (the run id as payload, NOTIFYed
by each write that stored chunks); it reads the new chunks from the database, never from a run
host, and ends once the run is terminal and its output read to the end (no chunk is stored
after the run's last attempt settled).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any
from uuid import UUID

from fastapi.responses import Response, StreamingResponse
from sqlalchemy import Connection

from schemas.api import OutputChunkView

from ..domain import RunState
from ..edge.follow import Notified, Page, follow
from ..store.output import OUTPUT_CHANNEL, output_after
from . import routes
from .auth import RunsReader
from .context import Svc, found
from .events import (
    REPLAY_BATCH,
    ResumeAfter,
    Rows,
    RunAndRows,
    RunIdPath,
    RunPageQuery,
    admit_live_stream,
    counted,
    history,
    not_found,
    run_and_rows,
    sse_response,
    sse_stream,
    stream_responses,
)

router = routes.router("/factory/runs", "output")


def run_and_output(
    run_id: UUID, project_id: str | None, after: int, limit: int
) -> Callable[[Connection], RunAndRows]:
    """A read of the run and then its chunks after ``after`` (``events.run_and_rows``)."""
    return run_and_rows(output_after, run_id, project_id, after, limit)


def output_page(run: dict[str, Any], chunks: list[dict[str, Any]], after: int) -> Page[Any, int]:
    full = len(chunks) >= REPLAY_BATCH
    last = chunks[-1]["position"] if chunks else after
    return Page(chunks, last, full=full, done=RunState(run["state"]).terminal and not full)


def output_frame(chunk: dict[str, Any]) -> str:
    data = OutputChunkView.model_validate(chunk).model_dump_json(by_alias=True, exclude_none=True)
    return f"id: {chunk['position']}\nevent: output\ndata: {data}\n\n"


@router.get(
    "/{runId}/output", response_model=list[OutputChunkView], response_model_exclude_none=True
)
async def get_run_output(caller: RunsReader, svc: Svc, page: RunPageQuery) -> Rows:
    """The run's streamed output after a position, in position order.

    Scope `factory.runs.read`. `after` is the last position seen (0: from the start); positions
    number the run's chunks from 1 without gaps.
    """
    return await history(svc, caller, page, output_after)


@router.get(
    "/{runId}/output/stream",
    response_class=StreamingResponse,
    responses=stream_responses(
        "`id` = position, `event` = output, `data` = the chunk as GET /output answers it",
        "The run is terminal and no chunk follows the cursor.",
    ),
)
async def stream_run_output(
    caller: RunsReader, svc: Svc, run_id: RunIdPath, cursor: ResumeAfter
) -> Response:
    """Subscribe to the run's streamed output (Server-Sent Events, resumable).

    Scope `factory.runs.read`. Resumes after `Last-Event-ID` (or `?after=`); heartbeats are comment
    lines; the stream ends once the run is terminal and its output was sent.
    """
    tenant_id, project_id = caller.tenant_id, caller.project_scope
    notified = Notified(svc.feed, (OUTPUT_CHANNEL,), (str(run_id),))
    since = notified.generation()
    run, chunks = await svc.read_in_scope(
        caller, run_and_output(run_id, project_id, cursor, REPLAY_BATCH)
    )
    first = output_page(found(run, not_found(run_id)), chunks, cursor)
    if first.done and not chunks:
        return Response(status_code=204)  # nothing more will come: EventSource stops

    async def read(after: int, _: int) -> Page[Any, int]:
        run, chunks = await svc.read(
            tenant_id,
            run_and_output(run_id, project_id, after, REPLAY_BATCH),
            project_id=project_id,
        )
        return output_page(found(run, not_found(run_id)), chunks, after)

    heartbeat_s = svc.settings.api.sse_heartbeat_seconds
    frames: AsyncIterator[str] = sse_stream(
        follow(notified, read, cursor, heartbeat_s, first=first, since=since), output_frame
    )
    if not first.done:
        admit_live_stream(svc, "/output")
        frames = counted(svc.streams, frames)
    return sse_response(frames)
