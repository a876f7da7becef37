"""Replay's pure rules (docs/replay.md): which original call answers a replay's, which original
approval it reuses, the JSON diff and the divergence report."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest

from runcontrol.domain import errors
from runcontrol.domain.model import ApprovalRequest, JournaledCall
from runcontrol.domain.replay import (
    Original,
    Outcome,
    ReplayOptions,
    RunRecord,
    answer_call,
    json_diff,
    original_approval,
    report,
    summary,
)
from runcontrol.domain.states import ApprovalState, SideEffectClass

T0 = datetime(2026, 12, 1, tzinfo=UTC)
H = {n: "sha256:" + str(n) * 64 for n in range(1, 5)}


def journaled(name: str, occurrence: int, request: str | None, value: str) -> JournaledCall:
    return JournaledCall(
        run_id=uuid4(),
        step_id=uuid4(),
        name=name,
        occurrence=occurrence,
        tenant_id="acme",
        attempt_id=uuid4(),
        fencing_token=1,
        value_hash=value,
        bytes=1,
        recorded_at=T0,
        value_json="1",
        request_hash=request,
    )


def approval(proposal: str, state: ApprovalState) -> ApprovalRequest:
    return ApprovalRequest(
        approval_id=uuid4(),
        run_id=uuid4(),
        step_id=uuid4(),
        attempt_id=uuid4(),
        tenant_id="acme",
        action_class=SideEffectClass.SHARED_WRITE,
        proposal_hash=proposal,
        policy_revision="1",
        approver_rule="role:Reviewer",
        required_approvals=1,
        requested_by="ann",
        created_at=T0,
        expires_at=T0,
        state=state,
    )


def test_a_call_is_answered_only_by_the_same_step_name_occurrence_and_arguments():
    model = journaled("model", 1, H[1], H[2])
    bare = journaled("tool", 1, None, H[3])
    original = Original(uuid4(), {("plan", "model", 1): model, ("plan", "tool", 1): bare})
    assert answer_call(original, "plan", "model", 1, H[1]) is model
    assert answer_call(original, "plan", "tool", 1, None) is bare  # no arguments: by name
    cases: list[tuple[Any, ...]] = [
        ("plan", "model", 1, H[4], "other-arguments"),
        ("plan", "model", 2, H[1], "not-in-original"),
        ("code", "model", 1, H[1], "not-in-original"),
    ]
    for step, name, occurrence, request, why in cases:
        with pytest.raises(errors.ReplayDiverged) as refused:
            answer_call(original, step, name, occurrence, request)
        assert refused.value.details["why"] == why


def test_only_an_approved_equal_proposal_of_the_same_step_is_reused():
    approved = approval(H[1], ApprovalState.APPROVED)
    original = Original(
        uuid4(),
        approvals={"write": (approval(H[2], ApprovalState.REJECTED), approved)},
    )
    assert original_approval(original, "write", H[1]) is approved
    assert original_approval(original, "write", H[2]) is None  # rejected: a human decides
    assert original_approval(original, "other", H[1]) is None


def test_options_round_trip_and_name_the_lease_mode():
    options = ReplayOptions.from_dict({"liveCalls": True, "approvals": "fail"})
    assert ReplayOptions.from_dict(options.to_dict()) == options
    assert (options.lease_mode, ReplayOptions().lease_mode) == ("live", "refuse")


def test_the_json_diff_names_each_changed_leaf():
    before = {"a": 1, "b": [1, 2], "c": {"d": "x"}, "gone": True}
    after = {"a": 1, "b": [1, 3, 4], "c": {"d": "y"}, "new": None}
    assert json_diff(before, after) == [
        {"path": "$.b[1]", "before": 2, "after": 3},
        {"path": "$.b[2]", "after": 4},
        {"path": "$.c.d", "before": "x", "after": "y"},
        {"path": "$.gone", "before": True},
        {"path": "$.new", "after": None},
    ]
    assert json_diff({"n": 1}, {"n": 1.0}) == [{"path": "$.n", "before": 1, "after": 1.0}]


def test_the_report_and_the_batch_summary():
    same = journaled("model", 1, H[1], H[2])
    live = journaled("model", 2, H[3], H[4])
    skipped = journaled("model", 2, H[1], H[2])
    plan = Outcome(H[1], '{"x":1}')

    def run(state: str, code: Outcome, calls: dict[Any, Any], asked: Any, **kw: Any) -> RunRecord:
        steps = {"plan": plan, "code": code}
        calls = {("plan", "model", 1): same, **calls}
        return RunRecord(uuid4(), state, steps, calls, {"code": (asked,)}, **kw)

    original = run(
        "Completed",
        Outcome(H[2], '{"y":[1]}'),
        {("code", "model", 2): skipped},
        approval(H[1], ApprovalState.APPROVED),
    )
    replay = run(
        "Failed",
        Outcome(H[3], '{"y":[2]}'),
        {("code", "model", 3): live},
        approval(H[4], ApprovalState.PENDING),
        failures={"code": "replay-diverged"},
    )
    found = report(original, replay)
    assert found["diverged"]
    first, code = found["steps"]
    assert first == {"step": "plan", "equal": True, "originalHash": H[1], "replayHash": H[1]}
    assert code["diff"] == [{"path": "$.y[0]", "before": 1, "after": 2}]
    assert code["replayFailureClass"] == "replay-diverged"
    assert [c["occurrence"] for c in found["callsNotInOriginal"]] == [3]
    assert [c["occurrence"] for c in found["originalCallsNotMade"]] == [2]
    assert found["approvalsChanged"] == [
        {"step": "code", "proposalHash": H[4], "originalProposalHashes": [H[1]]}
    ]
    equal = report(original, original)
    assert not equal["diverged"]
    assert summary([found, equal]) == {
        "runs": 2,
        "diverged": 1,
        "steps": {"plan": {"equal": 2, "diverged": 0}, "code": {"equal": 1, "diverged": 1}},
    }
