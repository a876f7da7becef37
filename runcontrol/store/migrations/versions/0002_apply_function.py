"""One server-side statement per transition: ``runcontrol_apply(doc jsonb)``.

The grain's write path was up to a dozen statements per command (the run row, each child row,
outbox, journal, notifications), each costing psycopg's per-statement Python work. The function
takes the whole change as one JSON document and writes it in one statement, so a command is one
execute whatever it touched (measured: docs/benchmarks.md). It runs as the caller (SECURITY
INVOKER), so row-level security, the grants and the append-only triggers apply unchanged.

The version guard comes first: a lost race fails before any child row is written, with
SQLSTATE ``RC409``; an idempotency key already used fails with ``RC001``. ``doc->>'fault'``
names a checkpoint at which to fail (``RC999``), for the atomicity tests to prove that writes
already made inside the statement roll back with it.

Revision ID: 0002
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

APP_ROLE = "runcontrol_app"

RUN_COLUMNS = (
    "tenant_id, project_id, environment_id, idempotency_key, workflow_id, release_id, "
    "release_hash, policy_id, policy_revision, model_profile_id, state, input_hash, snapshot_id, "
    "budget_reservation_id, requested_by, max_cost_usd, max_minutes, deadline_at, failure_class, "
    "failure_reason, outcome_hash, correlation_id, input, version, event_seq, journal_seq, "
    "fencing_seq, next_due_at, created_at, updated_at"
)
# Child tables written by a transition: (table, document key, primary key or None to insert).
CHILDREN = (
    (
        "steps",
        "steps",
        "step_id",
        "step_id, tenant_id, run_id, ordinal, name, agent_id, skill_id, state, max_attempts, "
        "gate, side_effect_class, not_before, failure_class, outcome_hash",
    ),
    (
        "attempts",
        "attempts",
        "attempt_id",
        "attempt_id, tenant_id, step_id, run_id, agent_id, number, state, lease_id, "
        "fencing_token, holder, outcome, outcome_hash, failure_class, dispatched_at, settled_at, "
        "settled_by",
    ),
    (
        "leases",
        "leases",
        "lease_id",
        "lease_id, tenant_id, attempt_id, run_id, holder, fencing_token, granted_at, expires_at, "
        "released_at, release_cause",
    ),
    (
        "approval_requests",
        "approvals",
        "approval_id",
        "approval_id, tenant_id, run_id, step_id, attempt_id, action_class, proposal_hash, "
        "policy_revision, approver_rule, required_approvals, requested_by, created_at, "
        "expires_at, state, decided_by, decided_at, reason, version",
    ),
    (
        "approval_decisions",
        "decisions",
        None,
        "approval_id, decided_by, tenant_id, run_id, decision, proposal_hash, reason, "
        "break_glass, decided_at",
    ),
    (
        "cancellation_intents",
        "intents",
        None,
        "intent_id, tenant_id, run_id, requested_by, reason, requested_at",
    ),
)
TRAIL = (
    (
        "outbox",
        "outbox",
        "event_id, tenant_id, project_id, run_id, seq, topic, event_type, step_id, attempt_id, "
        "correlation_id, causation_id, producer, schema_version, payload, occurred_at, "
        "published_at",
    ),
    (
        "recovery_journal",
        "journal",
        "tenant_id, run_id, sequence, entity, entity_id, from_state, to_state, cause, actor, "
        "occurred_at",
    ),
    ("audit_log", "audits", "tenant_id, run_id, kind, actor, detail, occurred_at"),
)


def _names(columns: str) -> list[str]:
    return [c.strip() for c in columns.split(",")]


def _insert(table: str, key: str, columns: str, conflict: str = "") -> str:
    return f"""
    IF doc ? '{key}' THEN
        INSERT INTO {table} ({columns})
            SELECT {columns} FROM jsonb_populate_recordset(NULL::{table}, doc->'{key}'){conflict};
    END IF;"""


def _upsert(table: str, key: str, pk: str, columns: str) -> str:
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in _names(columns) if c != pk)
    return _insert(table, key, columns, f"\n            ON CONFLICT ({pk}) DO UPDATE SET {updates}")


def _fault(name: str) -> str:
    return f"""
    IF doc->>'fault' = '{name}' THEN
        RAISE EXCEPTION 'injected fault at {name}' USING ERRCODE = 'RC999';
    END IF;"""


def function_sql() -> str:
    run_set = ", ".join(f"{c} = r.{c}" for c in _names(RUN_COLUMNS))
    children = "".join(
        _upsert(t, k, pk, cols) if pk else _insert(t, k, cols) for t, k, pk, cols in CHILDREN
    )
    outbox, journal, audits = (_insert(t, k, cols) for t, k, cols in TRAIL)
    return f"""
CREATE FUNCTION runcontrol_apply(doc jsonb) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM set_config('runcontrol.tenant_id', doc->>'tenant', true);
    IF doc->>'mode' = 'insert' THEN
        INSERT INTO runs (run_id, {RUN_COLUMNS})
            SELECT run_id, {RUN_COLUMNS} FROM jsonb_populate_record(NULL::runs, doc->'run')
            ON CONFLICT (tenant_id, project_id, idempotency_key) DO NOTHING;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the idempotency key already names a run' USING ERRCODE = 'RC001';
        END IF;
    ELSIF doc->>'mode' = 'update' THEN
        UPDATE runs SET {run_set}
            FROM jsonb_populate_record(NULL::runs, doc->'run') r
            WHERE runs.run_id = r.run_id AND runs.version = (doc->>'expected_version')::bigint;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the run changed since it was loaded' USING ERRCODE = 'RC409';
        END IF;
    END IF;{_fault("after-run")}{children}{_fault("before-outbox")}{outbox}
    {_fault("before-journal")}{journal}{audits}
    IF doc ? 'notify_agents' THEN
        PERFORM pg_notify('runcontrol_dispatch', a)
            FROM jsonb_array_elements_text(doc->'notify_agents') a;
    END IF;
    IF doc ? 'notify_run' THEN
        PERFORM pg_notify('runcontrol_events', doc->>'notify_run');
    END IF;
END $fn$"""


def upgrade() -> None:
    op.execute(function_sql())
    op.execute("REVOKE ALL ON FUNCTION runcontrol_apply(jsonb) FROM PUBLIC")
    op.execute(f"GRANT EXECUTE ON FUNCTION runcontrol_apply(jsonb) TO {APP_ROLE}")


def downgrade() -> None:
    op.execute("DROP FUNCTION runcontrol_apply(jsonb)")
