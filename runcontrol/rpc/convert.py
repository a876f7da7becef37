"""Domain objects to and from ``runcontrol.v1`` messages (``schemas/runcontrol.proto``).

Proto3 has no null for scalars: an absent id, hash or time is the empty string / unset
timestamp on the wire and ``None`` here. JSON documents travel as canonical JSON text.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from google.protobuf import timestamp_pb2

from schemas import runcontrol_pb2 as pb

from ..domain import (
    ApprovalRequest,
    ApprovalState,
    Attempt,
    AttemptOutcome,
    AttemptState,
    FailureClass,
    LeaseGrant,
    ProgressAck,
    ProgressMessage,
    SideEffectClass,
    ToolCallClaim,
    ToolCallStatus,
    canonical_json,
    errors,
)

OUTCOMES: dict[pb.AttemptOutcome, AttemptOutcome] = {
    pb.SUCCEEDED: AttemptOutcome.SUCCEEDED,
    pb.FAILED: AttemptOutcome.FAILED,
    pb.TIMED_OUT: AttemptOutcome.TIMED_OUT,
    pb.UNCERTAIN: AttemptOutcome.UNCERTAIN,
    pb.CANCELLED: AttemptOutcome.CANCELLED,
}
OUTCOME_NUMBERS: dict[AttemptOutcome, pb.AttemptOutcome] = {o: n for n, o in OUTCOMES.items()}


# ---------------------------------------------------------------------- scalars


def uuid_field(value: str, name: str) -> UUID:
    """A required id from a request; a malformed one is the caller's error."""
    try:
        return UUID(value)
    except ValueError:
        raise errors.ValidationFailed(f"{name} must be a UUID", field=name) from None


def optional_uuid(value: str, name: str) -> UUID | None:
    return uuid_field(value, name) if value else None


def timestamp(value: datetime | None) -> timestamp_pb2.Timestamp | None:
    if value is None:
        return None
    ts = timestamp_pb2.Timestamp()
    ts.FromDatetime(value)
    return ts


def from_timestamp(message: Any, name: str) -> datetime | None:
    if not message.HasField(name):
        return None
    value: datetime = getattr(message, name).ToDatetime(tzinfo=UTC)
    return value


def _required_time(message: Any, name: str) -> datetime:
    value = from_timestamp(message, name)
    if value is None:
        raise errors.ValidationFailed(f"{name} is missing from the answer")
    return value


def _s(value: Any) -> str:
    return "" if value is None else str(value)


def _json_text(value: Any) -> str:
    return "" if value is None else canonical_json(value).decode()


def _from_json_text(text: str) -> Any:
    return json.loads(text) if text else None


# ---------------------------------------------------------------------- leases


def lease_message(grant: LeaseGrant, tenant_id: str, input: Any = None) -> pb.Lease:
    return pb.Lease(
        tenant_id=tenant_id,
        run_id=str(grant.run_id),
        step_id=str(grant.step_id),
        attempt_id=str(grant.attempt_id),
        lease_id=str(grant.lease_id),
        fencing_token=grant.fencing_token,
        holder=grant.holder,
        expires_at=timestamp(grant.expires_at),
        agent_id=grant.agent_id,
        skill_id=_s(grant.skill_id),
        attempt_number=grant.attempt_number,
        side_effect_class=str(grant.side_effect_class),
        gate=grant.gate,
        cancel_requested=grant.cancel_requested,
        input_json=_json_text(input),
        approved_proposal_hash=grant.approved_proposal_hash or "",
    )


def lease_grant(message: pb.Lease) -> LeaseGrant:
    return LeaseGrant(
        run_id=UUID(message.run_id),
        step_id=UUID(message.step_id),
        attempt_id=UUID(message.attempt_id),
        lease_id=UUID(message.lease_id),
        fencing_token=message.fencing_token,
        holder=message.holder,
        expires_at=_required_time(message, "expires_at"),
        agent_id=message.agent_id,
        skill_id=message.skill_id or None,
        attempt_number=message.attempt_number,
        side_effect_class=SideEffectClass(message.side_effect_class),
        gate=message.gate or "none",
        cancel_requested=message.cancel_requested,
        approved_proposal_hash=message.approved_proposal_hash or None,
    )


def lease_input(message: pb.Lease) -> dict[str, Any] | None:
    value = _from_json_text(message.input_json)
    return value if isinstance(value, dict) else None


# ---------------------------------------------------------------------- attempts


def attempt_message(attempt: Attempt) -> pb.Attempt:
    return pb.Attempt(
        attempt_id=str(attempt.attempt_id),
        step_id=str(attempt.step_id),
        run_id=str(attempt.run_id),
        tenant_id=attempt.tenant_id,
        number=attempt.number,
        state=str(attempt.state),
        dispatched_at=timestamp(attempt.dispatched_at),
        lease_id=_s(attempt.lease_id),
        fencing_token=attempt.fencing_token or 0,
        holder=_s(attempt.holder),
        outcome=_s(attempt.outcome),
        outcome_hash=_s(attempt.outcome_hash),
        failure_class=_s(attempt.failure_class),
        settled_at=timestamp(attempt.settled_at),
        settled_by=_s(attempt.settled_by),
    )


def attempt(message: pb.Attempt) -> Attempt:
    return Attempt(
        attempt_id=UUID(message.attempt_id),
        step_id=UUID(message.step_id),
        run_id=UUID(message.run_id),
        tenant_id=message.tenant_id,
        number=message.number,
        state=AttemptState(message.state),
        dispatched_at=_required_time(message, "dispatched_at"),
        lease_id=UUID(message.lease_id) if message.lease_id else None,
        fencing_token=message.fencing_token or None,
        holder=message.holder or None,
        outcome=AttemptOutcome(message.outcome) if message.outcome else None,
        outcome_hash=message.outcome_hash or None,
        failure_class=FailureClass(message.failure_class) if message.failure_class else None,
        settled_at=from_timestamp(message, "settled_at"),
        settled_by=message.settled_by or None,
    )


# ---------------------------------------------------------------------- approvals


def approval_message(approval: ApprovalRequest) -> pb.Approval:
    return pb.Approval(
        approval_id=str(approval.approval_id),
        run_id=str(approval.run_id),
        step_id=str(approval.step_id),
        attempt_id=str(approval.attempt_id),
        tenant_id=approval.tenant_id,
        action_class=str(approval.action_class),
        proposal_hash=approval.proposal_hash,
        policy_revision=approval.policy_revision,
        approver_rule=approval.approver_rule,
        required_approvals=approval.required_approvals,
        requested_by=approval.requested_by,
        created_at=timestamp(approval.created_at),
        expires_at=timestamp(approval.expires_at),
        state=str(approval.state),
        decided_by=_s(approval.decided_by),
        decided_at=timestamp(approval.decided_at),
        reason=_s(approval.reason),
        version=approval.version,
    )


def approval(message: pb.Approval) -> ApprovalRequest:
    return ApprovalRequest(
        approval_id=UUID(message.approval_id),
        run_id=UUID(message.run_id),
        step_id=UUID(message.step_id),
        attempt_id=UUID(message.attempt_id),
        tenant_id=message.tenant_id,
        action_class=SideEffectClass(message.action_class),
        proposal_hash=message.proposal_hash,
        policy_revision=message.policy_revision,
        approver_rule=message.approver_rule,
        required_approvals=message.required_approvals,
        requested_by=message.requested_by,
        created_at=_required_time(message, "created_at"),
        expires_at=_required_time(message, "expires_at"),
        state=ApprovalState(message.state),
        decided_by=message.decided_by or None,
        decided_at=from_timestamp(message, "decided_at"),
        reason=message.reason or None,
        version=message.version,
    )


# ---------------------------------------------------------------------- progress


def progress_messages(messages: Any) -> tuple[ProgressMessage, ...]:
    """A request's progress messages; a payload that is not a JSON object is refused."""
    found = []
    for m in messages:
        try:
            payload = _from_json_text(m.payload_json)
        except ValueError:
            raise errors.ValidationFailed("payload_json must be JSON", field="messages") from None
        if payload is not None and not isinstance(payload, dict):
            raise errors.ValidationFailed("payload_json must be a JSON object", field="messages")
        found.append(ProgressMessage(m.seq, m.text or None, payload))
    return tuple(found)


def progress_message(message: ProgressMessage) -> pb.ProgressMessage:
    return pb.ProgressMessage(
        seq=message.seq, text=_s(message.text), payload_json=_json_text(message.payload)
    )


def progress_response(ack: ProgressAck) -> pb.ReportProgressResponse:
    return pb.ReportProgressResponse(
        acked_seq=ack.acked_seq, stored=ack.stored, duplicates=ack.duplicates
    )


def progress_ack(attempt_id: UUID, message: pb.ReportProgressResponse) -> ProgressAck:
    return ProgressAck(attempt_id, message.acked_seq, message.stored, message.duplicates)


# ---------------------------------------------------------------------- tool calls


def tool_call_message(claim: ToolCallClaim) -> pb.ToolCallResponse:
    return pb.ToolCallResponse(
        tool_call_id=str(claim.tool_call_id),
        call_id=claim.call_id,
        status=str(claim.status),
        result_hash=_s(claim.result_hash),
        error=_s(claim.error),
    )


def tool_call_claim(message: pb.ToolCallResponse) -> ToolCallClaim:
    return ToolCallClaim(
        tool_call_id=UUID(message.tool_call_id),
        call_id=message.call_id,
        status=ToolCallStatus(message.status),
        result_hash=message.result_hash or None,
        error=message.error or None,
    )


# ---------------------------------------------------------------------- events

# The event envelope as the store's read model has it (camelCase, as the HTTP history) and
# the RunEvent field of each member.
_EVENT_TEXT = {
    "eventId": "event_id",
    "type": "type",
    "topic": "topic",
    "runId": "run_id",
    "tenantId": "tenant_id",
    "projectId": "project_id",
    "stepId": "step_id",
    "attemptId": "attempt_id",
    "correlationId": "correlation_id",
    "causationId": "causation_id",
    "producer": "producer",
}


def event_message(event: dict[str, Any]) -> pb.RunEvent:
    """One committed event (``store.queries.event_view``) as a RunEvent."""
    message = pb.RunEvent(
        seq=event["seq"],
        schema_version=event["schemaVersion"],
        payload_json=_json_text(event.get("payload")),
    )
    for key, field in _EVENT_TEXT.items():
        setattr(message, field, _s(event.get(key)))
    occurred = event.get("occurredAt")
    if occurred is not None:
        at = occurred if isinstance(occurred, datetime) else datetime.fromisoformat(occurred)
        message.occurred_at.FromDatetime(at)
    return message


def event(message: pb.RunEvent) -> dict[str, Any]:
    """A RunEvent as the envelope the HTTP history answers with (camelCase keys)."""
    found: dict[str, Any] = {
        key: getattr(message, field) or None for key, field in _EVENT_TEXT.items()
    }
    occurred = from_timestamp(message, "occurred_at")
    found.update(
        seq=message.seq,
        schemaVersion=message.schema_version,
        payload=_from_json_text(message.payload_json) or {},
        occurredAt=None if occurred is None else occurred.isoformat(),
    )
    return found
