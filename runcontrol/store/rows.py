"""Mapping between table rows and domain objects (the only place that knows both)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Row

from ..domain import (
    ApprovalDecision,
    ApprovalRequest,
    ApprovalState,
    Attempt,
    AttemptOutcome,
    AttemptState,
    AuditRecord,
    CancellationIntent,
    Decision,
    Event,
    FailureClass,
    Lease,
    Limits,
    PolicyRef,
    RecoveryJournalEntry,
    ReleaseRef,
    Run,
    RunState,
    SideEffectClass,
    Step,
    StepState,
)


def _opt(enum: Any, value: Any) -> Any:
    return None if value is None else enum(value)


def _str(value: Any) -> Any:
    return None if value is None else str(value)


def run_to_row(run: Run) -> dict[str, Any]:
    return {
        "run_id": run.run_id,
        "tenant_id": run.tenant_id,
        "project_id": run.project_id,
        "environment_id": run.environment_id,
        "idempotency_key": run.idempotency_key,
        "workflow_id": run.workflow_id,
        "release_id": run.release.release_id,
        "release_hash": run.release.hash,
        "policy_id": run.policy.policy_id,
        "policy_revision": run.policy.revision,
        "model_profile_id": run.model_profile_id,
        "state": str(run.state),
        "input_hash": run.input_hash,
        "snapshot_id": run.snapshot_id,
        "budget_reservation_id": run.budget_reservation_id,
        "requested_by": run.requested_by,
        "max_cost_usd": run.limits.max_cost_usd,
        "max_minutes": run.limits.max_minutes,
        "deadline_at": run.deadline_at,
        "failure_class": _str(run.failure_class),
        "failure_reason": run.failure_reason,
        "outcome_hash": run.outcome_hash,
        "correlation_id": run.correlation_id,
        "input": run.input,
        "version": run.version,
        "event_seq": run.event_seq,
        "journal_seq": run.journal_seq,
        "fencing_seq": run.fencing_seq,
        "created_at": run.created_at,
        "updated_at": run.updated_at,
    }


def row_to_run(row: Row[Any]) -> Run:
    m = row._mapping
    return Run(
        run_id=m["run_id"],
        tenant_id=m["tenant_id"],
        project_id=m["project_id"],
        environment_id=m["environment_id"],
        idempotency_key=m["idempotency_key"],
        workflow_id=m["workflow_id"],
        release=ReleaseRef(m["release_id"], m["release_hash"]),
        policy=PolicyRef(m["policy_id"], m["policy_revision"]),
        model_profile_id=m["model_profile_id"],
        state=RunState(m["state"]),
        input_hash=m["input_hash"],
        snapshot_id=m["snapshot_id"],
        budget_reservation_id=m["budget_reservation_id"],
        requested_by=m["requested_by"],
        limits=Limits(
            float(m["max_cost_usd"]) if m["max_cost_usd"] is not None else None,
            m["max_minutes"],
        ),
        deadline_at=m["deadline_at"],
        failure_class=_opt(FailureClass, m["failure_class"]),
        failure_reason=m["failure_reason"],
        outcome_hash=m["outcome_hash"],
        correlation_id=m["correlation_id"],
        input=m["input"],
        version=m["version"],
        event_seq=m["event_seq"],
        journal_seq=m["journal_seq"],
        fencing_seq=m["fencing_seq"],
        created_at=m["created_at"],
        updated_at=m["updated_at"],
    )


def step_to_row(step: Step) -> dict[str, Any]:
    return {
        "step_id": step.step_id,
        "tenant_id": step.tenant_id,
        "run_id": step.run_id,
        "ordinal": step.ordinal,
        "name": step.name,
        "agent_id": step.agent_id,
        "skill_id": step.skill_id,
        "state": str(step.state),
        "max_attempts": step.max_attempts,
        "gate": step.gate,
        "side_effect_class": str(step.side_effect_class),
        "not_before": step.not_before,
        "failure_class": _str(step.failure_class),
        "outcome_hash": step.outcome_hash,
    }


def row_to_step(row: Row[Any]) -> Step:
    m = row._mapping
    return Step(
        step_id=m["step_id"],
        run_id=m["run_id"],
        tenant_id=m["tenant_id"],
        ordinal=m["ordinal"],
        name=m["name"],
        agent_id=m["agent_id"],
        skill_id=m["skill_id"],
        state=StepState(m["state"]),
        max_attempts=m["max_attempts"],
        gate=m["gate"],
        side_effect_class=SideEffectClass(m["side_effect_class"]),
        not_before=m["not_before"],
        failure_class=_opt(FailureClass, m["failure_class"]),
        outcome_hash=m["outcome_hash"],
    )


def attempt_to_row(attempt: Attempt, agent_id: str) -> dict[str, Any]:
    return {
        "attempt_id": attempt.attempt_id,
        "tenant_id": attempt.tenant_id,
        "step_id": attempt.step_id,
        "run_id": attempt.run_id,
        "agent_id": agent_id,
        "number": attempt.number,
        "state": str(attempt.state),
        "lease_id": attempt.lease_id,
        "fencing_token": attempt.fencing_token,
        "holder": attempt.holder,
        "outcome": _str(attempt.outcome),
        "outcome_hash": attempt.outcome_hash,
        "failure_class": _str(attempt.failure_class),
        "dispatched_at": attempt.dispatched_at,
        "settled_at": attempt.settled_at,
        "settled_by": attempt.settled_by,
    }


def row_to_attempt(row: Row[Any]) -> Attempt:
    m = row._mapping
    return Attempt(
        attempt_id=m["attempt_id"],
        step_id=m["step_id"],
        run_id=m["run_id"],
        tenant_id=m["tenant_id"],
        number=m["number"],
        state=AttemptState(m["state"]),
        dispatched_at=m["dispatched_at"],
        lease_id=m["lease_id"],
        fencing_token=m["fencing_token"],
        holder=m["holder"],
        outcome=_opt(AttemptOutcome, m["outcome"]),
        outcome_hash=m["outcome_hash"],
        failure_class=_opt(FailureClass, m["failure_class"]),
        settled_at=m["settled_at"],
        settled_by=m["settled_by"],
    )


def lease_to_row(lease: Lease) -> dict[str, Any]:
    return {
        "lease_id": lease.lease_id,
        "tenant_id": lease.tenant_id,
        "attempt_id": lease.attempt_id,
        "run_id": lease.run_id,
        "holder": lease.holder,
        "fencing_token": lease.fencing_token,
        "granted_at": lease.granted_at,
        "expires_at": lease.expires_at,
        "released_at": lease.released_at,
        "release_cause": lease.release_cause,
    }


def row_to_lease(row: Row[Any]) -> Lease:
    m = row._mapping
    return Lease(
        lease_id=m["lease_id"],
        attempt_id=m["attempt_id"],
        run_id=m["run_id"],
        tenant_id=m["tenant_id"],
        holder=m["holder"],
        fencing_token=m["fencing_token"],
        granted_at=m["granted_at"],
        expires_at=m["expires_at"],
        released_at=m["released_at"],
        release_cause=m["release_cause"],
    )


def approval_to_row(a: ApprovalRequest) -> dict[str, Any]:
    return {
        "approval_id": a.approval_id,
        "tenant_id": a.tenant_id,
        "run_id": a.run_id,
        "step_id": a.step_id,
        "attempt_id": a.attempt_id,
        "action_class": str(a.action_class),
        "proposal_hash": a.proposal_hash,
        "policy_revision": a.policy_revision,
        "approver_rule": a.approver_rule,
        "required_approvals": a.required_approvals,
        "requested_by": a.requested_by,
        "created_at": a.created_at,
        "expires_at": a.expires_at,
        "state": str(a.state),
        "decided_by": a.decided_by,
        "decided_at": a.decided_at,
        "reason": a.reason,
        "version": a.version,
    }


def row_to_approval(row: Row[Any]) -> ApprovalRequest:
    m = row._mapping
    return ApprovalRequest(
        approval_id=m["approval_id"],
        run_id=m["run_id"],
        step_id=m["step_id"],
        attempt_id=m["attempt_id"],
        tenant_id=m["tenant_id"],
        action_class=SideEffectClass(m["action_class"]),
        proposal_hash=m["proposal_hash"],
        policy_revision=m["policy_revision"],
        approver_rule=m["approver_rule"],
        required_approvals=m["required_approvals"],
        requested_by=m["requested_by"],
        created_at=m["created_at"],
        expires_at=m["expires_at"],
        state=ApprovalState(m["state"]),
        decided_by=m["decided_by"],
        decided_at=m["decided_at"],
        reason=m["reason"],
        version=m["version"],
    )


def decision_to_row(d: ApprovalDecision) -> dict[str, Any]:
    return {
        "approval_id": d.approval_id,
        "tenant_id": d.tenant_id,
        "run_id": d.run_id,
        "decided_by": d.decided_by,
        "decision": str(d.decision),
        "proposal_hash": d.proposal_hash,
        "reason": d.reason,
        "break_glass": d.break_glass,
        "decided_at": d.decided_at,
    }


def row_to_decision(row: Row[Any]) -> ApprovalDecision:
    m = row._mapping
    return ApprovalDecision(
        approval_id=m["approval_id"],
        run_id=m["run_id"],
        tenant_id=m["tenant_id"],
        decided_by=m["decided_by"],
        decision=Decision(m["decision"]),
        proposal_hash=m["proposal_hash"],
        reason=m["reason"],
        break_glass=m["break_glass"],
        decided_at=m["decided_at"],
    )


def intent_to_row(i: CancellationIntent) -> dict[str, Any]:
    return {
        "intent_id": i.intent_id,
        "tenant_id": i.tenant_id,
        "run_id": i.run_id,
        "requested_by": i.requested_by,
        "reason": i.reason,
        "requested_at": i.requested_at,
    }


def row_to_intent(row: Row[Any]) -> CancellationIntent:
    m = row._mapping
    return CancellationIntent(
        intent_id=m["intent_id"],
        run_id=m["run_id"],
        tenant_id=m["tenant_id"],
        requested_by=m["requested_by"],
        reason=m["reason"],
        requested_at=m["requested_at"],
    )


def event_to_row(e: Event) -> dict[str, Any]:
    return {
        "event_id": e.event_id,
        "tenant_id": e.tenant_id,
        "project_id": e.project_id,
        "run_id": e.run_id,
        "seq": e.seq,
        "topic": e.topic,
        "event_type": e.event_type,
        "step_id": e.step_id,
        "attempt_id": e.attempt_id,
        "correlation_id": e.correlation_id,
        "causation_id": e.causation_id,
        "producer": e.producer,
        "schema_version": e.schema_version,
        "payload": e.payload,
        "occurred_at": e.occurred_at,
        "published_at": None,
    }


def journal_to_row(j: RecoveryJournalEntry) -> dict[str, Any]:
    return {
        "tenant_id": j.tenant_id,
        "run_id": j.run_id,
        "sequence": j.sequence,
        "entity": j.entity,
        "entity_id": j.entity_id,
        "from_state": _str(j.from_state),
        "to_state": str(j.to_state),
        "cause": j.cause,
        "actor": j.actor,
        "occurred_at": j.occurred_at,
    }


def audit_to_row(a: AuditRecord) -> dict[str, Any]:
    return {
        "tenant_id": a.tenant_id,
        "run_id": a.run_id,
        "kind": a.kind,
        "actor": a.actor,
        "detail": a.detail,
        "occurred_at": a.occurred_at,
    }
