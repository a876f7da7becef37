"""Rows written for a run's entities (``runcontrol.store.rows``): every enum is stored by its
value, the enums a ``str`` field carries too (a journal entry's states), and only the columns
whose field may hold one are checked (issue 33)."""

from __future__ import annotations

from enum import Enum
from typing import Any

from domain_harness import Harness

from runcontrol.domain import RunState
from runcontrol.domain.events import EventBody
from runcontrol.store import rows

STEPS = [{"name": f"s{i}", "agentId": f"a{i}"} for i in range(3)]


def _written(h: Harness) -> list[Any]:
    entities: list[Any] = [h.agg.run]
    for batch in h.batches:
        entities += [*batch.steps.values(), *batch.attempts.values(), *batch.leases.values()]
        entities += [*batch.events, *batch.journal, *batch.audits]
    return entities


def test_no_enum_reaches_a_row_and_each_is_stored_by_its_value() -> None:
    h = Harness(STEPS)
    _, grant = h.start(0)
    h.report(grant)
    written = _written(h)
    assert {type(e) for e in written} >= {type(h.agg.run), type(h.journal[0])}
    for entity in written:
        row = rows.to_row(entity)
        assert not [c for c, v in row.items() if isinstance(v, Enum)], type(entity).__name__
        for column, value in zip(row, rows.MAPPERS[type(entity)]._get(entity), strict=True):
            assert row[column] == (value.value if isinstance(value, Enum) else value)
    moved = next(j for j in h.journal if j.entity == "Run")
    assert isinstance(moved.to_state, RunState)  # a str field holding an enum
    assert type(rows.to_row(moved)["to_state"]) is str


def test_the_compiled_rows_and_payloads_are_the_reference_ones() -> None:
    """Rows, an event row's journal entries and events' payloads are made by functions compiled
    per type (issue 42): each gives what the reference mapping gives, key for key, in order."""
    h = Harness(STEPS)
    _, grant = h.start(0)
    h.report(grant)
    bodies = [e.body for batch in h.batches for e in batch.events]
    assert len({type(b) for b in bodies}) >= 5
    for body in bodies:
        payload = body.to_payload()
        assert list(payload.items()) == list(EventBody.to_payload(body).items())
    for entity in _written(h):
        row = rows.to_row(entity)
        mapper = rows.MAPPERS[type(entity)]
        reference = {
            c: v.value if isinstance(v, Enum) else v
            for c, v in zip(mapper._columns, mapper._get(entity), strict=True)
        }
        assert list(row.items()) == list(reference.items())
    stored = [rows.to_row(j) for j in h.journal]
    carried = rows.journal_entries(h.journal)
    assert carried == [
        {c: v for c, v in r.items() if c not in ("tenant_id", "run_id")} for r in stored
    ]
