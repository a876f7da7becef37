"""Invariant 3: a transition, its outbox record(s) and its recovery-journal entries commit
together or not at all.

A fault is injected inside the database (the ``faults`` fixture's triggers) at each checkpoint
of the statement that writes a command ("after-run": the run row is written; "before-outbox":
child rows are written; "after-events": outbox rows are written). Whatever the point, nothing
of the command is visible afterwards; without the fault, all of it is.
"""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

import psycopg
import pytest
from store_support import load, send
from support import CHECKPOINTS, Faults, SyncGrain, report_command

from runcontrol.commands import SubmitRequest, SubmitRun
from runcontrol.domain import (
    AttemptOutcome,
    CommandContext,
    Principal,
    Role,
    StepSpec,
    WorkflowDefinition,
    canonical_hash,
)
from runcontrol.domain.run.cancellation import cancel
from runcontrol.grain import RunGrain
from runcontrol.store import Database


def injected(checkpoint: str) -> Any:
    """The error a command fails with when the fault at ``checkpoint`` fires: the database's
    error, raised by ``conclude`` as the psycopg class of its SQLSTATE."""
    return pytest.raises(psycopg.DatabaseError, match=Faults.message(checkpoint))


def snapshot(db: Database, tenant: str, run_id: UUID) -> dict[str, Any]:
    """Everything a command on this run could have written, as the tenant sees it."""
    with db.tenant(tenant) as conn:

        def q(sql: str) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in conn.exec_driver_sql(sql, (run_id,))]

        return {
            "run": q("SELECT state, version, event_seq, journal_seq FROM runs WHERE run_id = %s"),
            "steps": q("SELECT step_id, state FROM steps WHERE run_id = %s ORDER BY ordinal"),
            "attempts": q("SELECT attempt_id, state FROM attempts WHERE run_id = %s ORDER BY 1"),
            "leases": q("SELECT lease_id, released_at FROM leases WHERE run_id = %s ORDER BY 1"),
            "intents": q("SELECT intent_id FROM cancellation_intents WHERE run_id = %s"),
            "outbox": q("SELECT seq, event_type FROM outbox WHERE run_id = %s ORDER BY seq"),
            "journal": q(
                "SELECT sequence, entity, to_state FROM recovery_journal"
                " WHERE run_id = %s ORDER BY sequence"
            ),
        }


@pytest.mark.parametrize("checkpoint", CHECKPOINTS)
def test_fault_in_grain_command_leaves_no_trace_and_its_resend_commits_all(
    container, tenant, make_leased_run, faults, checkpoint
):
    """The command that met the fault is sent again (same ``command_id``) once the fault is
    gone: nothing of it had committed, so the resend decides and commits it, whole."""
    run = make_leased_run(tenant)
    before = snapshot(container.db, tenant, run.run_id)
    assert before["run"][0][0] == "Running"
    command = report_command(
        run.grain, run.grant, AttemptOutcome.SUCCEEDED, outcome_hash=canonical_hash({"result": 1})
    )

    def report() -> None:
        run.grain.execute(command)

    faults.arm(run.run_id, checkpoint)
    with injected(checkpoint):
        report()
    assert snapshot(container.db, tenant, run.run_id) == before

    faults.disarm(run.run_id)
    report()
    after = snapshot(container.db, tenant, run.run_id)
    state, version, event_seq, journal_seq = after["run"][0]
    assert state == "Completed"
    assert version == before["run"][0][1] + 1
    new_events = after["outbox"][len(before["outbox"]) :]
    new_journal = after["journal"][len(before["journal"]) :]
    assert after["outbox"][: len(before["outbox"])] == before["outbox"]
    assert [t for _, t in new_events] == [
        "AttemptOutcomeRecorded",
        "RunStateChanged",
        "RunCompleted",
    ]
    assert [(e, s) for _, e, s in new_journal] == [
        ("Attempt", "Succeeded"),
        ("Step", "Succeeded"),
        ("Run", "Completed"),
    ]
    # The counters on the run row moved with the rows they count, in the same transaction.
    assert event_seq == after["outbox"][-1][0] == len(after["outbox"])
    assert journal_seq == after["journal"][-1][0] == len(after["journal"])
    assert all(released is not None for _, released in after["leases"])
    report()  # sent once more after it committed: answered, never applied twice
    assert snapshot(container.db, tenant, run.run_id) == after


@pytest.mark.parametrize("checkpoint", CHECKPOINTS)
def test_fault_during_submission_leaves_no_run(container, tenant, faults, checkpoint):
    env = container.env
    container.releases.publish(
        tenant, WorkflowDefinition("wf", (StepSpec("s", "agent-a"),)), "p", env.clock.now()
    )
    grain = SyncGrain(RunGrain(env, tenant, uuid.uuid4()))
    faults.arm(grain.run_id, checkpoint)  # the grain submits its own run id
    principal = Principal("alice", tenant, "proj-1", frozenset({Role.REQUESTER}))
    request = SubmitRequest("proj-1", "k1", "wf", "code-agent", {"n": 1}, release_alias="latest")
    with injected(checkpoint):
        grain.execute(
            SubmitRun(
                tenant_id=grain.tenant_id, run_id=grain.run_id, principal=principal, request=request
            )
        )
    with container.db.tenant(tenant) as conn:
        for table in ("runs", "steps", "outbox", "recovery_journal"):
            count = conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one()
            assert count == 0, table
    faults.disarm(grain.run_id)
    result = grain.execute(
        SubmitRun(
            tenant_id=grain.tenant_id, run_id=grain.run_id, principal=principal, request=request
        )
    )
    assert result.created and result.run_id == grain.run_id
    snap = snapshot(container.db, tenant, result.run_id)
    assert snap["outbox"][0] == (1, "RunAccepted")
    assert snap["journal"][0] == (1, "Run", "Accepted")


@pytest.mark.parametrize("checkpoint", ("before-outbox", "after-events"))
def test_fault_in_a_prepared_document_rolls_back_row_changes_outbox_and_journal(
    container, tenant, make_leased_run, faults, checkpoint
):
    """The same through the write path by hand (``prepare``, ``Store.send``, ``conclude``): a
    cancellation (intent row, run row, outbox, journal) commits whole or not at all."""
    db = container.db
    run = make_leased_run(tenant)
    before = snapshot(db, tenant, run.run_id)
    ctx = CommandContext(now=container.env.clock.now(), actor="ops")

    faults.arm(run.run_id, checkpoint)
    agg = load(container, tenant, run.run_id)
    assert cancel(agg, ctx, "ops", "stop")
    with injected(checkpoint):
        send(container, tenant, agg)
    assert snapshot(db, tenant, run.run_id) == before

    faults.disarm(run.run_id)
    agg = load(container, tenant, run.run_id)
    cancel(agg, ctx, "ops", "stop")
    send(container, tenant, agg)
    after = snapshot(db, tenant, run.run_id)
    assert after["run"][0][:2] == ("Cancelling", before["run"][0][1] + 1)
    assert len(after["intents"]) == 1
    assert [t for _, t in after["outbox"][len(before["outbox"]) :]] == [
        "CancellationRequested",
        "RunStateChanged",
    ]
    assert after["journal"][-1][1:] == ("Run", "Cancelling")
