"""Ordered progress and at-most-once tool calls on the pure aggregate (issue 11, items 5, 6).

Progress: a lease holder's messages are stored in sequence as per-run events; duplicates are
dropped, a gap stops the batch after what came before it. Tool calls: a call id is claimed
before its side effect and executed at most once; a claim without a result is closed by the
reminder when it times out. Both are fenced like every holder command: a stale token is refused
and audited.
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import grpc
import pytest
from domain_harness import Harness, canonical_hash

from runcontrol.api.problems import status_for as http_status
from runcontrol.domain import (
    PROGRESS_BATCH_MAX,
    AttemptOutcome,
    LeaseGrant,
    Options,
    ProgressAck,
    ProgressMessage,
    RunState,
    ToolCallClaim,
    ToolCallState,
    ToolCallStatus,
    errors,
)
from runcontrol.domain.events import TOPICS
from runcontrol.domain.machines import TOOL_CALL_TRANSITIONS, check
from runcontrol.domain.run.progress import report_progress
from runcontrol.domain.run.tool_calls import claim_tool_call, complete_tool_call, expire_tool_calls
from runcontrol.rpc.status import status_for as grpc_status

CLAIM_TIMEOUT = Options().tool_call_claim_timeout_seconds


def request(n: int = 1) -> str:
    return canonical_hash({"tool-request": n})


def result(n: int = 1) -> str:
    return canonical_hash({"tool-result": n})


def progress(
    h: Harness, grant: LeaseGrant, *seqs: int, token: int | None = None, holder: str | None = None
) -> ProgressAck:
    who = holder or grant.holder
    ack = report_progress(
        h.agg,
        h.ctx(who),
        grant.attempt_id,
        who,
        grant.fencing_token if token is None else token,
        tuple(ProgressMessage(seq, f"message {seq}", {"n": seq}) for seq in seqs),
        h.options,
        lease_id=grant.lease_id,
    )
    h.commit()
    return ack


def stored_progress(h: Harness) -> list[int]:
    return [e.payload["seq"] for e in h.events if e.event_type == "ProgressReported"]


def claim(
    h: Harness,
    grant: LeaseGrant,
    call_id: str = "call-1",
    request_hash: str | None = None,
    *,
    token: int | None = None,
) -> ToolCallClaim:
    answer = claim_tool_call(
        h.agg,
        h.ctx(grant.holder),
        grant.attempt_id,
        grant.holder,
        grant.fencing_token if token is None else token,
        call_id,
        request_hash or request(),
        h.options,
    )
    h.commit()
    return answer


def complete(
    h: Harness, grant: LeaseGrant, call_id: str = "call-1", result_hash: str | None = None
) -> ToolCallClaim:
    answer = complete_tool_call(
        h.agg,
        h.ctx(grant.holder),
        grant.attempt_id,
        grant.holder,
        grant.fencing_token,
        call_id,
        result_hash or result(),
        h.options,
    )
    h.commit()
    return answer


def refused_with_audit(h: Harness, *kinds: str) -> None:
    """A refusal keeps only its audit records: nothing else changed."""
    audits = h.agg.take_audits()
    assert [a.kind for a in audits] == list(kinds)
    left = h.agg.take_changes()
    assert left.empty, left


# ============================================================================ progress


class TestProgress:
    def test_duplicates_are_dropped_and_a_gap_keeps_only_what_came_before_it(self):
        h = Harness()
        _, grant = h.start()

        assert progress(h, grant, 1, 2, 3) == ProgressAck(grant.attempt_id, 3, 3, 0)
        assert progress(h, grant, 2, 3, 4, 5) == ProgressAck(grant.attempt_id, 5, 2, 2)
        gap = progress(h, grant, 6, 8, 9)  # 7 was lost
        assert gap == ProgressAck(grant.attempt_id, 6, 1, 0, gap_at=8)
        assert progress(h, grant, 9) == ProgressAck(grant.attempt_id, 6, 0, 0, gap_at=9)
        assert progress(h, grant, 7, 8, 9) == ProgressAck(grant.attempt_id, 9, 3, 0)

        assert stored_progress(h) == [1, 2, 3, 4, 5, 6, 7, 8, 9]
        assert h.agg.attempt(grant.attempt_id).progress_seq == 9

    def test_messages_are_per_run_events_in_order_with_the_run_sequence(self):
        h = Harness()
        _, grant = h.start()
        before = h.run.event_seq
        progress(h, grant, 1, 2)

        first, second = h.events[-2:]
        assert [first.seq, second.seq] == [before + 1, before + 2]
        assert first.event_type == "ProgressReported"
        assert first.topic == TOPICS["ProgressReported"]
        assert (first.attempt_id, first.step_id) == (grant.attempt_id, grant.step_id)
        assert first.payload == {
            "runId": str(grant.run_id),
            "stepId": str(grant.step_id),
            "attemptId": str(grant.attempt_id),
            "seq": 1,
            "text": "message 1",
            "payload": {"n": 1},
        }

    def test_a_batch_of_only_duplicates_changes_nothing(self):
        h = Harness()
        _, grant = h.start()
        progress(h, grant, 1, 2)
        version = h.run.version
        assert progress(h, grant, 1, 2) == ProgressAck(grant.attempt_id, 2, 0, 2)
        assert h.batches[-1].empty and h.run.version == version

    @pytest.mark.parametrize("seqs", [(), tuple(range(1, PROGRESS_BATCH_MAX + 2)), (0, 1)])
    def test_an_empty_oversized_or_zero_numbered_batch_is_invalid(self, seqs):
        h = Harness()
        _, grant = h.start()
        with pytest.raises(errors.ValidationFailed):
            progress(h, grant, *seqs)
        refused_with_audit(h)

    def test_a_full_batch_is_accepted(self):
        h = Harness()
        _, grant = h.start()
        ack = progress(h, grant, *range(1, PROGRESS_BATCH_MAX + 1))
        assert ack.acked_seq == ack.stored == PROGRESS_BATCH_MAX

    def test_a_stale_or_made_up_token_is_refused_and_audited(self):
        h = Harness()
        _, grant = h.start()
        with pytest.raises(errors.StaleFencingToken):
            progress(h, grant, 1, token=grant.fencing_token + 7)
        refused_with_audit(h, "stale-fencing-token")
        with pytest.raises(errors.LeaseNotHeld):
            progress(h, grant, 1, holder="intruder")
        refused_with_audit(h, "lease-not-held")
        assert stored_progress(h) == []

    def test_progress_after_the_attempt_settled_is_refused_and_audited(self):
        h = Harness()
        _, grant = h.start()
        h.report(grant)
        with pytest.raises(errors.StaleFencingToken):
            progress(h, grant, 1)
        refused_with_audit(h, "lease-rejected")

    def test_the_holder_still_reports_while_the_run_is_cancelling(self):
        h = Harness()
        _, grant = h.start()
        h.cancel()
        assert h.run.state is RunState.CANCELLING
        assert progress(h, grant, 1).acked_seq == 1

    def test_a_new_attempt_numbers_its_messages_from_one(self):
        h = Harness()
        _, grant = h.start()
        progress(h, grant, 1, 2)
        h.report(grant, AttemptOutcome.FAILED)
        h.advance(3600)
        _, second = h.start()
        assert progress(h, second, 1).acked_seq == 1


# ============================================================================ tool calls


class TestToolCalls:
    def test_the_first_claim_proceeds_a_repeat_is_in_progress_then_gets_the_result(self):
        h = Harness()
        _, grant = h.start()

        first = claim(h, grant)
        assert first.status is ToolCallStatus.PROCEED
        assert claim(h, grant).status is ToolCallStatus.IN_PROGRESS
        done = complete(h, grant)
        assert (done.status, done.result_hash) == (ToolCallStatus.COMPLETED, result())
        again = claim(h, grant)
        assert again == ToolCallClaim(
            first.tool_call_id, "call-1", ToolCallStatus.COMPLETED, result()
        )
        assert complete(h, grant) == done  # the same completion retried: no effect
        assert [e.event_type for e in h.events if e.event_type.startswith("ToolCall")] == [
            "ToolCallClaimed",
            "ToolCallCompleted",
        ]

    def test_a_repeat_claim_changes_nothing(self):
        h = Harness()
        _, grant = h.start()
        claim(h, grant)
        version = h.run.version
        claim(h, grant)
        assert h.batches[-1].empty and h.run.version == version

    def test_the_call_id_is_bound_to_its_request_and_its_result(self):
        h = Harness()
        _, grant = h.start()
        claim(h, grant)
        with pytest.raises(errors.ToolCallConflict):
            claim(h, grant, request_hash=request(2))
        refused_with_audit(h, "tool-call-conflict")
        complete(h, grant)
        with pytest.raises(errors.ToolCallConflict):
            complete(h, grant, result_hash=result(2))
        with pytest.raises(errors.ToolCallNotFound):
            complete(h, grant, call_id="never-claimed")

    def test_a_retried_attempt_gets_the_stored_result_never_proceeds(self):
        h = Harness()
        _, grant = h.start()
        claim(h, grant)
        complete(h, grant)
        h.report(grant, AttemptOutcome.FAILED)
        h.advance(3600)
        _, second = h.start()
        answer = claim(h, second)
        assert (answer.status, answer.result_hash) == (ToolCallStatus.COMPLETED, result())

    def test_an_orphaned_claim_is_closed_by_the_reminder_and_never_executed(self):
        options = Options(lease_seconds=3600)  # the claim, not the lease, is due first
        h = Harness(options=options)
        _, grant = h.start()
        claimed = claim(h, grant)
        call = h.agg.tool_calls["call-1"]
        assert call.expires_at == h.now + timedelta(seconds=CLAIM_TIMEOUT)
        assert h.agg.next_due(options) == call.expires_at

        h.advance(CLAIM_TIMEOUT - 1)
        assert expire_tool_calls(h.agg, h.ctx("reminder")) == 0
        h.advance(1)
        # Due but not yet closed: no result is taken, and a repeat claim is told it expired.
        with pytest.raises(errors.ToolCallExpired):
            complete(h, grant)
        refused_with_audit(h, "tool-call-late-result")
        assert claim(h, grant).status is ToolCallStatus.EXPIRED

        assert expire_tool_calls(h.agg, h.ctx("reminder")) == 1
        h.commit()
        assert call.state is ToolCallState.EXPIRED and call.error
        assert h.events[-1].event_type == "ToolCallExpired"
        assert h.journal[-1].cause == "ClaimTimeout"
        assert h.agg.next_due(options) != call.expires_at
        repeat = claim(h, grant)
        assert (repeat.status, repeat.tool_call_id) == (
            ToolCallStatus.EXPIRED,
            claimed.tool_call_id,
        )
        with pytest.raises(errors.ToolCallExpired):
            complete(h, grant)
        refused_with_audit(h, "tool-call-late-result")

    def test_a_stale_token_is_refused_and_audited(self):
        h = Harness()
        _, grant = h.start()
        with pytest.raises(errors.StaleFencingToken):
            claim(h, grant, token=grant.fencing_token + 1)
        refused_with_audit(h, "stale-fencing-token")
        assert h.agg.tool_calls == {}

    def test_calls_after_the_run_ended_are_refused_and_audited(self):
        h = Harness()
        _, grant = h.start()
        claim(h, grant)
        h.report(grant)
        assert h.run.state is RunState.COMPLETED
        with pytest.raises(errors.RunTerminal):
            claim(h, grant, "call-2")
        refused_with_audit(h, "tool-call-after-run-ended")
        with pytest.raises(errors.RunTerminal):
            complete(h, grant)
        refused_with_audit(h, "tool-call-after-run-ended")
        assert h.agg.tool_calls["call-1"].state is ToolCallState.CLAIMED

    def test_no_new_side_effect_starts_while_the_run_is_cancelling(self):
        h = Harness()
        _, grant = h.start()
        claim(h, grant)
        complete(h, grant)
        h.cancel()
        with pytest.raises(errors.ToolCallRefused):
            claim(h, grant, "call-2")
        refused_with_audit(h, "tool-call-refused")
        assert claim(h, grant).status is ToolCallStatus.COMPLETED  # what happened stays visible

    def test_invalid_hashes_and_call_ids_are_refused_before_anything_changes(self):
        h = Harness()
        _, grant = h.start()
        for bad in (
            lambda: claim(h, grant, request_hash="not-a-hash"),
            lambda: claim(h, grant, call_id=""),
            lambda: claim(h, grant, call_id="x" * 201),
            lambda: complete(h, grant, result_hash="not-a-hash"),
        ):
            with pytest.raises(errors.ValidationFailed):
                bad()
            refused_with_audit(h)


# ============================================================================ machine, errors


@pytest.mark.parametrize(
    ("current", "target"), list(itertools.product(ToolCallState, ToolCallState))
)
def test_tool_call_machine_every_pair_is_legal_or_raises(current, target):
    if (current, target) in TOOL_CALL_TRANSITIONS:
        assert check("ToolCall", TOOL_CALL_TRANSITIONS, current, target)
    else:
        with pytest.raises(errors.IllegalTransition):
            check("ToolCall", TOOL_CALL_TRANSITIONS, current, target)
    assert set(TOOL_CALL_TRANSITIONS) == {
        (ToolCallState.CLAIMED, ToolCallState.COMPLETED),
        (ToolCallState.CLAIMED, ToolCallState.EXPIRED),
    }


@pytest.mark.parametrize(
    ("error", "http", "rpc"),
    [
        (errors.ProgressGap("gap", acked_seq=6), 409, grpc.StatusCode.DATA_LOSS),
        (errors.ToolCallExpired("x"), 410, grpc.StatusCode.FAILED_PRECONDITION),
        (errors.ToolCallConflict("x"), 409, grpc.StatusCode.ALREADY_EXISTS),
        (errors.ToolCallRefused("x"), 409, grpc.StatusCode.FAILED_PRECONDITION),
        (errors.ToolCallNotFound("x"), 404, grpc.StatusCode.NOT_FOUND),
    ],
)
def test_the_new_errors_have_their_statuses(error, http, rpc):
    assert (http_status(error), grpc_status(error)) == (http, rpc)
    assert not error.retryable


def test_an_answer_stored_before_a_field_existed_decodes_with_its_default():
    """An Attempt answer stored before ``progress_seq`` (an upgrade inside the resend window)
    is still answered, not a KeyError."""
    import orjson

    from runcontrol.store import answers

    h = Harness()
    attempt, _ = h.start()
    stored = orjson.loads(orjson.dumps(answers.encode(attempt)))
    del stored["value"]["progress_seq"]
    decoded = answers.decode(stored)
    assert decoded == attempt and decoded.progress_seq == 0
