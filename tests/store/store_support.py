"""Submission helpers shared by the store tests: one workflow ("wf", one step), its requester,
and a run accepted but not yet committed."""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

from runcontrol.bootstrap import Container
from runcontrol.commands import SubmitRequest, SubmitResult, SubmitRun
from runcontrol.domain import (
    CommandContext,
    Principal,
    Role,
    RunAggregate,
    StepSpec,
    Submission,
    WorkflowDefinition,
    canonical_hash,
)
from runcontrol.grain import RunGrain
from runcontrol.store import Database


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
    return RunAggregate.accept(
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
        env.releases.resolve(tenant, "wf", alias="latest", release_id=None),
        env.policies.current(tenant),
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


def submit(grain: RunGrain, principal: Principal, request: SubmitRequest) -> SubmitResult:
    """Submit through ``grain`` (its run id is the new run's, if this creates one)."""
    return grain.execute(
        SubmitRun(
            tenant_id=grain.tenant_id, run_id=grain.run_id, principal=principal, request=request
        )
    )
