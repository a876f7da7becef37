"""Read models and sweeps: the queries that are not one grain's command, by what they read.

Tenant-scoped reads run on ``Database.tenant()`` connections (row-level security applies).
Each takes ``project_id``: the one project the caller may see (``domain.access.project_scope``),
or None for the whole tenant; a run of another project reads exactly like an unknown one.
Sweeps run on the system path (``Database.system_tx()``), the only all-tenant reader.

``views`` (what the API shows of each table), ``runs``, ``approvals``, ``events`` (the outbox),
``attempts`` (the work waiting for workers), ``sweeps`` (and gauges), ``flow`` (concurrency
keys); callers use the names below (``queries.get_run``).
"""

from .approvals import approval_run, get_approval, list_approvals
from .attempts import claimable, claimed, leasable, stalled_attempts
from .events import (
    UNPUBLISHED_SQL,
    RelayState,
    Take,
    advance,
    attempts_in_events,
    events_after,
    take_published,
    unpublished_backlog,
)
from .flow import flow_backlog, flow_queues
from .runs import (
    RunContext,
    count_runs,
    decode_cursor,
    encode_cursor,
    get_run,
    list_runs,
    run_input,
    run_result,
    run_visible,
)
from .sweeps import (
    active_run_counts,
    due_runs,
    expired_approvals,
    expired_leases,
    held_steps,
    next_due_after,
    pending_approvals_by_tenant,
    runs_with_open_leases,
)
from .views import (
    APPROVAL,
    ATTEMPT,
    EVENT,
    LEASE,
    LIMITS,
    RUN_SUMMARY,
    STEP,
    RunKey,
    approval_view,
    event_view,
    run_summary,
)

__all__ = [
    "APPROVAL",
    "ATTEMPT",
    "EVENT",
    "LEASE",
    "LIMITS",
    "RUN_SUMMARY",
    "STEP",
    "RunKey",
    "active_run_counts",
    "attempts_in_events",
    "approval_run",
    "approval_view",
    "claimable",
    "claimed",
    "decode_cursor",
    "due_runs",
    "encode_cursor",
    "event_view",
    "events_after",
    "expired_approvals",
    "expired_leases",
    "flow_backlog",
    "flow_queues",
    "get_approval",
    "get_run",
    "held_steps",
    "leasable",
    "list_approvals",
    "RunContext",
    "count_runs",
    "list_runs",
    "next_due_after",
    "pending_approvals_by_tenant",
    "run_input",
    "run_result",
    "run_summary",
    "run_visible",
    "runs_with_open_leases",
    "stalled_attempts",
    "UNPUBLISHED_SQL",
    "RelayState",
    "Take",
    "advance",
    "take_published",
    "unpublished_backlog",
]
