"""Every event a real run emits matches the JSON Schema generated from its event class.

Runs are driven through the grain (real Postgres) until every event type has been committed;
each stored outbox row is then checked against ``payload_schemas()``: its payload, its topic
and its schema version. A payload key added, dropped or retyped in ``domain/events.py`` without
the stored form following (or the reverse) fails here.
"""

from __future__ import annotations

import uuid

from grain_harness import REQUESTER, SHARED, Harness, control
from jsonschema import Draft202012Validator
from support import WORKER, cancel, decide, fenced, proposal, report

from runcontrol.commands import (
    ChildRunEnded,
    ClaimToolCall,
    CompleteToolCall,
    ConsumeRateLimit,
    HandBackAttempt,
    RecordCall,
    ReportProgress,
    RequestApproval,
    RerunRun,
    ResolveAttempt,
    ResumeRun,
    RetryStep,
    SendSignal,
    SettleRestoredLeases,
    SuspendRun,
)
from runcontrol.domain import (
    AttemptOutcome,
    Decision,
    FailureClass,
    ProgressMessage,
    StepSpec,
    canonical_hash,
)
from runcontrol.domain.events import EVENT_TYPES, payload_schemas
from runcontrol.ports.policy import DEFAULT_POLICY_ID, document_from_dict
from runcontrol.store.tables import outbox, runs

SCHEMAS = payload_schemas()
VALIDATORS = {
    name: Draft202012Validator(entry["payload"], format_checker=Draft202012Validator.FORMAT_CHECKER)
    for name, entry in SCHEMAS.items()
}


def approved_run_with_progress_and_a_tool_call(h: Harness) -> None:
    """Accepted, dispatched, leased; progress; a journaled call; a tool call claimed and
    completed; an approval requested, the attempt parked, approved and resumed; completed."""
    h.publish(StepSpec("write", "agent-a", side_effect_class=SHARED), workflow_id="gated")
    grain, _ = h.submit(h.request(workflow_id="gated"))
    grant = h.lease(grain)
    grain.execute(
        ReportProgress(
            **fenced(grant, h.tenant), messages=(ProgressMessage(1, "half", {"pct": 50}),)
        )
    )
    grain.execute(
        RecordCall(**fenced(grant, h.tenant), name="plan", occurrence=1, value={"plan": "A"})
    )
    request_hash = canonical_hash({"tool": "open-pr"})
    grain.execute(ClaimToolCall(**fenced(grant, h.tenant), call_id="c1", request_hash=request_hash))
    grain.execute(
        CompleteToolCall(
            **fenced(grant, h.tenant), call_id="c1", result_hash=canonical_hash({"pr": 1})
        )
    )
    approval = grain.execute(RequestApproval(**fenced(grant, h.tenant), proposal_hash=proposal()))
    assert approval is not None
    decide(grain, approval, h.reviewer(), Decision.APPROVE)
    h.succeed(grain, h.lease(grain))


def retried_suspended_and_cancelled_run(h: Harness) -> None:
    """A failure retried after backoff, a lease expired, an operator's retry, suspension and
    resumption; then cancelled while leased, Cancelled once the holder reports."""
    h.publish(StepSpec("read", "agent-a", max_attempts=5), workflow_id="retried")
    grain, _ = h.submit(h.request(workflow_id="retried"))
    report(grain, h.lease(grain), AttemptOutcome.FAILED, failure_class=FailureClass.TRANSIENT)
    h.clock.advance(600)
    h.wake(grain)  # the retry is due: dispatched
    h.lease(grain)
    h.clock.advance(3600)
    h.wake(grain)  # the lease expired: TimedOut, retry scheduled
    step_id = h.load(grain.run_id).steps[0].step_id
    control(h, grain, RetryStep, step_id=step_id)
    control(h, grain, SuspendRun)
    control(h, grain, ResumeRun)
    grant = h.lease(grain)
    cancel(grain, "stop", requested_by=REQUESTER)
    report(grain, grant, AttemptOutcome.CANCELLED)


def restored_resolved_and_rerun(h: Harness) -> None:
    """A lease revoked after a restore (Uncertain, the run Failed), the attempt resolved by an
    operator, and the finished run rerun."""
    h.publish(StepSpec("write", "agent-b", side_effect_class=SHARED), workflow_id="restored")
    grain, _ = h.submit(h.request(workflow_id="restored"))
    grant = h.lease(grain)
    grain.execute(SettleRestoredLeases(tenant_id=grain.tenant_id, run_id=grain.run_id))
    control(h, grain, ResolveAttempt, attempt_id=grant.attempt_id, outcome=AttemptOutcome.FAILED)
    rerun = h.grain(uuid.uuid4())
    control(h, rerun, RerunRun, rerun_of=grain.run_id)


def expired_tool_call(h: Harness) -> None:
    """A claim with no result past its timeout: closed by the reminder."""
    h.publish(StepSpec("read", "agent-c", max_attempts=1), workflow_id="orphan")
    grain, _ = h.submit(h.request(workflow_id="orphan"))
    grant = h.lease(grain)
    grain.execute(
        ClaimToolCall(
            **fenced(grant, h.tenant), call_id="c2", request_hash=canonical_hash({"n": 2})
        )
    )
    h.clock.advance(3600)
    h.wake(grain)  # the claim and the lease expire; the run fails (one attempt allowed)


def waited_and_signalled_run(h: Harness) -> None:
    """A signal sent before its step waits (kept), a timer that fires, the kept signal
    delivered when its step starts (issue 22)."""
    h.publish(
        StepSpec("plan", "agent-d"),
        StepSpec("pause", "", kind="wait", seconds=30.0),
        StepSpec("go", "", kind="signal", signal="go"),
        workflow_id="waited",
    )
    grain, _ = h.submit(h.request(workflow_id="waited"))
    grain.execute(
        SendSignal(
            tenant_id=grain.tenant_id, run_id=grain.run_id, name="go", body={"ok": 1}, sent_by="c"
        )
    )
    h.succeed(grain, h.lease(grain))
    h.clock.advance(30)
    h.wake(grain)  # the timer fires; the signal step starts and takes the kept signal


def consumed_a_named_rate_limit(h: Harness) -> None:
    """A lease holder reports the units of a named rate limit it used, then hands back."""
    limits = {"rateLimits": {"named": {"model-tokens": {"perSecond": 100, "burst": 100}}}}
    h.c.policies.publish(h.tenant, document_from_dict(DEFAULT_POLICY_ID, "", limits), h.clock.now())
    h.publish(StepSpec("gen", "agent-a"), workflow_id="rated")
    grain, _ = h.submit(h.request(workflow_id="rated"))
    grant = h.lease(grain)
    grain.execute(ConsumeRateLimit(**fenced(grant, h.tenant), name="model-tokens", units=12))
    # ... and then gives the attempt back (LeaseHandedBack)
    grain.execute(HandBackAttempt(**fenced(grant, h.tenant), reason="worker going away"))


def child_run_and_a_skipped_step(h: Harness) -> None:
    """A step skipped by its condition; a run step's child started and its end reported."""
    h.publish(
        StepSpec("skipped", "", kind="wait", seconds=0, when="input.never == true"),
        StepSpec("delegate", "", kind="run", depends_on=(), child_workflow_id="other"),
        workflow_id="parent",
    )
    grain, _ = h.submit(h.request(workflow_id="parent"))
    step = h.load(grain.run_id).steps[1]
    assert step.child is not None
    grain.execute(
        ChildRunEnded(
            tenant_id=h.tenant,
            run_id=grain.run_id,
            step_id=step.step_id,
            child_run_id=uuid.UUID(step.child["runId"]),
            state="Completed",
            result={"ok": True},
        )
    )


def test_every_emitted_event_matches_its_generated_schema(h: Harness) -> None:
    child_run_and_a_skipped_step(h)
    waited_and_signalled_run(h)
    approved_run_with_progress_and_a_tool_call(h)
    retried_suspended_and_cancelled_run(h)
    restored_resolved_and_rerun(h)
    expired_tool_call(h)
    consumed_a_named_rate_limit(h)

    with h.db.tenant(h.tenant) as conn:
        run_ids = [r.run_id for r in conn.execute(runs.select())]
    rows = [row for run_id in run_ids for row in h.rows(outbox, run_id, outbox.c.seq)]
    seen: set[str] = set()
    for row in rows:
        entry = SCHEMAS[row.event_type]
        assert (row.topic, row.schema_version) == (entry["topic"], entry["schemaVersion"])
        errors = [e.message for e in VALIDATORS[row.event_type].iter_errors(row.payload)]
        assert not errors, f"{row.event_type} seq {row.seq}: {errors} in {row.payload}"
        seen.add(row.event_type)
    assert seen == set(EVENT_TYPES), f"never emitted: {sorted(set(EVENT_TYPES) - seen)}"


def test_a_schema_refuses_a_payload_that_drifted() -> None:
    """The schemas are strict: a missing key, an extra key and a wrong type are each refused."""
    validator = VALIDATORS["LeaseExpired"]
    good = {
        "attemptId": "8d6c8c1e-7f55-4a3e-9d55-0d6f9f1f2a10",
        "leaseId": "0d6f9f1f-2a10-4a3e-9d55-8d6c8c1e7f55",
        "holder": WORKER,
        "fencingToken": 3,
    }
    assert validator.is_valid(good)
    assert not validator.is_valid({k: v for k, v in good.items() if k != "holder"})
    assert not validator.is_valid({**good, "runId": good["attemptId"]})
    assert not validator.is_valid({**good, "fencingToken": "3"})
