"""In-memory harness for the pure domain: a RunAggregate driven by a fake clock and id source.

Nothing here touches a database, Ray or the network. Time only moves when a test says so
(``Harness.advance``); ids come from a counter; jitter comes from an injected ``uniform``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from runcontrol.domain import (
    Attempt,
    AttemptOutcome,
    AttemptState,
    Changes,
    CommandContext,
    Decision,
    FailureClass,
    LeaseGrant,
    Limits,
    Options,
    PolicyDocument,
    Principal,
    Release,
    Role,
    Submission,
    WorkflowDefinition,
    canonical_hash,
)
from runcontrol.domain.run.approvals import decide_approval, expire_approval, request_approval
from runcontrol.domain.run.cancellation import cancel, enforce_deadlines
from runcontrol.domain.run.children import child_ended, redrive_children
from runcontrol.domain.run.leases import acquire_lease, renew_lease
from runcontrol.domain.run.outcomes import expire_lease, report_outcome
from runcontrol.domain.run.submission import accept_run, dispatch, start_ready

T0 = datetime(2026, 3, 1, 9, 0, 0, tzinfo=UTC)
TENANT = "tenant-a"
PROJECT = "project-a"
REQUESTER = "alice"
RUN_ID = UUID("00000000-0000-4000-8000-00000000f00d")
SNAPSHOT_ID = UUID("00000000-0000-4000-8000-00000000beef")
INPUT = {"repository": "ConnectSoft.CaseManagement", "revision": "a1b2c3d"}

READ_STEP = {"name": "read", "agentId": "reader"}
WRITE_STEP = {"name": "write", "agentId": "writer", "sideEffectClass": "shared-write"}


class Ids:
    """Deterministic id source: UUID(int=1), UUID(int=2), ..."""

    def __init__(self) -> None:
        self.issued = 0

    def __call__(self) -> UUID:
        self.issued += 1
        return UUID(int=self.issued)


@dataclass
class Jitter:
    """Injected ``uniform``: returns ``lo + fraction * (hi - lo)`` and records every call."""

    fraction: float = 0.5
    calls: list[tuple[float, float]] = field(default_factory=list)

    def __call__(self, lo: float, hi: float) -> float:
        self.calls.append((lo, hi))
        return lo + self.fraction * (hi - lo)


def proposal(n: int) -> str:
    return canonical_hash({"proposal": n})


def outcome_hash(n: int) -> str:
    return canonical_hash({"receipt": n})


def make_release(steps: list[dict[str, Any]], workflow_id: str = "wf-assess") -> Release:
    definition = WorkflowDefinition.from_dict({"workflowId": workflow_id, "steps": steps})
    return Release(
        release_id="rel-0001",
        workflow_id=workflow_id,
        content_hash=definition.content_hash,
        definition=definition,
    )


def make_submission(**overrides: Any) -> Submission:
    values: dict[str, Any] = {
        "run_id": RUN_ID,
        "tenant_id": TENANT,
        "project_id": PROJECT,
        "idempotency_key": "idem-1",
        "workflow_id": "wf-assess",
        "model_profile_id": "code-agent",
        "input_hash": canonical_hash(INPUT),
        "snapshot_id": SNAPSHOT_ID,
        "requested_by": REQUESTER,
    }
    values.update(overrides)
    return Submission(**values)


class Harness:
    """One run in memory, with helpers that play the dispatcher, workers and reviewers."""

    def __init__(
        self,
        steps: Iterable[dict[str, Any]] = (READ_STEP,),
        *,
        policy: PolicyDocument | None = None,
        options: Options | None = None,
        jitter: float = 0.5,
        limits: Limits | None = None,
        run_input: dict[str, Any] | None = None,
    ) -> None:
        self.now = T0
        self.ids = Ids()
        self.jitter = Jitter(jitter)
        self.options = options or Options()
        self.policy = policy or PolicyDocument(policy_id="pol-1", revision="7")
        self.release = make_release(list(steps))
        self.events: list[Any] = []
        self.journal: list[Any] = []
        self.batches: list[Changes] = []
        given: dict[str, Any] = {} if limits is None else {"limits": limits}
        if run_input is not None:
            given["input"] = run_input
        submission = make_submission(**given)
        self.agg = accept_run(submission, self.release, self.policy, self.options, self.ctx())
        self.commit()

    # -- plumbing -----------------------------------------------------------------------

    def ctx(self, actor: str = "run-control", *, at: datetime | None = None) -> CommandContext:
        return CommandContext(now=at or self.now, actor=actor, new_id=self.ids, uniform=self.jitter)

    def advance(self, seconds: float) -> datetime:
        self.now = self.now + timedelta(seconds=seconds)
        return self.now

    def commit(self) -> Changes:
        changes = self.agg.take_changes()
        self.batches.append(changes)
        self.events.extend(changes.events)
        self.journal.extend(changes.journal)
        return changes

    def last_event_types(self) -> list[str]:
        """The types of the events the last committed batch recorded, in order."""
        return [e.event_type for e in self.batches[-1].events]

    @property
    def run(self) -> Any:
        return self.agg.run

    def step(self, index: int) -> Any:
        return self.agg.steps[index]

    def event_types(self) -> list[str]:
        return [e.event_type for e in self.events]

    # -- actors -------------------------------------------------------------------------

    def dispatch(self, index: int = 0) -> Attempt:
        attempt = dispatch(self.agg, self.ctx("run-dispatcher"), self.step(index))
        self.commit()
        return attempt

    def lease(self, attempt: Attempt, holder: str = "worker-1") -> LeaseGrant:
        grant = acquire_lease(self.agg, self.ctx(holder), attempt.attempt_id, holder, self.options)
        self.commit()
        return grant

    def start(self, index: int = 0, holder: str = "worker-1") -> tuple[Attempt, LeaseGrant]:
        attempt = self.dispatch(index)
        return attempt, self.lease(attempt, holder)

    def report(
        self,
        grant: LeaseGrant,
        outcome: AttemptOutcome = AttemptOutcome.SUCCEEDED,
        *,
        holder: str | None = None,
        token: int | None = None,
        failure_class: FailureClass | None = None,
        receipt: str | None = "default",
    ) -> Attempt:
        who = holder or grant.holder
        attempt = report_outcome(
            self.agg,
            self.ctx(who),
            grant.attempt_id,
            who,
            grant.fencing_token if token is None else token,
            outcome,
            self.options,
            failure_class=failure_class,
            outcome_hash=outcome_hash(grant.fencing_token) if receipt == "default" else receipt,
        )
        self.commit()
        return attempt

    def request_approval(self, grant: LeaseGrant, proposal_hash: str) -> Any:
        approval = request_approval(
            self.agg,
            self.ctx(grant.holder),
            grant.attempt_id,
            grant.holder,
            grant.fencing_token,
            proposal_hash,
            self.policy,
            self.options,
        )
        self.commit()
        return approval

    def decide(
        self,
        approval: Any,
        subject: str = "rita",
        decision: Decision = Decision.APPROVE,
        *,
        roles: Iterable[Role] = (Role.REVIEWER,),
        version: int | None = None,
        proposal_hash: str | None = None,
        reason: str | None = None,
        tenant: str = TENANT,
    ) -> Any:
        principal = Principal(
            subject=subject, tenant_id=tenant, project_id=PROJECT, roles=frozenset(roles)
        )
        result = decide_approval(
            self.agg,
            self.ctx(subject),
            approval.approval_id,
            principal,
            decision,
            approval.version if version is None else version,
            approval.proposal_hash if proposal_hash is None else proposal_hash,
            reason,
            self.policy,
            self.options,
        )
        self.commit()
        return result

    def expire_lease(self, attempt: Attempt) -> bool:
        done = expire_lease(
            self.agg, self.ctx("lease-expiry-reconciler"), attempt.attempt_id, self.options
        )
        self.commit()
        return done

    def expire_approval(self, approval: Any) -> bool:
        done = expire_approval(
            self.agg,
            self.ctx("approval-expiry-reconciler"),
            approval.approval_id,
            self.policy,
            self.options,
        )
        self.commit()
        return done

    def cancel(self, who: str = REQUESTER, reason: str = "no longer needed") -> bool:
        done = cancel(self.agg, self.ctx(who), who, reason, self.options)
        self.commit()
        return done

    def renew(self, grant: LeaseGrant) -> LeaseGrant:
        renewed = renew_lease(
            self.agg,
            self.ctx(grant.holder),
            grant.attempt_id,
            grant.holder,
            grant.fencing_token,
            self.options,
        )
        self.commit()
        return renewed

    def remind(self) -> str | None:
        """The reminder's deadline check (``WakeRun``)."""
        done = enforce_deadlines(self.agg, self.ctx("reminder"), self.options)
        self.commit()
        return done

    def start_ready(self) -> Changes:
        """The dispatcher: start every step due now (attempts, waits, children, skips)."""
        start_ready(self.agg, self.ctx("run-dispatcher"), options=self.options)
        return self.commit()

    def redrive(self) -> Changes:
        """The reminder's re-drive of open child runs."""
        redrive_children(self.agg, self.ctx("reminder"), self.options)
        return self.commit()

    def child_ended(
        self,
        index: int,
        state: str,
        result: Any = None,
        *,
        child: UUID | None = None,
        failure_class: str | None = None,
    ) -> str:
        """The child run of step ``index`` tells its end (``ChildRunEnded``)."""
        step = self.step(index)
        answer = child_ended(
            self.agg,
            self.ctx("child-run"),
            step.step_id,
            child or UUID(step.child["runId"]),
            state,
            result,
            failure_class,
            None,
            self.options,
        )
        self.commit()
        return answer


# ---------------------------------------------------------------------- shared by the rules' tests

LOCAL_STEP = {"name": "local", "agentId": "editor", "sideEffectClass": "local-write"}
IRREVERSIBLE_STEP = {
    "name": "deploy",
    "agentId": "deployer",
    "sideEffectClass": "external-irreversible",
}
GATED_READ_STEP = {"name": "gated", "agentId": "reader", "gate": "approval"}
NO_APPROVALS = PolicyDocument(policy_id="pol-1", revision="7", approval_required_for=frozenset())

LEASE = Options().lease_seconds
GRACE = Options().renewal_grace_seconds


def assert_refused_cleanly(h: Harness, *audit_kinds: str) -> list:
    """A refused command leaves only the audit records it was asked to keep."""
    audits = h.agg.take_audits()
    assert [a.kind for a in audits] == list(audit_kinds)
    version = h.run.version
    leftover = h.agg.take_changes()
    assert leftover.empty, leftover
    assert not leftover.events and not leftover.journal and not leftover.audits
    assert h.run.version == version
    return audits


def legacy_holder_waiting(h: Harness, attempt: Any) -> None:
    """Put back the state a run written before parking (migration 0011) loads with: the holder
    kept its lease while a human decided."""
    lease = next(
        x
        for b in reversed(h.batches)
        for x in b.leases.values()
        if x.attempt_id == attempt.attempt_id
    )
    lease.released_at = lease.release_cause = None
    attempt.state = AttemptState.LEASED
    h.agg.leases[attempt.attempt_id] = lease


def approval_harness(**kwargs) -> tuple[Harness, object, object, object]:
    h = Harness([WRITE_STEP], **kwargs)
    attempt, grant = h.start(0)
    approval = h.request_approval(grant, proposal(1))
    return h, attempt, grant, approval
