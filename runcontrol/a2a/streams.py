"""A task's stream (``SendStreamingMessage``, ``SubscribeToTask``): the task, then its run's
events as status updates and its steps' streamed output (docs/streaming.md) as artifact
updates, read from the store after a cursor and woken by the replica's LISTEN connection
(``edge.follow``), so any replica streams any task, and a stream resumes where it stopped.

- **Output.** One artifact per step (``{runId}:output:{stepId}``, named after the step): each
  stored chunk is a ``TaskArtifactUpdateEvent`` with one part (text, or a data part), in the
  run's output order; ``append`` but for an attempt's first chunk (a retried step's next
  attempt starts the artifact afresh). Once the attempt has settled (its
  ``AttemptOutcomeRecorded``, or the run's end for one settled without it, a parked attempt
  cancelled), an update with no part and ``lastChunk`` closes it: no chunk is stored after its
  attempt settled, and each read takes the events before the output, so the closing comes
  after every chunk of the attempt.
- **Cursor.** Every update's ``metadata.runcontrol.cursor`` says where a stream resumes after
  it (``Last-Event-ID``): ``{seq}:{position}`` (the run event seq and output position sent),
  with ``:closing`` on the status update after which an attempt's closing comes (resumed there,
  the closing comes first). A bare ``{seq}`` (the form before output) and no cursor at all
  start the output from its beginning (an artifact must be whole).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    Task,
    TaskArtifactUpdateEvent,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError
from google.protobuf.json_format import ParseDict
from google.protobuf.struct_pb2 import Value
from sqlalchemy import Connection

from ..domain import RunState
from ..domain.events import TERMINAL_EVENTS
from ..edge.follow import Notified, Page, follow
from ..store import queries as q
from ..store.commit import EVENTS_CHANNEL
from ..store.notify import Listener
from ..store.output import OUTPUT_CHANNEL, output_after, streamed_attempts
from . import tasks

Event = Task | Message | TaskStatusUpdateEvent | TaskArtifactUpdateEvent

BATCH = 500  # events, and chunks, per read of a stream
HEARTBEAT_S = 15.0  # a stream reads again after this long without a notification
CURSOR_HEADER = "last-event-id"  # a stream resumes after this cursor
OUTPUT_ARTIFACT = "output"
SETTLED = "AttemptOutcomeRecorded"
_CLOSING = "closing"


@dataclass(frozen=True, slots=True)
class Cursor:
    """Where a stream is: the last run event whose status update was sent, the last output
    chunk sent, and whether the closings the event ``seq`` brings are still to send."""

    seq: int
    position: int = 0
    closing: bool = False

    def __str__(self) -> str:
        return f"{self.seq}:{self.position}" + (f":{_CLOSING}" if self.closing else "")

    @classmethod
    def parse(cls, raw: str) -> Cursor:
        parts = raw.split(":")
        try:
            if len(parts) > 3 or (len(parts) == 3 and parts[2] != _CLOSING):
                raise ValueError(raw)
            seq, position = int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
        except ValueError:
            raise InvalidParamsError(
                "Last-Event-ID must be a stream cursor (metadata.runcontrol.cursor)"
            ) from None
        if not (0 <= seq < 2**63 and 0 <= position < 2**63):
            raise InvalidParamsError("Last-Event-ID must be a stream cursor")
        return cls(seq, position, len(parts) == 3)


@dataclass(frozen=True, slots=True)
class Found:
    """One read of a stream: the run (None: gone from the caller's sight), its events after
    the cursor, its output after it, and the attempts with output each event settled."""

    view: dict[str, Any] | None
    events: list[dict[str, Any]]
    chunks: list[dict[str, Any]]
    settled: dict[int, list[tuple[str, str]]]  # event seq -> [(step id, attempt id)]


def _read(run_id: UUID, project: str | None, cursor: Cursor) -> Callable[[Connection], Found]:
    def query(conn: Connection) -> Found:
        view = q.get_run(conn, run_id, project_id=project)
        if view is None:
            return Found(None, [], [], {})
        # The events first: an attempt they settle stored all its chunks before, so the
        # output read after them holds every one (the closing never precedes a chunk).
        after = cursor.seq - 1 if cursor.closing else cursor.seq
        events = q.events_after(conn, run_id, after, BATCH)
        chunks = output_after(conn, run_id, cursor.position, BATCH)
        return Found(view, events, chunks, _settling(conn, run_id, events))

    return query


def _settling(
    conn: Connection, run_id: UUID, events: list[dict[str, Any]]
) -> dict[int, list[tuple[str, str]]]:
    """For each of ``events`` that settles attempts which streamed output, those attempts: its
    ``AttemptOutcomeRecorded``'s, and at the run's end every one settled without it."""
    outcomes = {e["seq"]: str(e["payload"]["attemptId"]) for e in events if e["type"] == SETTLED}
    ends = [e["seq"] for e in events if e["type"] in TERMINAL_EVENTS]
    if not outcomes and not ends:
        return {}
    streamed = streamed_attempts(conn, run_id, None if ends else list(outcomes.values()))
    reported = q.attempts_in_events(conn, run_id, SETTLED) if ends else set()
    found: dict[int, list[tuple[str, str]]] = {}
    for seq, attempt in outcomes.items():
        if attempt in streamed:
            found[seq] = [(streamed[attempt], attempt)]
    for seq in ends:
        unreported = sorted(a for a in streamed if a not in reported)
        if unreported:
            found[seq] = [(streamed[a], a) for a in unreported]
    return found


def _meta(update: TaskStatusUpdateEvent | TaskArtifactUpdateEvent, **fields: Any) -> None:
    update.metadata.update({tasks.META: fields})


def _chunk_update(view: dict[str, Any], chunk: dict[str, Any], cursor: Cursor) -> Event:
    step_id = str(chunk["stepId"])
    part = (
        Part(text=chunk["text"])
        if "text" in chunk
        else Part(data=ParseDict(chunk["data"], Value()))
    )
    update = TaskArtifactUpdateEvent(
        task_id=str(view["runId"]),
        context_id=tasks.context_id(view),
        artifact=_artifact(view, step_id, [part]),
        append=chunk["seq"] > 1,
    )
    _meta(
        update,
        cursor=str(cursor),
        position=chunk["position"],
        attemptId=chunk["attemptId"],
        stepId=step_id,
        seq=chunk["seq"],
    )
    return update


def _closing_update(view: dict[str, Any], step_id: str, attempt_id: str, cursor: Cursor) -> Event:
    update = TaskArtifactUpdateEvent(
        task_id=str(view["runId"]),
        context_id=tasks.context_id(view),
        artifact=_artifact(view, step_id, []),
        append=True,
        last_chunk=True,
    )
    _meta(update, cursor=str(cursor), attemptId=attempt_id, stepId=step_id)
    return update


def _artifact(view: dict[str, Any], step_id: str, parts: list[Part]) -> Artifact:
    name = next((str(s["name"]) for s in view["steps"] if str(s["stepId"]) == step_id), step_id)
    return Artifact(
        artifact_id=f"{view['runId']}:{OUTPUT_ARTIFACT}:{step_id}",
        name=f"{OUTPUT_ARTIFACT}:{name}",
        description=f"The output step {name!r} streamed.",
        parts=parts,
    )


def _page(
    found: Found, cursor: Cursor, stops: Callable[[dict[str, Any]], bool]
) -> Page[Event, Cursor]:
    """What one read sends: the output chunks in order, then (unless the output filled the
    read: the rest of it first) the events in status updates, each batch ending at an event
    that settles attempts with output, whose closings follow it."""
    view = found.view
    if view is None:
        raise TaskNotFoundError("the task is no longer found")
    items: list[Event] = []
    position = cursor.position
    for chunk in found.chunks:
        position = chunk["position"]
        items.append(_chunk_update(view, chunk, Cursor(cursor.seq, position, cursor.closing)))
    if len(found.chunks) >= BATCH:
        return Page(items, Cursor(cursor.seq, position, cursor.closing), full=True)
    seq, closing = cursor.seq, False
    batch: list[dict[str, Any]] = []

    def close(event_seq: int) -> None:
        for step_id, attempt_id in found.settled.get(event_seq, []):
            items.append(_closing_update(view, step_id, attempt_id, Cursor(event_seq, position)))

    for event in found.events:
        if event["seq"] <= cursor.seq:  # resumed at its status update: its closings only
            close(event["seq"])
            continue
        batch.append(event)
        if event["seq"] in found.settled or event is found.events[-1]:
            items.extend(
                _status(view, batch, Cursor(event["seq"], position, event["seq"] in found.settled))
            )
            close(event["seq"])
            seq, batch = event["seq"], []
    full = len(found.events) >= BATCH
    done = not full and seq >= view["lastEventSeq"] and stops(view)
    return Page(items, Cursor(seq, position, closing), full=full, done=done)


def _status(view: dict[str, Any], events: list[dict[str, Any]], cursor: Cursor) -> list[Event]:
    """The status update after ``events`` (the result's artifact before a COMPLETED one)."""
    items: list[Event] = []
    if any(e["type"] == "RunCompleted" for e in events) and (
        RunState(view["state"]) is RunState.COMPLETED
    ):
        for artifact in tasks.artifacts_of(view):
            update = TaskArtifactUpdateEvent(
                task_id=str(view["runId"]),
                context_id=tasks.context_id(view),
                artifact=artifact,
                last_chunk=True,
            )
            _meta(update, cursor=str(Cursor(cursor.seq - 1, cursor.position)))
            items.append(update)
    status = tasks.status_update(view, events)
    status.metadata.get_or_create_struct(tasks.META)["cursor"] = str(cursor)
    items.append(status)
    return items


Reader = Callable[[Callable[[Connection], Found]], Any]


async def stream(
    listener: Listener,
    read: Reader,
    view: dict[str, Any],
    project: str | None,
    cursor: Cursor | None,
    stops: Callable[[dict[str, Any]], bool],
) -> AsyncIterator[Event]:
    """The task as ``view`` shows it, then every event and chunk after ``cursor`` (None: the
    events after the task's, the output from its start), until ``stops`` says the task has
    ended (or asks for something new) and everything stored before has been sent."""
    start = Cursor(view["lastEventSeq"]) if cursor is None else cursor
    task = tasks.task_of(view)
    task.metadata.get_or_create_struct(tasks.META)["cursor"] = str(start)
    yield task
    run_id = UUID(view["runId"])

    async def page(at: Cursor, _: int) -> Page[Event, Cursor]:
        return _page(await read(_read(run_id, project, at)), at, stops)

    notified = Notified(listener, (EVENTS_CHANNEL, OUTPUT_CHANNEL), (str(run_id),))
    async for item in follow(notified, page, start, HEARTBEAT_S):
        if item is not None:  # a heartbeat: the SSE response pings on its own
            yield item
