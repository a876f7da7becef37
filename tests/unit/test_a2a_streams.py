"""The pages of an A2A task's stream (``runcontrol.a2a.streams``), from reads made up here:
chunks before events, a step's closing right after the status update of the event that settled
its attempt, and a stream resumed at any item's cursor sends every later item once."""

from __future__ import annotations

from typing import Any

import pytest
from a2a.utils.errors import InvalidParamsError
from google.protobuf.json_format import MessageToDict

from runcontrol.a2a.streams import Cursor, Found, _page

RUN = "00000000-0000-0000-0000-000000000001"
STEP = "00000000-0000-0000-0000-0000000000aa"
ATTEMPT = "00000000-0000-0000-0000-0000000000bb"


def view(last_seq: int, state: str = "Running") -> dict[str, Any]:
    return {
        "runId": RUN,
        "state": state,
        "lastEventSeq": last_seq,
        "updatedAt": "2026-12-02T12:00:00+00:00",
        "releaseId": "r",
        "steps": [{"stepId": STEP, "name": "work", "state": "Running"}],
        "pendingApprovals": [],
    }


def chunk(position: int, seq: int) -> dict[str, Any]:
    return {"position": position, "seq": seq, "stepId": STEP, "attemptId": ATTEMPT, "text": "x"}


def event(seq: int, kind: str = "LeaseGranted") -> dict[str, Any]:
    return {"seq": seq, "type": kind, "payload": {}}


def found(events: list[int], chunks: list[int], settled: int | None = None) -> Found:
    """A read: ``events`` by seq (``settled``: the one settling the attempt), chunks by
    position (seq = position)."""
    kinds = {settled: "AttemptOutcomeRecorded"} if settled else {}
    return Found(
        view(max(events, default=0)),
        [event(s, kinds.get(s, "LeaseGranted")) for s in events],
        [chunk(p, p) for p in chunks],
        {settled: [(STEP, ATTEMPT)]} if settled else {},
    )


def items(page: Any) -> list[tuple[str, Any]]:
    """Each item as (kind, what it covers), with its cursor."""
    out = []
    for item in page.items:
        meta = MessageToDict(item.metadata)["runcontrol"]
        if type(item).__name__ == "TaskStatusUpdateEvent":
            out.append(("status", [e["seq"] for e in meta["events"]], meta["cursor"]))
        elif item.artifact.parts:
            out.append(("chunk", meta["seq"], meta["cursor"]))
        else:
            out.append(("closing", item.last_chunk, meta["cursor"]))
    return out


def never(_: dict[str, Any]) -> bool:
    return False


def test_chunks_then_status_then_the_closing_of_the_attempt_the_event_settled() -> None:
    page = _page(found([5, 6, 7], [1, 2], settled=6), Cursor(4), never)
    assert items(page) == [
        ("chunk", 1, "4:1"),
        ("chunk", 2, "4:2"),
        ("status", [5, 6], "6:2:closing"),
        ("closing", True, "6:2"),
        ("status", [7], "7:2"),
    ]
    assert page.cursor == Cursor(7, 2)


def test_resumed_at_a_closing_cursor_the_closing_comes_first_and_no_status_again() -> None:
    # Read after seq 5 (6 is read again: its closing is still due).
    page = _page(found([6, 7], []), Cursor(6, 2, closing=True), never)
    assert items(page) == [("status", [7], "7:2")]  # 6 settles nothing in this read
    page = _page(found([6, 7], [], settled=6), Cursor(6, 2, closing=True), never)
    assert items(page) == [("closing", True, "6:2"), ("status", [7], "7:2")]


def test_a_full_page_of_output_sends_the_output_first_and_keeps_the_event_cursor() -> None:
    from runcontrol.a2a import streams

    positions = list(range(1, streams.BATCH + 1))
    page = _page(found([5], positions), Cursor(4, 0, closing=True), never)
    assert page.full and len(page.items) == streams.BATCH
    assert page.cursor == Cursor(4, streams.BATCH, closing=True)


@pytest.mark.parametrize(
    ("raw", "cursor"),
    [("17", Cursor(17)), ("17:4", Cursor(17, 4)), ("17:4:closing", Cursor(17, 4, True))],
)
def test_a_cursor_reads_back_as_it_was_written(raw: str, cursor: Cursor) -> None:
    assert Cursor.parse(raw) == cursor
    assert Cursor.parse(str(cursor)) == cursor


@pytest.mark.parametrize("raw", ["", "x", "1:2:3", "1:2:open", "-1", "1:-2", str(2**63)])
def test_a_bad_cursor_is_invalid_params(raw: str) -> None:
    with pytest.raises(InvalidParamsError):
        Cursor.parse(raw)
