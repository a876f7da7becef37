"""Invariants 4 and 5 at the database level: partial unique indexes stop a second open attempt
for a step and a second current lease for an attempt even if the code above them is wrong.

The grain makes a real run (one step, attempt 1 Leased with lease token 1); hand-written SQL as
the app role then tries what the domain rules forbid.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy.exc import IntegrityError

UNIQUE_VIOLATION = "23505"

INSERT_ATTEMPT = (
    "INSERT INTO attempts (attempt_id, tenant_id, step_id, run_id, agent_id, number, state,"
    " dispatched_at) SELECT %s, tenant_id, step_id, run_id, agent_id, %s, %s, now()"
    " FROM attempts WHERE attempt_id = %s"
)
INSERT_LEASE = (
    "INSERT INTO leases (lease_id, tenant_id, attempt_id, run_id, holder, fencing_token,"
    " granted_at, expires_at, released_at)"
    " SELECT %s, tenant_id, attempt_id, run_id, 'worker-2', %s, now(), now(), %s"
    " FROM leases WHERE attempt_id = %s"
)


def unique_violation(exc: pytest.ExceptionInfo[IntegrityError], index: str) -> None:
    assert getattr(exc.value.orig, "sqlstate", None) == UNIQUE_VIOLATION
    assert index in str(exc.value)


@pytest.mark.parametrize("state", ["Dispatched", "Leased"])
def test_second_open_attempt_for_a_step_is_rejected(db, tenant, make_leased_run, state):
    run = make_leased_run(tenant)
    with pytest.raises(IntegrityError) as exc, db.tenant(tenant) as conn:
        conn.exec_driver_sql(INSERT_ATTEMPT, (uuid.uuid4(), 2, state, run.attempt_id))
    unique_violation(exc, "uq_attempts_open_per_step")


def test_settled_attempts_do_not_count_as_open(db, tenant, make_leased_run):
    run = make_leased_run(tenant)
    with db.tenant(tenant) as conn:
        for number, state in ((2, "Failed"), (3, "TimedOut"), (4, "Uncertain")):
            conn.exec_driver_sql(INSERT_ATTEMPT, (uuid.uuid4(), number, state, run.attempt_id))
        open_count = conn.exec_driver_sql(
            "SELECT count(*) FROM attempts WHERE run_id = %s AND state IN ('Dispatched', 'Leased')",
            (run.run_id,),
        ).scalar_one()
    assert open_count == 1


def test_second_current_lease_for_an_attempt_is_rejected(db, tenant, make_leased_run):
    run = make_leased_run(tenant)
    with pytest.raises(IntegrityError) as exc, db.tenant(tenant) as conn:
        conn.exec_driver_sql(INSERT_LEASE, (uuid.uuid4(), 2, None, run.attempt_id))
    unique_violation(exc, "uq_leases_current_per_attempt")
    # A released (historical) lease beside the current one is fine.
    with db.tenant(tenant) as conn:
        conn.exec_driver_sql(INSERT_LEASE, (uuid.uuid4(), 2, run.grant.expires_at, run.attempt_id))


def test_fencing_token_cannot_be_reused_within_a_run(db, tenant, make_leased_run):
    run = make_leased_run(tenant)
    token = run.grant.fencing_token
    with pytest.raises(IntegrityError) as exc, db.tenant(tenant) as conn:
        conn.exec_driver_sql(
            INSERT_LEASE, (uuid.uuid4(), token, run.grant.expires_at, run.attempt_id)
        )
    unique_violation(exc, "uq_leases_token")


def test_outbox_sequence_cannot_repeat_within_a_run(db, tenant, make_leased_run):
    run = make_leased_run(tenant)
    with pytest.raises(IntegrityError) as exc, db.tenant(tenant) as conn:
        conn.exec_driver_sql(
            "INSERT INTO outbox (event_id, tenant_id, project_id, run_id, seq, topic, event_type,"
            " producer, schema_version, payload, occurred_at)"
            " SELECT %s, tenant_id, project_id, run_id, seq, topic, event_type, producer,"
            " schema_version, payload, occurred_at FROM outbox WHERE run_id = %s AND seq = 1",
            (uuid.uuid4(), run.run_id),
        )
    unique_violation(exc, "uq_outbox_run_seq")
