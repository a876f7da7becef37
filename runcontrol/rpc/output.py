"""``WatchRun`` with ``include_output`` (issue 30, docs/streaming.md): the run's events and its
streamed output in one stream, read from the database and woken by the replica's LISTEN
connection (``edge.follow``), never by polling a run host.

An output chunk travels as a ``RunEvent`` of type ``OutputWritten`` with ``seq`` 0 and the
chunk in ``output`` (its cursor: ``output.position``). Each read takes the run, then its
events, then its output, so the output stored before the terminal event is always sent, and
before it: the stream ends with the terminal event, as without output.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, select

from schemas import runcontrol_pb2 as pb

from ..domain import RunState
from ..domain.events import TERMINAL_EVENTS
from ..edge.follow import Notified, Page, follow
from ..store import queries as q
from ..store.commit import EVENTS_CHANNEL
from ..store.notify import Listener
from ..store.output import OUTPUT_CHANNEL, output_after
from ..store.tables import runs
from .codec import json_text, timestamp
from .table import event_message

OUTPUT_WRITTEN = "OutputWritten"
BATCH = 500
HEARTBEAT_S = 15.0  # a read when nothing was notified for this long (a lost NOTIFY)

Cursor = tuple[int, int]  # (the last event seq, the last output position)
Found = tuple[str | None, list[dict[str, Any]], list[dict[str, Any]]]
Reader = Callable[[Callable[[Connection], Found]], Awaitable[Found]]


def output_message(chunk: dict[str, Any], run_id: UUID) -> pb.RunEvent:
    """A stored chunk (``store.output.output_view``) as the RunEvent that carries it."""
    output = pb.RunOutput(
        position=chunk["position"],
        attempt_id=chunk["attemptId"],
        step_id=chunk["stepId"],
        seq=chunk["seq"],
        text=chunk.get("text") or "",
        data_json=json_text(chunk["data"]) if "data" in chunk else "",
        written_at=timestamp(chunk["writtenAt"]),
    )
    return pb.RunEvent(
        type=OUTPUT_WRITTEN,
        run_id=str(run_id),
        step_id=chunk["stepId"],
        attempt_id=chunk["attemptId"],
        output=output,
    )


def _found(run_id: UUID, cursor: Cursor) -> Callable[[Connection], Found]:
    def read(conn: Connection) -> Found:
        state = conn.scalar(select(runs.c.state).where(runs.c.run_id == run_id))
        if state is None:
            return None, [], []
        events = q.events_after(conn, run_id, cursor[0], BATCH)
        return state, events, output_after(conn, run_id, cursor[1], BATCH)

    return read


def _page(run_id: UUID, found: Found, cursor: Cursor) -> Page[pb.RunEvent, Cursor]:
    state, events, chunks = found
    seq, position = cursor
    items = [output_message(c, run_id) for c in chunks]
    position = chunks[-1]["position"] if chunks else position
    if len(chunks) >= BATCH:  # the output first, to its end: then the events after it
        return Page(items, (seq, position), full=True)
    done = state is None or (not events and RunState(state).terminal)
    for event in events:
        items.append(event_message(event))
        seq = event["seq"]
        if event["type"] in TERMINAL_EVENTS:
            done = True
            break
    return Page(items, (seq, position), full=len(events) >= BATCH and not done, done=done)


def watch_with_output(
    listener: Listener, read: Reader, run_id: UUID, after_seq: int, after_position: int
) -> AsyncIterator[pb.RunEvent | None]:
    """The run's events after ``after_seq`` and its output after ``after_position``, live
    (None for each heartbeat without news), until its terminal event."""

    async def page(cursor: Cursor, _: int) -> Page[pb.RunEvent, Cursor]:
        return _page(run_id, await read(_found(run_id, cursor)), cursor)

    notified = Notified(listener, (EVENTS_CHANNEL, OUTPUT_CHANNEL), (str(run_id),))
    return follow(notified, page, (after_seq, after_position), HEARTBEAT_S)
