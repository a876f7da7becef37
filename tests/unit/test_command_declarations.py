"""Each command is declared once (``commands.declare``): the grain's handlers, the stored answer
types and the RPC table's command rows are derived from the declarations, and a declaration
that does not fit its rule, the proto or a codec fails when its module loads."""

from __future__ import annotations

import dataclasses
import types
from typing import Any
from uuid import UUID

import pytest

import runcontrol.commands as commands
from runcontrol.commands import DECLARATIONS, CancelRun, Command, ReportProgress
from runcontrol.declaration import LEASE_HOLDER, OPERATOR, Sender, declare
from runcontrol.domain import (
    ApprovalState,
    Attempt,
    AttemptState,
    ProgressAck,
    SideEffectClass,
    ToolCallStatus,
    errors,
)
from runcontrol.domain.machines import RUN_COMMANDS, RunCommand
from runcontrol.domain.run.leases import acquire_lease
from runcontrol.grain import HANDLERS
from runcontrol.rpc import table
from runcontrol.store.answers import ANSWER_TYPES, decode

ID = "00000000-0000-4000-8000-000000000001"
AT = "2026-03-01T09:00:00+00:00"

# Answers as ``command_answers.answer`` holds them (one of each stored type): an upgrade must
# still read every answer stored inside the resend window.
STORED: dict[str, dict[str, Any]] = {
    "LeaseGrant": {
        "run_id": ID,
        "step_id": ID,
        "attempt_id": ID,
        "lease_id": ID,
        "fencing_token": 3,
        "holder": "w/1",
        "expires_at": AT,
        "agent_id": "reader",
        "skill_id": None,
        "attempt_number": 1,
        "side_effect_class": "read",
        "gate": "none",
        "cancel_requested": False,
        "approved_proposal_hash": None,
        "replay": None,
    },
    "Attempt": {
        "attempt_id": ID,
        "step_id": ID,
        "run_id": ID,
        "tenant_id": "t",
        "number": 1,
        "state": "Succeeded",
        "dispatched_at": AT,
        "lease_id": ID,
        "fencing_token": 1,
        "holder": "w/1",
        "outcome": "Succeeded",
        "outcome_hash": None,
        "failure_class": None,
        "settled_at": AT,
        "settled_by": "w/1",
        "progress_seq": 2,
    },
    "ApprovalRequest": {
        "approval_id": ID,
        "run_id": ID,
        "step_id": ID,
        "attempt_id": ID,
        "tenant_id": "t",
        "action_class": "shared-write",
        "proposal_hash": "sha256:ab",
        "policy_revision": "1",
        "approver_rule": "role:approver",
        "required_approvals": 1,
        "requested_by": "w/1",
        "created_at": AT,
        "expires_at": AT,
        "state": "Pending",
        "decided_by": None,
        "decided_at": None,
        "reason": None,
        "version": 1,
    },
    "SubmitResult": {
        "run_id": ID,
        "state": "Running",
        "release_id": "r1",
        "policy_revision": "1",
        "snapshot_id": ID,
        "created": True,
    },
    "WakeResult": {
        "started": False,
        "leases_expired": 1,
        "approvals_expired": 0,
        "dispatched": True,
        "stopped": None,
        "tool_calls_expired": 0,
    },
    "ProgressAck": {"attempt_id": ID, "acked_seq": 2, "stored": 2, "duplicates": 0, "gap_at": None},
    "ToolCallClaim": {
        "tool_call_id": ID,
        "call_id": "c1",
        "status": "proceed",
        "result_hash": None,
        "error": None,
        "result_json": None,
    },
    "ControlResult": {
        "run_id": ID,
        "state": "Running",
        "suspended": False,
        "step_id": ID,
        "attempt_id": ID,
        "attempt_state": "Dispatched",
        "attempt_number": 2,
    },
    "SignalResult": {
        "run_id": ID,
        "step_id": ID,
        "name": "go",
        "delivered": True,
        "state": "Running",
    },
    "RateConsumed": {"name": "tokens", "bucket": "named:tokens", "units": 5.0, "at": AT},
    "RecordedCall": {
        "name": "plan",
        "occurrence": 1,
        "value_hash": "sha256:" + "0" * 64,
        "bytes": 4,
        "recorded_at": AT,
        "recorded": False,
        "value_json": "true",
        "error": None,
    },
    "OutputAck": {"attempt_id": ID, "acked_seq": 3, "stored": 2, "duplicates": 1},
}


def test_every_command_is_declared_handled_and_exported() -> None:
    kinds = {  # every command class but the bases (Command, Fenced, Control)
        v
        for v in vars(commands).values()
        if isinstance(v, type) and issubclass(v, Command) and not v.__subclasses__()
    }
    assert kinds == set(DECLARATIONS)
    assert set(HANDLERS) == set(DECLARATIONS)
    assert {k.__name__ for k in kinds} <= set(commands.__all__)


def test_a_stored_answer_of_each_type_still_decodes() -> None:
    assert set(ANSWER_TYPES) == set(STORED)
    for name, value in STORED.items():
        answer = decode({"type": name, "value": value})
        assert type(answer).__name__ == name
        assert {f.name for f in dataclasses.fields(answer)} == set(value)
    grant = decode({"type": "LeaseGrant", "value": STORED["LeaseGrant"]})
    assert grant.attempt_id == UUID(ID) and grant.side_effect_class is SideEffectClass.READ
    attempt = decode({"type": "Attempt", "value": STORED["Attempt"]})
    assert isinstance(attempt, Attempt) and attempt.state is AttemptState.SUCCEEDED
    approval = decode({"type": "ApprovalRequest", "value": STORED["ApprovalRequest"]})
    assert approval.state is ApprovalState.PENDING
    claim = decode({"type": "ToolCallClaim", "value": STORED["ToolCallClaim"]})
    assert claim.status is ToolCallStatus.PROCEED
    # stored before a completion could store its result (0021): it decodes without one
    before = {k: v for k, v in STORED["ToolCallClaim"].items() if k != "result_json"}
    assert decode({"type": "ToolCallClaim", "value": before}).result_json is None


def test_worker_commands_get_their_rpc_rows_from_their_declarations() -> None:
    declared = {d.command for d in DECLARATIONS.values() if d.rpc is not None}
    assert declared == set(table.BY_COMMAND)
    for command in declared:
        assert table.BY_COMMAND[command].method == DECLARATIONS[command].rpc


def test_a_progress_gap_is_read_off_the_answer() -> None:
    refuse = DECLARATIONS[ReportProgress].refuse
    assert refuse is not None
    assert refuse(ProgressAck(UUID(ID), 2, 2, 0)) is None
    gap = refuse(ProgressAck(UUID(ID), 2, 2, 0, gap_at=4))
    assert isinstance(gap, errors.ProgressGap) and gap.details["acked_seq"] == 2


# ---------------------------------------------------------------------- checks at load


@pytest.mark.parametrize(
    ("sender", "fields", "refusal"),
    [
        (
            OPERATOR,
            {"principal": Any, "attempt_id": UUID},
            "no field or given value for the rule's 'holder'",
        ),
        (
            LEASE_HOLDER,
            {"attempt_id": UUID, "holder": str, "note": str},
            r"the rule reads no field \['note'\]",
        ),
        (LEASE_HOLDER, {"attempt_id": str, "holder": str}, "attempt_id is <class 'str'>"),
    ],
    ids=["parameter-no-field-gives", "field-no-one-reads", "field-of-another-type"],
)
def test_a_declaration_that_does_not_fit_its_rule_fails(
    sender: Sender, fields: dict[str, Any], refusal: str
) -> None:
    def body(namespace: dict[str, Any]) -> None:
        namespace["__annotations__"] = fields

    kind = types.new_class("Lease", (Command[Any],), exec_body=body)  # declare's dataclass
    with pytest.raises(TypeError, match=refusal):
        declare(sender, acquire_lease)(kind)


def test_a_worker_command_without_its_proto_rpc_or_answer_codec_fails() -> None:
    with pytest.raises(TypeError, match="the proto has no rpc Nope"):
        table.command_rpc("Nope", ReportProgress, ProgressAck)
    with pytest.raises(TypeError, match="no codec in REPLIES"):
        table.command_rpc("ReportProgress", ReportProgress, str)


def test_a_guard_row_names_a_declared_command_or_a_check_inside_one() -> None:
    names = {c.__name__ for c in DECLARATIONS}
    inside = {"ToolCall", "StartToolCall", "EnforceDeadlines", "ExpireLease"}
    assert {str(m) for m in RunCommand} - names == inside
    guarded = {c.__name__ for c, d in DECLARATIONS.items() if d.guard is not None}
    assert {"AcquireLease", "CancelRun", "SendSignal", "SuspendRun"} <= guarded
    assert DECLARATIONS[CancelRun].guard is RUN_COMMANDS[RunCommand.CANCEL]
