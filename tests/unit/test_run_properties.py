"""Random command sequences against one RunAggregate: the invariants hold after every command.

Each example plays dispatcher, workers (honest, stale and intruding), reviewers (including the
requester and a break-glass admin), both reconcilers, a canceller and the clock, in a random
order. Refused commands must leave nothing behind but their audit records.
"""

from __future__ import annotations

import itertools

from domain_harness import READ_STEP, REQUESTER, WRITE_STEP, Harness, proposal
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from runcontrol.domain import (
    ApprovalState,
    AttemptOutcome,
    AttemptState,
    Decision,
    ExpiryAction,
    FailureClass,
    Options,
    PolicyDocument,
    Principal,
    Role,
    RunState,
    SideEffectClass,
    StepState,
    errors,
)
from runcontrol.domain.machines import (
    APPROVAL_TRANSITIONS,
    ATTEMPT_TRANSITIONS,
    RUN_TRANSITIONS,
    STEP_TRANSITIONS,
)
from runcontrol.domain.run import APPROVAL_EXPIRY, cancellation, submission
from runcontrol.domain.run.approvals import decide_approval, expire_approval, request_approval
from runcontrol.domain.run.leases import acquire_lease, renew_lease
from runcontrol.domain.run.outcomes import expire_lease, report_outcome
from runcontrol.domain.run.submission import dispatchable_step

LOCAL_STEP = {"name": "local", "agentId": "editor", "sideEffectClass": "local-write"}
TABLES = {
    "Run": RUN_TRANSITIONS,
    "Step": STEP_TRANSITIONS,
    "Attempt": ATTEMPT_TRANSITIONS,
    "ApprovalRequest": APPROVAL_TRANSITIONS,
}
WORKERS = ["worker-1", "worker-2"]
REVIEWERS = [
    ("rita", frozenset({Role.REVIEWER}), None),
    ("sam", frozenset({Role.WORKSPACE_ADMIN}), None),
    (REQUESTER, frozenset({Role.REVIEWER, Role.PLATFORM_ADMIN}), "mine"),
    ("root", frozenset({Role.PLATFORM_ADMIN}), "incident"),
    ("root", frozenset({Role.PLATFORM_ADMIN}), None),
    ("olga", frozenset({Role.OBSERVER}), None),
]
# Refusals of a (would-be) lease holder's command that must leave an audit record.
AUDITED_REFUSALS = (
    errors.StaleFencingToken,
    errors.LeaseNotHeld,
    errors.LeaseExpired,
    errors.OutcomeAlreadyRecorded,
)

# Who acts on the current attempt: mostly its lease holder, sometimes someone else.
actor = st.sampled_from(["holder", "holder", "holder", "holder", "worker-1", "worker-2"])

dispatch = st.tuples(st.just("dispatch"))
lease = st.tuples(st.just("lease"), st.sampled_from(WORKERS))
report = st.tuples(
    st.just("report"),
    actor,
    st.sampled_from(
        [
            AttemptOutcome.SUCCEEDED,
            AttemptOutcome.SUCCEEDED,
            AttemptOutcome.FAILED,
            AttemptOutcome.UNCERTAIN,
            AttemptOutcome.CANCELLED,
        ]
    ),
    st.sampled_from([None, FailureClass.TRANSIENT, FailureClass.PERMANENT]),
    st.sampled_from([0, 0, 0, 0, -1, 1]),  # token offset: mostly the real one
)
renew = st.tuples(st.just("renew"), actor, st.sampled_from([0, 0, -1]))
ask = st.tuples(st.just("approval"), actor, st.integers(1, 3))
decide = st.tuples(
    st.just("decide"),
    st.sampled_from([0, 0, 1, 1, 2, 3, 4, 5]),
    st.sampled_from(
        [Decision.APPROVE, Decision.APPROVE, Decision.REJECT, Decision.REQUEST_CHANGES]
    ),
    st.sampled_from([0, 0, 0, 1]),  # version offset
    st.sampled_from([True, True, True, False]),  # use the request's own proposal hash
)
tick = st.tuples(st.just("tick"), st.sampled_from([1, 1, 30, 30, 120, 151, 151, 3600, 3 * 86400]))
expire_leases = st.tuples(st.just("expire-leases"))
expire_approvals = st.tuples(st.just("expire-approvals"))
cancel = st.tuples(st.just("cancel"))

# Weighted: progress-making commands are drawn more often than disruptive ones. A cancel is
# inserted at most once per plan (see ``plans``), or it would end nearly every walk early.
progress = st.tuples(st.just("progress"))

actions = st.one_of(
    *[progress] * 8,
    dispatch,
    lease,
    lease,
    report,
    report,
    ask,
    decide,
    decide,
    renew,
    tick,
    expire_leases,
    expire_approvals,
)


plans = st.tuples(
    st.lists(actions, min_size=10, max_size=60),
    st.one_of(st.none(), st.none(), st.none(), st.floats(min_value=0.0, max_value=1.0)),
).map(
    lambda p: (
        p[0]
        if p[1] is None
        else [*p[0][: int(p[1] * len(p[0]))], ("cancel",), *p[0][int(p[1] * len(p[0])) :]]
    )
)


class Walk:
    def __init__(self, steps, policy, options):
        self.h = Harness(steps, policy=policy, options=options)
        self.grants = {}  # attempt_id -> latest LeaseGrant seen by a worker
        self.tokens_granted = []
        self.pins = _pins(self.h.run)

    def _who(self, attempt, who):
        if who != "holder":
            return who
        grant = self.grants.get(attempt.attempt_id)
        return grant.holder if grant else "worker-1"

    def _current_attempt(self):
        open_ = self.h.agg.open_attempts()
        if open_:
            return open_[0]
        if self.h.agg.attempts:
            return max(self.h.agg.attempts.values(), key=lambda a: a.dispatched_at)
        return None

    def _holder(self, worker, offset=0):
        """(the attempt in flight, who sends for it, the fencing token it sends), or None."""
        attempt = self._current_attempt()
        if attempt is None:
            return None
        grant = self.grants.get(attempt.attempt_id)
        return attempt, self._who(attempt, worker), (grant.fencing_token if grant else 1) + offset

    def _progress(self):
        """The natural next command of an honest run: what a healthy system would do."""
        h = self.h
        if dispatchable_step(h.agg, h.now) is not None:
            return ("dispatch",)
        if h.run.state is RunState.WAITING_FOR_APPROVAL:
            (pending,) = h.agg.pending_approvals()
            voted = {v.decided_by for v in h.agg.decisions.get(pending.approval_id, [])}
            reviewer = 0 if "rita" not in voted else 1  # quorum needs a second approver
            return ("decide", reviewer, Decision.APPROVE, 0, True)
        attempt = self._current_attempt()
        if attempt is None or attempt.state.terminal:
            return ("tick", 30)  # a backoff to wait out
        if attempt.state is AttemptState.DISPATCHED:
            return ("lease", "worker-1")
        step = h.agg.step(attempt.step_id)
        approved = any(
            a.attempt_id == attempt.attempt_id and a.state is ApprovalState.APPROVED
            for a in h.agg.approvals.values()
        )
        if (
            h.run.state is RunState.RUNNING
            and h.policy.needs_approval(step.side_effect_class, step.gate)
            and not approved
        ):
            return ("approval", "holder", 1 + len(h.agg.approvals))
        return ("report", "holder", AttemptOutcome.SUCCEEDED, None, 0)

    def apply(self, action):
        h = self.h
        kind = action[0]
        if kind == "progress":
            action = self._progress()
            kind = action[0]
        if kind == "dispatch":
            step = dispatchable_step(h.agg, h.now)
            if step is not None:
                submission.dispatch(h.agg, h.ctx("run-dispatcher"), step)
            else:
                # Try to dispatch the in-flight or first step anyway: must be refused.
                target = next((s for s in h.agg.steps if not s.state.terminal), h.agg.steps[0])
                submission.dispatch(h.agg, h.ctx("run-dispatcher"), target)
        elif kind == "lease":
            attempt = self._current_attempt()
            if attempt is None:
                return
            before = attempt.state
            grant = acquire_lease(h.agg, h.ctx(action[1]), attempt.attempt_id, action[1], h.options)
            if before is AttemptState.DISPATCHED:
                self.tokens_granted.append(grant.fencing_token)
            self.grants[attempt.attempt_id] = grant
        elif kind == "report":
            _, worker, outcome, failure, offset = action
            if (held := self._holder(worker, offset)) is None:
                return
            attempt, worker, token = held
            report_outcome(
                h.agg,
                h.ctx(worker),
                attempt.attempt_id,
                worker,
                token,
                outcome,
                h.options,
                failure_class=failure,
            )
        elif kind == "renew":
            _, worker, offset = action
            if (held := self._holder(worker, offset)) is None:
                return
            attempt, worker, token = held
            renew_lease(h.agg, h.ctx(worker), attempt.attempt_id, worker, token, h.options)
        elif kind == "approval":
            _, worker, n = action
            if (held := self._holder(worker)) is None:
                return
            attempt, worker, token = held
            request_approval(
                h.agg,
                h.ctx(worker),
                attempt.attempt_id,
                worker,
                token,
                proposal(n),
                h.policy,
                h.options,
            )
        elif kind == "decide":
            _, who, decision, version_offset, own_hash = action
            if not h.agg.approvals:
                return
            approval = max(h.agg.approvals.values(), key=lambda a: a.created_at)
            subject, roles, reason = REVIEWERS[who]
            decide_approval(
                h.agg,
                h.ctx(subject),
                approval.approval_id,
                Principal(subject, h.run.tenant_id, h.run.project_id, roles),
                decision,
                approval.version + version_offset,
                approval.proposal_hash if own_hash else proposal(99),
                reason,
                h.policy,
                h.options,
            )
        elif kind == "tick":
            h.advance(action[1])
        elif kind == "expire-leases":
            for attempt_id in list(h.agg.leases):
                expire_lease(h.agg, h.ctx("lease-expiry-reconciler"), attempt_id, h.options)
        elif kind == "expire-approvals":
            for approval_id in list(h.agg.approvals):
                expire_approval(
                    h.agg, h.ctx("approval-expiry-reconciler"), approval_id, h.policy, h.options
                )
        elif kind == "cancel":
            cancellation.cancel(h.agg, h.ctx(REQUESTER), REQUESTER, "walk cancelled")

    def run(self, action):
        h = self.h
        seq, jseq, version = h.run.event_seq, h.run.journal_seq, h.run.version
        snapshot = _snapshot(h)
        try:
            self.apply(action)
        except errors.RunControlError as exc:
            audits = h.agg.take_audits()
            leftover = h.agg.take_changes()
            # Validation before mutation: a refusal leaves the aggregate as it was ...
            assert leftover.empty, (action, exc, leftover)
            assert (h.run.event_seq, h.run.journal_seq, h.run.version) == (seq, jseq, version)
            assert _snapshot(h) == snapshot, (action, exc)
            # ... except for the evidence of a refused lease holder (invariant 5).
            if isinstance(exc, AUDITED_REFUSALS):
                assert audits, (action, exc)
            return
        h.commit()

    # ------------------------------------------------------------------ invariants

    def check(self):
        h = self.h
        agg = h.agg
        # 2: what the run was pinned to at acceptance never changes (the store refuses it too:
        # tests/store/test_writers.py).
        assert _pins(h.run) == self.pins
        # 11: gap-free per-run event sequence; the journal likewise.
        assert [e.seq for e in h.events] == list(range(1, len(h.events) + 1))
        assert [j.sequence for j in h.journal] == list(range(1, len(h.journal) + 1))
        # Every journalled move is legal in its machine.
        for entry in h.journal:
            if entry.from_state is not None:
                assert (entry.from_state, entry.to_state) in TABLES[entry.entity], entry
        # Run states seen by the journal chain together.
        run_moves = [j for j in h.journal if j.entity == "Run"]
        for prev, nxt in itertools.pairwise(run_moves):
            assert prev.to_state == nxt.from_state
        assert run_moves[-1].to_state == h.run.state
        # 4: at most one non-terminal attempt per step, and steps run in order.
        for step in agg.steps:
            open_ = [a for a in agg.attempts_of(step) if not a.state.terminal]
            assert len(open_) <= 1
            assert [a.number for a in agg.attempts_of(step)] == list(
                range(1, len(agg.attempts_of(step)) + 1)
            )
            assert len(agg.attempts_of(step)) <= step.max_attempts
        in_flight = [s for s in agg.steps if s.state is StepState.RUNNING]
        assert len(in_flight) <= 1
        # 5: exactly one current lease per leased attempt; tokens strictly increase.
        for attempt in agg.attempts.values():
            assert (attempt.state is AttemptState.LEASED) == (attempt.attempt_id in agg.leases)
        assert self.tokens_granted == sorted(set(self.tokens_granted))
        # 6: no attempt after an Uncertain one on a side-effecting step.
        for step in agg.steps:
            if step.side_effect_class.at_least(SideEffectClass.SHARED_WRITE):
                numbers = [a.number for a in agg.attempts_of(step)]
                uncertain = [
                    a.number for a in agg.attempts_of(step) if a.state is AttemptState.UNCERTAIN
                ]
                if uncertain:
                    assert max(numbers) == min(uncertain)
        # 7: WaitingForApproval exactly when a request is pending; at most one pending per step.
        pending = agg.pending_approvals()
        assert (h.run.state is RunState.WAITING_FOR_APPROVAL) == bool(pending)
        assert len({a.step_id for a in pending}) == len(pending)
        for approval in agg.approvals.values():
            if approval.state is ApprovalState.APPROVED:
                votes = agg.decisions.get(approval.approval_id, [])
                if not votes:  # only the policy's auto-approval on expiry approves alone
                    assert h.policy.expiry_action is ExpiryAction.AUTO_APPROVE
                    assert approval.decided_by == APPROVAL_EXPIRY
                    assert approval.decided_at >= approval.expires_at
                assert all(v.decided_by != REQUESTER for v in votes)
                # One decision per decider (a second is 409), each on the approved proposal.
                assert len({v.decided_by for v in votes}) == len(votes), votes
                assert all(v.proposal_hash == approval.proposal_hash for v in votes), votes
                assert all(v.proposal_hash == approval.proposal_hash for v in votes)
        # A human's wait holds no lease: a parked attempt is one with a pending request.
        parked = {a.attempt_id for a in agg.attempts.values() if a.state is AttemptState.PARKED}
        assert parked == {a.attempt_id for a in pending}
        # 8 and terminal runs: nothing left open.
        if h.run.state.terminal:
            assert not agg.open_attempts()
            assert not pending
            assert not agg.leases
            assert all(s.state.terminal for s in agg.steps)
        if h.run.state is RunState.COMPLETED:
            assert all(s.state is StepState.SUCCEEDED for s in agg.steps)
        if h.run.state is RunState.CANCELLED:
            assert agg.intents
        if h.run.state in (RunState.ACCEPTED,):
            assert not agg.attempts


def _pins(run):
    return (run.release, run.policy, run.model_profile_id, run.snapshot_id)


def _snapshot(h):
    agg = h.agg
    return (
        h.run.state,
        h.run.fencing_seq,
        tuple((s.step_id, s.state, s.not_before) for s in agg.steps),
        tuple(sorted((str(a.attempt_id), a.state, a.outcome) for a in agg.attempts.values())),
        tuple(sorted((str(k), v.expires_at, v.fencing_token) for k, v in agg.leases.items())),
        tuple(sorted((str(a.approval_id), a.state, a.version) for a in agg.approvals.values())),
        sum(len(v) for v in agg.decisions.values()),
        len(agg.intents),
    )


SCENARIOS = {
    "read-write": ([READ_STEP, WRITE_STEP], PolicyDocument("pol-1", "7")),
    "quorum": (
        [WRITE_STEP, LOCAL_STEP],
        PolicyDocument("pol-1", "8", required_approvals=2, expiry_hours=1),
    ),
    "no-approvals": (
        [WRITE_STEP, READ_STEP],
        PolicyDocument("pol-1", "9", approval_required_for=frozenset()),
    ),
    # Each expiry action (the others expire with the default, fail).
    **{
        f"expiry-{action}": (
            [WRITE_STEP, LOCAL_STEP],
            PolicyDocument("pol-1", "10", expiry_hours=1, expiry_action=action, max_re_requests=2),
        )
        for action in ExpiryAction
        if action is not ExpiryAction.FAIL
    },
}


@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    scenario=st.sampled_from(sorted(SCENARIOS)),
    max_attempts=st.integers(1, 3),
    plan=plans,
)
def test_invariants_hold_under_random_command_sequences(scenario, max_attempts, plan):
    steps, policy = SCENARIOS[scenario]
    walk = Walk(steps, policy, Options(default_max_attempts=max_attempts))
    walk.check()
    for action in plan:
        walk.run(action)
        walk.check()
    event(f"final state: {walk.h.run.state}")
    for approval in walk.h.agg.approvals.values():
        event(f"approval: {approval.state}")


@settings(max_examples=60, deadline=None)
@given(plan=plans)
def test_runs_reach_a_terminal_state_when_driven_to_the_end(plan):
    """After any prefix, an honest worker, an approving reviewer and time finish the run."""
    steps, policy = SCENARIOS["read-write"]
    walk = Walk(steps, policy, Options())
    for action in plan:
        walk.run(action)
    h = walk.h
    for _ in range(60):
        if h.run.state.terminal:
            break
        h.advance(3 * 86400)  # let every lease, backoff and approval run out
        walk.run(("expire-leases",))
        walk.run(("expire-approvals",))
        walk.run(("dispatch",))
        walk.run(("lease", "worker-1"))
        walk.run(("report", "holder", AttemptOutcome.SUCCEEDED, None, 0))
        walk.check()
    assert h.run.state.terminal
    walk.check()
    # The run ends with its terminal event last.
    assert h.events[-1].event_type in {"RunCompleted", "RunFailed", "RunCancelled"}
