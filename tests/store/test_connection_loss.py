"""A database connection lost under a command surfaces as a retryable ``Unavailable`` (it is
unknown whether the command committed), the broken connection is discarded, and the command
sent again (same ``command_id``) commits exactly once.

The connections are lost behind the store's back: the schema owner terminates every backend
of the grains' store (``application_name = APPLICATION_NAME``). A lone command is sent as a
statement of its own (``runcontrol_apply``); a group's case is in ``test_group_commit``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, select
from store_support import terminate_store_backends
from support import drive, report_command

from runcontrol.bootstrap import Container
from runcontrol.commands import Command
from runcontrol.domain import AttemptOutcome, errors
from runcontrol.store.tables import outbox


def until_answered(execute: Callable[[], Any], pool_size: int) -> list[str]:
    """Call until it answers: each ``Unavailable`` has discarded a dead pooled
    connection, so at most ``pool_size`` of them come first."""
    outcomes: list[str] = []
    while "ok" not in outcomes:
        assert len(outcomes) <= pool_size, outcomes
        try:
            execute()
            outcomes.append("ok")
        except errors.Unavailable as exc:
            assert exc.retryable
            outcomes.append("unavailable")
    return outcomes


def test_a_lost_connection_is_unavailable_and_the_resend_commits_once(
    container: Container,
    owner_engine: Engine,
    tenant: str,
    make_leased_run: Callable[..., Any],
) -> None:
    run = make_leased_run(tenant)
    assert run.grant is not None
    drive(container.store.rows(tenant, "SELECT 1"))  # the pool holds at least one connection
    assert terminate_store_backends(owner_engine) >= 1
    command: Command[Any] = report_command(run.grain, run.grant, AttemptOutcome.SUCCEEDED)

    outcomes = until_answered(lambda: run.grain.execute(command), container.settings.pool_size)

    assert outcomes[0] == "unavailable"
    again = run.grain.execute(command)  # sent once more after it committed: its stored answer
    assert (again.attempt_id, str(again.state)) == (run.attempt_id, "Succeeded")
    with container.db.tenant(tenant) as conn:
        recorded = conn.execute(
            select(outbox.c.seq).where(
                outbox.c.run_id == run.run_id, outbox.c.event_type == "AttemptOutcomeRecorded"
            )
        ).all()
    assert len(recorded) == 1


def test_a_load_that_meets_a_lost_connection_is_read_again_on_a_live_one(
    container: Container, owner_engine: Engine, tenant: str, make_leased_run: Callable[..., Any]
) -> None:
    """A cold activation's read meets the dead connections (every pooled one was terminated):
    reads are idempotent, so the store has the pool discard the broken ones and reads again,
    once; the caller gets the run, not ``Unavailable``."""
    run = make_leased_run(tenant)
    assert terminate_store_backends(owner_engine) >= 1
    store, now = container.store, container.env.clock.now()
    reads = store.reads

    agg, _ = drive(store.load(tenant, run.run_id, now))

    assert agg.run.run_id == run.run_id
    assert store.reads == reads + 2  # the one that met the loss, and the one that answered
