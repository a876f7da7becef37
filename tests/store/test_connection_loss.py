"""A database connection lost under a command surfaces as a retryable ``Unavailable`` (it is
unknown whether the command committed), the broken connection is discarded, and the retried
command, being idempotent or fenced, succeeds exactly once."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, select, text

from runcontrol.commands import ReportOutcome
from runcontrol.domain import AttemptOutcome, errors
from runcontrol.store import Database
from runcontrol.store.tables import outbox


def test_a_lost_connection_is_unavailable_and_the_retry_succeeds_once(
    db: Database,
    owner_engine: Engine,
    tenant: str,
    make_leased_run: Callable[..., Any],
) -> None:
    run = make_leased_run(tenant)
    assert run.grant is not None
    with db.app.connect() as conn:  # make sure the pool holds at least one connection
        conn.exec_driver_sql("SELECT 1")
    # Kill every app-role backend of this database behind the pool's back.
    with owner_engine.connect() as owner:
        owner.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE usename = 'runcontrol_app' AND datname = current_database()"
            )
        )
        owner.commit()

    def report() -> None:
        run.grain.execute(
            ReportOutcome(
                tenant_id=run.grain.tenant_id,
                run_id=run.grain.run_id,
                attempt_id=run.attempt_id,
                holder="worker-1",
                fencing_token=run.grant.fencing_token,
                outcome=AttemptOutcome.SUCCEEDED,
            )
        )

    outcomes = []
    while "ok" not in outcomes:  # each failure discards one dead pooled connection
        assert len(outcomes) <= 2 * db.app.pool.size(), outcomes
        try:
            report()
            outcomes.append("ok")
        except errors.Unavailable as exc:
            assert exc.retryable
            outcomes.append("unavailable")
    assert outcomes[0] == "unavailable"
    report()  # the retried report after success is a no-op
    with db.tenant(tenant) as conn:
        recorded = conn.execute(
            select(outbox.c.seq).where(
                outbox.c.run_id == run.run_id, outbox.c.event_type == "AttemptOutcomeRecorded"
            )
        ).all()
    assert len(recorded) == 1
