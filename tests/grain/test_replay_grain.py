"""A replay run through real grains and PostgreSQL (docs/replay.md): a new run of the release an
alias names now with the finished run's input, marked ``replay_of``; its journaled calls
answered from the original's journal when the step name, call name, occurrence and arguments
agree, refused otherwise; no side effect claimed; an approval the original approved for an
equal proposal reused, another parked (or refused by option); listed apart; no concurrency key
taken; its report."""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

import pytest
from grain_harness import SHARED, Harness, operator, outcome_hash
from support import SyncGrain, decide, fenced, proposal, request_approval
from test_flow_control import APPLY, held, publish, slots, submit

from runcontrol.commands import ClaimToolCall, RecordCall, ReplayRun
from runcontrol.domain import ApprovalState, LeaseGrant, RunState, StepSpec, errors
from runcontrol.domain.replay import ReplayApprovals
from runcontrol.store import replays
from runcontrol.store.queries.runs import list_runs
from runcontrol.store.tables import journaled_calls, tool_calls

H1, H2 = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def call(h: Harness, grant: LeaseGrant, occurrence: int, request_hash: str | None, **kw: Any):
    return RecordCall(
        **fenced(grant, h.tenant),
        name="model",
        occurrence=occurrence,
        request_hash=request_hash,
        **kw,
    )


def replay(h: Harness, of: UUID, **options: Any) -> SyncGrain:
    grain = h.grain(uuid.uuid4())
    grain.execute(
        ReplayRun(
            tenant_id=h.tenant,
            run_id=grain.run_id,
            principal=operator(h),
            reason="before moving latest",
            replay_of=of,
            **options,
        )
    )
    return grain


def original_with_calls(h: Harness) -> SyncGrain:
    """A finished run whose step recorded two model calls (with their arguments' hashes)."""
    grain, grant = h.start_run(StepSpec("s", "agent-a"))
    grain.execute(call(h, grant, 1, H1, value={"answer": 1}))
    grain.execute(call(h, grant, 2, H2, value={"answer": 2}))
    h.succeed(grain, grant)
    assert h.load(grain.run_id).run.state is RunState.COMPLETED
    return grain


def test_a_replay_answers_the_original_s_calls_and_refuses_any_other(h: Harness):
    original = original_with_calls(h)
    release = h.publish(StepSpec("s", "agent-a"))  # release 2: what `latest` names now
    grain = replay(h, original.run_id)
    run = h.load(grain.run_id).run
    assert (run.replay_of, run.release_id, run.input) == (
        original.run_id,
        release.release_id,
        h.load(original.run_id).run.input,
    )
    grant = h.lease(grain)
    assert grant.replay == "refuse"
    answer = grain.execute(call(h, grant, 1, H1, read_only=True))
    assert (answer.recorded, answer.value_json) == (False, '{"answer":1}')
    (copied,) = h.rows(journaled_calls, grain.run_id)
    assert (copied.request_hash, copied.value_json) == (H1, '{"answer":1}')
    with pytest.raises(errors.ReplayDiverged) as other:  # the same call, other arguments
        grain.execute(call(h, grant, 2, H1, read_only=True))
    assert other.value.details["why"] == "other-arguments"
    with pytest.raises(errors.ReplayDiverged) as never:
        grain.execute(call(h, grant, 3, H1, read_only=True))
    assert never.value.details["why"] == "not-in-original"
    with pytest.raises(errors.ReplayDiverged):  # a side effect is never claimed
        grain.execute(ClaimToolCall(**fenced(grant, h.tenant), call_id="push", request_hash=H1))
    assert h.rows(tool_calls, grain.run_id) == []
    # Made live (liveCalls): recorded as the replay's own, and reported as not the original's.
    grain.execute(call(h, grant, 2, H1, value={"answer": "other"}))
    h.succeed(grain, grant, n=2)
    with h.db.tenant(h.tenant) as conn:
        found = replays.replay_report(conn, grain.run_id)
        listed = {
            mode: {r["runId"] for r in list_runs(conn, project_id=None, replays=mode)[0]}
            for mode in ("exclude", "only", "include")
        }
    assert found["diverged"] and found["replayState"] == "Completed"
    (step,) = found["steps"]
    assert (step["equal"], step["originalHash"], step["replayHash"]) == (
        False,
        outcome_hash(1),
        outcome_hash(2),
    )
    assert [(c["name"], c["occurrence"]) for c in found["callsNotInOriginal"]] == [("model", 2)]
    assert found["originalCallsNotMade"] == []
    ids = {str(original.run_id), str(grain.run_id)}
    assert listed["exclude"] & ids == {str(original.run_id)}
    assert listed["only"] & ids == {str(grain.run_id)}
    assert listed["include"] & ids == ids


def test_an_approval_the_original_approved_is_reused_another_waits_or_fails(h: Harness):
    h.publish(StepSpec("write", "agent-a", side_effect_class=SHARED))
    original, _ = h.submit()
    grant = h.lease(original)
    asked = request_approval(original, grant, 1)
    assert asked is not None and asked.state is ApprovalState.PENDING
    decide(original, asked, h.reviewer())
    grant = h.lease(original)
    h.succeed(original, grant)

    grain = replay(h, original.run_id)
    grant = h.lease(grain)
    reused = request_approval(grain, grant, 1)
    assert reused is not None and reused.state is ApprovalState.APPROVED
    assert reused.decided_by == f"replay:{original.run_id}"
    assert h.load(grain.run_id).run.state is RunState.RUNNING
    changed = request_approval(grain, grant, 2)  # a proposal the original never had
    assert changed is not None and changed.state is ApprovalState.PENDING

    strict = replay(h, original.run_id, approvals=ReplayApprovals.FAIL)
    grant = h.lease(strict)
    with pytest.raises(errors.ReplayDiverged):
        request_approval(strict, grant, 2)
    assert proposal(2) not in {a.proposal_hash for a in h.load(strict.run_id).approvals.values()}


def test_a_replay_takes_no_concurrency_key(h: Harness):
    publish(h, APPLY)  # one run per repository at a time
    done = submit(h, "r")
    h.succeed(done, h.lease(done))
    busy = submit(h, "r")  # holds the repository's key
    assert held(h, busy) is None and held(h, submit(h, "r")) is not None  # the next one waits
    grain = replay(h, done.run_id)
    assert held(h, grain) is None
    assert h.open_attempt(grain.run_id) is not None  # dispatched beside the key's holder
    assert {s.run_id for s in slots(h)} == {busy.run_id}
