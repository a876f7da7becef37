"""What the API shows of each table: a row as camelCase JSON, a chosen part or the whole."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from enum import Enum
from typing import Any
from uuid import UUID

from ..tables import approval_requests, outbox

RunKey = tuple[str, UUID]  # (tenant_id, run_id)


def _json(value: Any) -> Any:
    """A column value as the API's JSON has it."""
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, Enum):
        return value.value
    return value


View = tuple[tuple[str, str], ...]  # (JSON key, column)


def api_view(columns: Iterable[str], renamed: Mapping[str, str] | None = None) -> View:
    """The API's camelCase key for each column, unless ``renamed`` names another."""
    renamed = renamed or {}
    return tuple((renamed.get(c) or _camel(c), c) for c in columns)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def render(m: Any, fields: View) -> dict[str, Any]:
    return {key: _json(m[column]) for key, column in fields}


# What the API shows of each table. An approval and an event are shown whole (an event without
# the relay's bookkeeping); a run, step, attempt and lease show a chosen part.
RUN_SUMMARY = api_view(
    (
        "run_id",
        "tenant_id",
        "project_id",
        "environment_id",
        "workflow_id",
        "release_id",
        "release_hash",
        "policy_revision",
        "model_profile_id",
        "snapshot_id",
        "budget_reservation_id",
        "state",
        "input_hash",
        "requested_by",
        "failure_class",
        "failure_reason",
        "outcome_hash",
        "version",
        "event_seq",
        "created_at",
        "updated_at",
        "rerun_of",
        "suspended_at",
        "result_hash",
        "result_bytes",
        "priority",
        "correlation_id",
        "parent_run_id",
        "parent_step_id",
        "depth",
        "template_id",
        "template_version",
        "replay_of",
        "replay",
    ),
    {"event_seq": "lastEventSeq"},
)

LIMITS = api_view(("max_cost_usd", "max_minutes"))

STEP = api_view(
    (
        "step_id",
        "ordinal",
        "name",
        "agent_id",
        "skill_id",
        "state",
        "max_attempts",
        "gate",
        "side_effect_class",
        "not_before",
        "depends_on",
        "kind",
        "wait",
        "due_at",
        "held",
        "condition",
        "child",
    )
)

ATTEMPT = api_view(
    (
        "attempt_id",
        "number",
        "state",
        "outcome",
        "outcome_hash",
        "failure_class",
        "dispatched_at",
        "settled_at",
        "holder",
    )
)

LEASE = api_view(("lease_id", "holder", "fencing_token", "expires_at"))

# A journaled call: what identifies it and its hash and size, never its content.
CALL = api_view(("name", "occurrence", "value_hash", "bytes", "recorded_at", "attempt_id"))
# A run's child runs, as its GET shows them (issue 32).
CHILD = api_view(("run_id", "parent_step_id", "workflow_id", "release_id", "state", "created_at"))

APPROVAL = api_view(approval_requests.c.keys())

EVENT = api_view(
    (c for c in outbox.c.keys() if c not in ("id", "published_at", "journal", "feed_position")),
    {"event_type": "type"},
)
# An event row as its readers select it: without the journal entries it carries (0033).
EVENT_ROW = tuple(c for c in outbox.c if c.name != "journal")
# An event still held: the events' retention (90 d) leaves a row carrying journal entries
# with its payload set to NULL until the journal's (365 d).
EVENT_HELD = outbox.c.payload.is_not(None)


def run_summary(m: Any) -> dict[str, Any]:
    view = render(m, RUN_SUMMARY)
    view["limits"] = render(m, LIMITS)
    view["suspended"] = m["suspended_at"] is not None
    return view


def approval_view(m: Any) -> dict[str, Any]:
    return render(m, APPROVAL)


def event_view(m: Any) -> dict[str, Any]:
    return render(m, EVENT)
