"""Helpers shared by the store tests: one workflow ("wf", one step), its requester, a run
accepted but not yet committed, and the write path driven by hand (``prepare`` a document, then
commit it through the group commit or send it alone)."""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

from sqlalchemy import Engine, text
from support import SyncGrain, drive

from runcontrol.bootstrap import Container
from runcontrol.commands import SubmitRequest, SubmitResult, SubmitRun
from runcontrol.domain import (
    AttemptOutcome,
    CommandContext,
    LeaseGrant,
    Principal,
    Role,
    RunAggregate,
    StepSpec,
    Submission,
    WorkflowDefinition,
    canonical_hash,
)
from runcontrol.domain.run.leases import renew_lease
from runcontrol.domain.run.outcomes import report_outcome
from runcontrol.domain.run.submission import accept_run
from runcontrol.store import Database
from runcontrol.store.commit import APPLICATION_NAME, PendingCommit, conclude, prepare


def publish(container: Container, tenant: str) -> None:
    container.releases.publish(
        tenant,
        WorkflowDefinition("wf", (StepSpec(name="only", agent_id="agent-a"),)),
        "publisher",
        container.env.clock.now(),
    )


def principal(tenant: str) -> Principal:
    return Principal("alice", tenant, "proj-1", frozenset({Role.REQUESTER}))


def request(key: str) -> SubmitRequest:
    return SubmitRequest("proj-1", key, "wf", "code-agent", {"n": 1}, release_alias="latest")


def accepted(container: Container, tenant: str, key: str) -> RunAggregate:
    """A new run accepted for ``key``, not yet committed."""
    env = container.env
    req = request(key)
    return accept_run(
        Submission(
            run_id=uuid.uuid4(),
            tenant_id=tenant,
            project_id=req.project_id,
            idempotency_key=req.idempotency_key,
            workflow_id=req.workflow_id,
            model_profile_id=req.model_profile_id,
            input_hash=canonical_hash(req.canonical_payload()),
            snapshot_id=uuid.uuid4(),
            requested_by="alice",
            input=req.input,
        ),
        drive(env.releases.resolve(tenant, "wf", alias="latest", release_id=None)),
        drive(env.policies.current(tenant)),
        env.options,
        env.context("alice"),
    )


def runs_for_key(db: Database, tenant: str, key: str) -> list[UUID]:
    with db.tenant(tenant) as conn:
        return list(
            conn.exec_driver_sql(
                "SELECT run_id FROM runs WHERE idempotency_key = %s", (key,)
            ).scalars()
        )


def snapshot(db: Database, tenant: str, run_id: UUID) -> dict[str, Any]:
    """Everything a command on this run could have written, read on another connection."""
    with db.tenant(tenant) as conn:

        def q(sql: str) -> list[tuple[Any, ...]]:
            return [tuple(r) for r in conn.exec_driver_sql(sql, (run_id,))]

        return {
            "run": q(
                "SELECT state, version, event_seq, journal_seq, fencing_seq FROM runs"
                " WHERE run_id = %s"
            ),
            "steps": q("SELECT step_id, state FROM steps WHERE run_id = %s ORDER BY ordinal"),
            "attempts": q("SELECT attempt_id, state FROM attempts WHERE run_id = %s ORDER BY 1"),
            "leases": q(
                "SELECT lease_id, expires_at, released_at FROM leases WHERE run_id = %s ORDER BY 1"
            ),
            "intents": q("SELECT intent_id FROM cancellation_intents WHERE run_id = %s"),
            "outbox": q("SELECT seq, event_type FROM outbox WHERE run_id = %s ORDER BY seq"),
            "journal": q(
                "SELECT sequence, entity, to_state FROM recovery_journal"
                " WHERE run_id = %s ORDER BY sequence"
            ),
            "audits": q("SELECT kind FROM audit_log WHERE run_id = %s ORDER BY id"),
        }


def ctx(container: Container) -> CommandContext:
    return CommandContext(now=container.env.clock.now(), actor="ops")


def assert_completed_once(db: Database, tenant: str, run_id: UUID, before: dict[str, Any]) -> None:
    """The holder's success committed whole, once: run row, outbox and journal together."""
    after = snapshot(db, tenant, run_id)
    state, version, event_seq, journal_seq, _ = after["run"][0]
    assert (state, version) == ("Completed", before["run"][0][1] + 1), after["run"]
    assert after["outbox"][: len(before["outbox"])] == before["outbox"]
    assert [t for _, t in after["outbox"][len(before["outbox"]) :]] == [
        "AttemptOutcomeRecorded",
        "RunStateChanged",
        "RunCompleted",
    ]
    assert [(e, s) for _, e, s in after["journal"][len(before["journal"]) :]] == [
        ("Attempt", "Succeeded"),
        ("Step", "Succeeded"),
        ("Run", "Completed"),
    ]
    assert (event_seq, journal_seq) == (len(after["outbox"]), len(after["journal"]))


def submit(grain: SyncGrain, principal: Principal, request: SubmitRequest) -> SubmitResult:
    """Submit through ``grain`` (its run id is the new run's, if this creates one)."""
    return grain.execute(
        SubmitRun(
            tenant_id=grain.tenant_id, run_id=grain.run_id, principal=principal, request=request
        )
    )


# ---------------------------------------------------------------------- the write path by hand


def load(container: Container, tenant: str, run_id: UUID) -> RunAggregate:
    """The run as an activation caches it: loaded in one read transaction that has ended."""
    agg, _ = drive(container.store.load(tenant, run_id, container.env.clock.now()))
    return agg


def prepared(container: Container, tenant: str, agg: RunAggregate) -> PendingCommit:
    """The document committing what ``agg`` recorded since it was loaded."""
    pending = prepare(tenant, agg, container.env.options)
    assert pending is not None, "the aggregate recorded nothing"
    return pending


async def commit(container: Container, tenant: str, agg: RunAggregate) -> None:
    """Commit what ``agg`` recorded through the process's group commit, as a grain does: the
    documents committed in the same turn of the loop share a statement."""
    pending = prepared(container, tenant, agg)
    conclude(pending, await container.env.commits.commit(pending.doc, pending.key))


def send(container: Container, tenant: str, agg: RunAggregate) -> None:
    """Commit what ``agg`` recorded as a statement of its own (``Store.send``), blocking."""
    pending = prepared(container, tenant, agg)
    (answer,) = drive(container.store.send([pending.doc]))
    conclude(pending, answer)


def sent(container: Container) -> tuple[int, int]:
    """(statements, documents) the container's store has sent so far."""
    return container.store.statements_sent, container.store.documents_sent


def sent_since(container: Container, start: tuple[int, int]) -> tuple[int, int]:
    """(statements, documents) sent since ``sent`` answered ``start``."""
    now = sent(container)
    return now[0] - start[0], now[1] - start[1]


def complete(container: Container, agg: RunAggregate, grant: LeaseGrant) -> RunAggregate:
    """The holder's success decided on ``agg``: attempt, step and run settle, with three events
    and three journal entries."""
    report_outcome(
        agg,
        ctx(container),
        grant.attempt_id,
        grant.holder,
        grant.fencing_token,
        AttemptOutcome.SUCCEEDED,
        container.env.options,
        outcome_hash=canonical_hash({"result": 1}),
    )
    return agg


def renewed(container: Container, agg: RunAggregate, grant: LeaseGrant) -> RunAggregate:
    """A lease renewal decided on ``agg``: it bumps the version and rewrites the lease (the
    clock moves first, so the new ``expires_at`` differs from the stored one)."""
    container.env.clock.advance(1)
    renew_lease(
        agg,
        ctx(container),
        grant.attempt_id,
        grant.holder,
        grant.fencing_token,
        container.env.options,
    )
    return agg


def terminate_store_backends(owner_engine: Engine) -> int:
    """Terminate every backend of the grains' stores; returns once they have exited."""
    with owner_engine.connect() as owner:
        killed = owner.execute(
            text(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 10000))"
                " FROM pg_stat_activity"
                " WHERE application_name = :name AND datname = current_database()"
            ),
            {"name": APPLICATION_NAME},
        ).scalar_one()
        owner.commit()
    return int(killed)
