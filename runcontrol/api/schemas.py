"""The JSON Schemas of the event payloads, generated from ``runcontrol.domain.events``.

What an event's ``payload`` holds, per event type, as the outbox stores it and every stream,
history and webhook delivers it: a consumer validates against these (they change only with the
event's ``schemaVersion``).
"""

from __future__ import annotations

from typing import Any

from ..domain.events import payload_schemas
from . import routes
from .auth import RunsReader

router = routes.router("/factory/schemas", "schemas")

_EVENTS: dict[str, Any] = {"eventTypes": payload_schemas()}  # fixed by the code: built once


@router.get("/events")
async def get_event_schemas(caller: RunsReader) -> dict[str, Any]:
    """The JSON Schema of every event type's payload, with its topic and version.

    Scope `factory.runs.read`. `eventTypes` maps each event type (the SSE `event`, the envelope's
    `type`) to its `topic`, `schemaVersion` and `payload` schema (JSON Schema 2020-12).
    """
    return _EVENTS
