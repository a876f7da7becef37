"""The event classes are the one definition of each payload: the topics, the stored keys and
the schemas all derive from them, and none of those may change meaning under a version."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import UTC, datetime
from uuid import UUID

import pytest
from domain_harness import RUN_ID

from runcontrol.domain import RunState
from runcontrol.domain.events import (
    EVENT_TYPES,
    TERMINAL_EVENTS,
    TOPICS,
    AttemptDispatched,
    EventBody,
    LeaseGranted,
    RunStateChanged,
    payload_schemas,
)

# The published topics: consumers subscribe by them. A change here is a breaking change.
PUBLISHED_TOPICS = {
    "RunAccepted": "run-control.runs.v1.run-accepted",
    "RunStateChanged": "run-control.runs.v1.run-state-changed",
    "RunCompleted": "run-control.runs.v1.run-completed",
    "RunFailed": "run-control.runs.v1.run-failed",
    "RunCancelled": "run-control.runs.v1.run-cancelled",
    "CancellationRequested": "run-control.runs.v1.cancellation-requested",
    "AttemptDispatched": "run-control.attempts.v1.attempt-dispatched",
    "LeaseGranted": "run-control.leases.v1.lease-granted",
    "AttemptParked": "run-control.attempts.v1.attempt-parked",
    "AttemptResumed": "run-control.attempts.v1.attempt-resumed",
    "AttemptOutcomeRecorded": "run-control.attempts.v1.attempt-outcome-recorded",
    "StepRetryScheduled": "run-control.steps.v1.step-retry-scheduled",
    "StepWaiting": "run-control.steps.v1.step-waiting",
    "StepWaitEnded": "run-control.steps.v1.step-wait-ended",
    "StepSkipped": "run-control.steps.v1.step-skipped",
    "ChildRunStarted": "run-control.children.v1.child-run-started",
    "ChildRunEnded": "run-control.children.v1.child-run-ended",
    "SignalReceived": "run-control.signals.v1.signal-received",
    "LeaseExpired": "run-control.leases.v1.lease-expired",
    "LeaseHandedBack": "run-control.leases.v1.lease-handed-back",
    "LeaseRevoked": "run-control.leases.v1.lease-revoked",
    "ApprovalRequested": "run-control.approvals.v1.approval-requested",
    "ApprovalDecided": "run-control.approvals.v1.approval-decided",
    "ProgressReported": "run-control.attempts.v1.progress-reported",
    "CallRecorded": "run-control.attempts.v1.call-recorded",
    "RateLimitConsumed": "run-control.attempts.v1.rate-limit-consumed",
    "ToolCallClaimed": "run-control.tool-calls.v1.tool-call-claimed",
    "ToolCallCompleted": "run-control.tool-calls.v1.tool-call-completed",
    "ToolCallExpired": "run-control.tool-calls.v1.tool-call-expired",
    "RunSuspended": "run-control.runs.v1.run-suspended",
    "RunResumed": "run-control.runs.v1.run-resumed",
    "StepRetryRequested": "run-control.steps.v1.step-retry-requested",
    "AttemptOutcomeResolved": "run-control.attempts.v1.attempt-outcome-resolved",
    "RunRerun": "run-control.runs.v1.run-rerun",
}
CAMEL = re.compile(r"^[a-z][a-zA-Z]*$")


def moved(current: RunState, target: RunState) -> RunStateChanged:
    return RunStateChanged(
        run_id=RUN_ID, tenant_id="t", from_state=current, to_state=target, cause="x"
    )


def test_topics_are_derived_from_the_classes_and_unchanged():
    assert dict(TOPICS) == PUBLISHED_TOPICS
    assert all(cls.event_type() == name for name, cls in EVENT_TYPES.items())
    assert TERMINAL_EVENTS == {"RunCompleted", "RunFailed", "RunCancelled"}


@pytest.mark.parametrize("name", list(EVENT_TYPES))
def test_each_schema_requires_exactly_the_stored_keys(name):
    cls = EVENT_TYPES[name]
    schema = payload_schemas()[name]
    assert schema["topic"] == cls.topic and schema["schemaVersion"] == cls.schema_version == 1
    payload = schema["payload"]
    keys = [key for _, key, _ in cls._codec]
    assert list(payload["properties"]) == keys == payload["required"]
    assert payload["additionalProperties"] is False
    assert all(CAMEL.match(k) for k in keys), keys
    assert {f.name for f in dataclasses.fields(cls)} == {attr for attr, _, _ in cls._codec}


def test_a_payload_is_json_with_ids_times_and_enums_as_strings():
    at = datetime(2026, 3, 1, 9, 0, 5, 120000, tzinfo=UTC)
    lease = UUID(int=7)
    body = LeaseGranted(
        run_id=RUN_ID,
        step_id=UUID(int=5),
        attempt_id=UUID(int=6),
        lease_id=lease,
        fencing_token=3,
        holder="worker-1",
        expires_at=at,
    )
    payload = body.to_payload()
    assert payload == {
        "runId": str(RUN_ID),
        "stepId": str(UUID(int=5)),
        "attemptId": str(UUID(int=6)),
        "leaseId": str(lease),
        "fencingToken": 3,
        "holder": "worker-1",
        "expiresAt": at.isoformat(),
    }
    assert json.loads(json.dumps(payload)) == payload
    changed = moved(RunState.ACCEPTED, RunState.RUNNING).to_payload()
    assert type(changed["fromState"]) is str and changed["toState"] == "Running"
    # A dispatch has no lease yet: its lease keys are present and null.
    dispatched = AttemptDispatched(
        run_id=RUN_ID,
        step_id=UUID(int=5),
        attempt_id=UUID(int=6),
        agent_id="reader",
        skill_id=None,
        attempt_number=1,
    ).to_payload()
    assert dispatched["leaseId"] is None and dispatched["fencingToken"] is None


def test_bodies_are_frozen_and_typed():
    body = moved(RunState.RUNNING, RunState.FAILED)
    with pytest.raises(dataclasses.FrozenInstanceError):
        body.cause = "y"  # type: ignore[misc]
    assert isinstance(body, EventBody)
    with pytest.raises(TypeError):
        RunStateChanged(RUN_ID, "t", RunState.RUNNING, RunState.FAILED, "x")  # type: ignore[misc]
