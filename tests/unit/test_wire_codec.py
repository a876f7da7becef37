"""The proto mapping: field by name, checked when a codec is built, both ways (no network)."""

from __future__ import annotations

import ast
import dataclasses
import typing
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from pathlib import Path
from typing import Any
from uuid import uuid4

import pytest

import runcontrol
from runcontrol.commands import DECLARATIONS, ReportOutcome, ReportProgress
from runcontrol.domain import (
    ApprovalRequest,
    ApprovalState,
    Attempt,
    AttemptOutcome,
    AttemptState,
    Event,
    FailureClass,
    LeaseGrant,
    ProgressMessage,
    SideEffectClass,
    WorkerIdentity,
    errors,
)
from runcontrol.rpc import table
from runcontrol.rpc.codec import Codec
from runcontrol.store import queries
from schemas import runcontrol_pb2 as pb

NOW = datetime(2026, 12, 1, 8, 30, 15, 123456, tzinfo=UTC)
WORKER = WorkerIdentity("tenant-a", "svc-worker", "inst-1")


def _attempt(**overrides: Any) -> Attempt:
    fields: dict[str, Any] = {
        "attempt_id": uuid4(),
        "step_id": uuid4(),
        "run_id": uuid4(),
        "tenant_id": "tenant-a",
        "number": 2,
        "state": AttemptState.LEASED,
        "dispatched_at": NOW,
    }
    fields.update(overrides)
    return Attempt(**fields)


def _fields(cls: type[Any]) -> set[str]:
    """The fields a domain type keeps beyond memory (``Event.body`` is serialised as payload)."""
    return {f.name for f in dataclasses.fields(cls) if f.metadata.get("stored", True)}


# ---------------------------------------------------------------------- the check at build time


def test_a_dataclass_field_the_message_lacks_fails_the_build() -> None:
    Wider = dataclasses.make_dataclass(
        "Wider", [("lost_on_the_wire", int, dataclasses.field(default=0))], bases=(Attempt,)
    )
    with pytest.raises(TypeError, match="lost_on_the_wire"):
        Codec(Wider, pb.Attempt)


def test_a_message_field_no_dataclass_field_fills_fails_the_build() -> None:
    # Attempt as it was before progress_seq reached the proto, seen from the other side.
    hints = typing.get_type_hints(Attempt)
    Narrower = dataclasses.make_dataclass(
        "Narrower", [(name, hint) for name, hint in hints.items() if name != "progress_seq"]
    )
    with pytest.raises(TypeError, match="progress_seq"):
        Codec(Narrower, pb.Attempt)


def test_a_pair_of_types_without_a_rule_fails_the_build() -> None:
    @dataclasses.dataclass
    class Mistyped:
        seq: str  # int64 on the wire
        text: str
        payload: dict[str, Any] | None

    with pytest.raises(TypeError, match="no rule for seq"):
        Codec(Mistyped, pb.ProgressMessage)


def test_a_domain_enum_member_the_proto_enum_lacks_fails_the_build() -> None:
    class Outcome(StrEnum):
        SUCCEEDED = "Succeeded"
        VANISHED = "Vanished"

    hints = typing.get_type_hints(ReportOutcome) | {"outcome": Outcome}
    Wider = dataclasses.make_dataclass("Wider", list(hints.items()))
    with pytest.raises(TypeError, match="VANISHED"):
        Codec(
            Wider,
            pb.ReportAttemptOutcomeRequest,
            supplied=("tenant_id", "holder"),
            extra=("worker_instance_id",),
        )


@pytest.mark.parametrize(
    ("codec", "cls"),
    [
        (table.ATTEMPT, Attempt),
        (table.APPROVAL, ApprovalRequest),
        (table.EVENT, Event),
        (table.LEASE, LeaseGrant),
    ],
)
def test_every_field_of_the_domain_type_crosses(codec: Codec[Any], cls: type[Any]) -> None:
    assert {attr for attr, _ in codec.fields} == _fields(cls)


# ---------------------------------------------------------------------- both ways


def test_an_attempt_crosses_whole_with_its_progress_seq() -> None:
    full = _attempt(
        lease_id=uuid4(),
        fencing_token=7,
        holder="svc-worker/inst-1",
        outcome=AttemptOutcome.TIMED_OUT,
        outcome_hash="sha256:ab",
        failure_class=FailureClass.TRANSIENT,
        settled_at=NOW + timedelta(seconds=3),
        settled_by="reconciler",
        progress_seq=9,
    )
    message = table.ATTEMPT.encode(full)
    assert message.progress_seq == 9 and message.outcome == "TimedOut"
    assert table.ATTEMPT.decode(pb.Attempt.FromString(message.SerializeToString())) == full


def test_none_is_the_proto3_default_and_comes_back_as_none() -> None:
    bare = _attempt()
    message = table.ATTEMPT.encode(bare)
    assert message.lease_id == "" and message.fencing_token == 0
    assert not message.HasField("settled_at")
    assert table.ATTEMPT.decode(message) == bare


def test_an_approval_crosses_whole() -> None:
    approval = ApprovalRequest(
        approval_id=uuid4(),
        run_id=uuid4(),
        step_id=uuid4(),
        attempt_id=uuid4(),
        tenant_id="tenant-a",
        action_class=SideEffectClass.SHARED_WRITE,
        proposal_hash="sha256:cd",
        policy_revision="3",
        approver_rule="any-reviewer",
        required_approvals=2,
        requested_by="svc-worker/inst-1",
        created_at=NOW,
        expires_at=NOW + timedelta(hours=1),
        state=ApprovalState.APPROVED,
        decided_by="rev",
        decided_at=NOW + timedelta(minutes=5),
        reason="fine",
        version=3,
    )
    assert table.APPROVAL.decode(table.APPROVAL.encode(approval)) == approval


def test_a_lease_carries_its_tenant_and_the_run_input_beside_the_grant() -> None:
    grant = LeaseGrant(
        run_id=uuid4(),
        step_id=uuid4(),
        attempt_id=uuid4(),
        lease_id=uuid4(),
        fencing_token=3,
        holder="svc-worker/inst-1",
        expires_at=NOW,
        agent_id="agent-1",
        skill_id=None,
        attempt_number=1,
        side_effect_class=SideEffectClass.READ,
        approved_proposal_hash="sha256:ef",
    )
    message = table.lease_message(grant, "tenant-a", {"b": 1, "a": [2]})
    assert message.tenant_id == "tenant-a" and message.input_json == '{"a":[2],"b":1}'
    assert message.gate == "none"
    assert table.LEASE.decode(message) == grant


def test_an_event_view_crosses_with_the_read_models_keys() -> None:
    assert set(table._VIEW_KEY.values()) == {key for key, _ in queries.EVENT}
    view = {
        "seq": 4,
        "eventId": str(uuid4()),
        "type": "AttemptLeased",
        "topic": "runcontrol.attempts",
        "runId": str(uuid4()),
        "tenantId": "tenant-a",
        "projectId": "proj",
        "stepId": str(uuid4()),
        "attemptId": None,
        "correlationId": None,
        "causationId": "c-1",
        "producer": "runcontrol",
        "schemaVersion": 1,
        "occurredAt": NOW.isoformat(),
        "payload": {"fencingToken": 1},
    }
    message = table.event_message(view)
    assert message.type == "AttemptLeased" and message.payload_json == '{"fencingToken":1}'
    assert table.event_view(message) == view


# ---------------------------------------------------------------------- requests as commands


def _report_rpc() -> table.Rpc:
    return table.BY_COMMAND[ReportOutcome]


def _fenced(fencing_token: int = 1) -> dict[str, Any]:
    """A fenced command's fields: the caller's identity and an attempt."""
    return {
        "tenant_id": WORKER.tenant_id,
        "holder": WORKER.holder,
        "run_id": uuid4(),
        "attempt_id": uuid4(),
        "fencing_token": fencing_token,
    }


def test_a_request_is_its_command_with_the_callers_identity() -> None:
    rpc = _report_rpc()
    assert rpc.to_command is not None and rpc.to_request is not None
    sent = ReportOutcome(
        **_fenced(4), outcome=AttemptOutcome.UNCERTAIN, failure_class=FailureClass.TRANSIENT
    )
    request = rpc.to_request(sent, WORKER.instance_id)
    assert request.outcome == pb.UNCERTAIN and request.worker_instance_id == "inst-1"
    assert rpc.to_command(request, WORKER) == sent


def test_an_empty_command_id_gets_a_new_one_and_bad_fields_are_the_callers_error() -> None:
    rpc = _report_rpc()
    assert rpc.to_command is not None
    ok = {"run_id": str(uuid4()), "attempt_id": str(uuid4()), "outcome": pb.SUCCEEDED}
    command = rpc.to_command(pb.ReportAttemptOutcomeRequest(**ok), WORKER)
    assert command.command_id and command.lease_id is None and command.failure_class is None
    bad: list[tuple[dict[str, Any], str]] = [
        ({"run_id": "not-a-uuid"}, "run_id must be a UUID"),
        ({"outcome": pb.ATTEMPT_OUTCOME_UNSPECIFIED}, "outcome is required"),
        ({"outcome": 42}, "unknown outcome 42"),
        ({"failure_class": "bored"}, "unknown failure class 'bored'"),
    ]
    for change, message in bad:
        with pytest.raises(errors.ValidationFailed, match=message):
            rpc.to_command(pb.ReportAttemptOutcomeRequest(**(ok | change)), WORKER)


def test_progress_messages_cross_as_a_repeated_message() -> None:
    rpc = table.BY_COMMAND[ReportProgress]
    assert rpc.to_command is not None and rpc.to_request is not None
    sent = ReportProgress(
        **_fenced(), messages=(ProgressMessage(1, "half", {"pct": 50}), ProgressMessage(2))
    )
    assert rpc.to_command(rpc.to_request(sent, "inst-1"), WORKER) == sent
    listed = pb.ReportProgressRequest(
        run_id=str(sent.run_id),
        attempt_id=str(sent.attempt_id),
        messages=[pb.ProgressMessage(seq=1, payload_json="[1]")],
    )
    with pytest.raises(errors.ValidationFailed, match="payload_json must be a JSON object"):
        rpc.to_command(listed, WORKER)


def test_each_worker_command_has_one_rpc() -> None:
    declared = {c.__name__ for c, d in DECLARATIONS.items() if d.rpc is not None}
    assert {c.__name__ for c in table.BY_COMMAND} == declared
    assert {"AcquireLease", "RenewLease", "ReportOutcome", "ConsumeRateLimit"} <= declared
    service = pb.DESCRIPTOR.services_by_name["RunControl"]
    assert [r.method for r in table.RPCS] == [m.name for m in service.methods]


def test_neither_edge_imports_the_other() -> None:
    """rpc/ and api/ share runcontrol.edge; neither reaches into the other."""
    root = Path(runcontrol.__file__).parent
    for edge, other in (("rpc", "api"), ("api", "rpc")):
        for path in (root / edge).glob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 2:
                    module = node.module or ""
                    assert module.split(".")[0] != other, f"{edge}/{path.name} imports ..{module}"
