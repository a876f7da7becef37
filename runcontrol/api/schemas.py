"""The JSON Schemas of the event payloads, generated from ``runcontrol.domain.events``.

What an event's ``payload`` holds, per event type, as the outbox stores it and every stream,
history and webhook delivers it: a consumer validates against these (they change only with the
event's ``schemaVersion``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from ..domain.events import payload_schemas
from .auth import RunsReader
from .problems import responses

router = APIRouter(prefix="/factory/schemas", tags=["schemas"])

_EVENTS: dict[str, Any] = {"eventTypes": payload_schemas()}  # fixed by the code: built once


@router.get(
    "/events",
    operation_id="GetEventSchemas",
    responses=responses(401, 403),
    summary="The JSON Schema of every event type's payload, with its topic and version.",
    description="Scope `factory.runs.read`. `eventTypes` maps each event type (the SSE "
    "`event`, the envelope's `type`) to its `topic`, `schemaVersion` and `payload` schema "
    "(JSON Schema 2020-12).",
)
async def event_schemas(caller: RunsReader) -> dict[str, Any]:
    return _EVENTS
