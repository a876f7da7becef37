"""Approvals: a request bound to its proposal hash, the attempt parked while a human decides,
the decision (separation of duties, quorum, break-glass) and the expiry actions
(invariant 7)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import UUID

from .. import errors, templates
from .. import events as ev
from ..decisions import bound_to, outside_rule
from ..hashing import canonical_hash, is_hash
from ..machines import (
    RunCommand,
    require,
)
from ..model import (
    ApprovalDecision,
    ApprovalRequest,
    Attempt,
    Step,
)
from ..replay import REPLAY_DECIDER, Original, ReplayApprovals, ReplayOptions, original_approval
from ..states import (
    ApprovalState,
    AttemptState,
    Decision,
    ExpiryAction,
    FailureClass,
    RunState,
    SideEffectClass,
)
from ..templates import Pinned
from ..workflow import PolicyDocument
from .core import RunAggregate
from .leases import full_term, held_lease, refused, release_lease
from .settlement import emit_approval_decided, fail_run
from .values import (
    APPROVAL_EXPIRY,
    CommandContext,
    Options,
    Principal,
)


def request_approval(
    agg: RunAggregate,
    ctx: CommandContext,
    attempt_id: UUID,
    holder: str,
    fencing_token: int,
    proposal_hash: str,
    policy: PolicyDocument,
    options: Options,
    *,
    action_class: SideEffectClass | None = None,
    lease_id: UUID | None = None,
    proposal: Any = None,
    template: Pinned | None = None,
    replay: Original | None = None,
) -> ApprovalRequest | None:
    """Open (or return) the approval for this exact proposal; None if policy needs none. A
    run submitted from a template whose pre-approval covers it is approved at once by the
    template (``pre_approve``); otherwise it waits for a human."""
    if not is_hash(proposal_hash):
        raise errors.ValidationFailed("proposalHash must be a sha256 canonical hash")
    if proposal is not None and canonical_hash(proposal) != proposal_hash:
        raise errors.ValidationFailed("the proposal does not hash to proposalHash")
    attempt = agg.attempt(attempt_id)
    if attempt.state.terminal:
        raise refused(
            agg,
            ctx,
            "stale-fencing-token",
            errors.StaleFencingToken("the attempt is settled; this lease is stale"),
            attempt_id,
            holder,
            fencing_token=fencing_token,
            reason=f"attempt settled as {attempt.state}",
        )
    held_lease(agg, ctx, attempt, holder, fencing_token, options, lease_id)
    require(RunCommand.REQUEST_APPROVAL, agg.run.state)
    step = agg.step(attempt.step_id)
    action = action_class or step.side_effect_class
    if not policy.needs_approval(action, step.gate):
        return None
    same_step = [a for a in agg.approvals.values() if a.step_id == step.step_id]
    for existing in same_step:
        if existing.proposal_hash == proposal_hash and existing.state in (
            ApprovalState.PENDING,
            ApprovalState.APPROVED,
        ):
            # The same proposal asked again: the same request. Approved: the holder goes
            # on to execute. Pending: the attempt parks until the decision.
            if existing.state is ApprovalState.PENDING:
                _park(agg, ctx, attempt, existing)
            return existing
    for existing in same_step:
        if existing.state is ApprovalState.PENDING:
            # Invariant 7: a regenerated proposal makes the pending request Stale.
            agg.move_approval(ctx, existing, ApprovalState.STALE, "ProposalChanged")
            existing.reason = "proposal regenerated"
            emit_approval_decided(agg, ctx, existing)
    reused = None if replay is None else original_approval(replay, step.name, proposal_hash)
    fails = ReplayOptions.from_dict(agg.run.replay).approvals is ReplayApprovals.FAIL
    if replay is not None and reused is None and fails:
        raise errors.ReplayDiverged(
            f"the original run never had this proposal of step {step.name!r} approved",
            step=step.name,
            why="approval-changed",
        )
    approval = _open_approval(agg, ctx, step, attempt_id, action, proposal_hash, policy, options)
    if template is not None and pre_approve(agg, ctx, approval, template, proposal):
        return approval
    if replay is not None and reused is not None:
        vote = agg.new(
            ApprovalDecision,
            approval_id=approval.approval_id,
            decided_by=f"{REPLAY_DECIDER}{replay.run_id}",
            decision=Decision.APPROVE,
            proposal_hash=proposal_hash,
            reason=f"the original run's decision (by {reused.decided_by}), the proposal equal",
            break_glass=False,
            decided_at=ctx.now,
        )
        _finish_approval(agg, ctx, approval, ApprovalState.APPROVED, "ReplayedFromOriginal", vote)
        return approval
    if agg.run.state is RunState.RUNNING:
        agg.move_run(ctx, RunState.WAITING_FOR_APPROVAL)
    _park(agg, ctx, attempt, approval)
    return approval


def _open_approval(
    agg: RunAggregate,
    ctx: CommandContext,
    step: Step,
    attempt_id: UUID,
    action: SideEffectClass,
    proposal_hash: str,
    policy: PolicyDocument,
    options: Options,
) -> ApprovalRequest:
    expiry_hours = policy.expiry_hours or options.approval_expiry_hours
    approval = agg.new(
        ApprovalRequest,
        approval_id=ctx.new_id(),
        step_id=step.step_id,
        attempt_id=attempt_id,
        action_class=action,
        proposal_hash=proposal_hash,
        policy_revision=agg.run.policy_revision,
        approver_rule=policy.approver_rule,
        required_approvals=max(policy.required_approvals, 1),
        requested_by=agg.run.requested_by,
        created_at=ctx.now,
        expires_at=ctx.now + timedelta(hours=expiry_hours),
    )
    agg.journal(
        ctx,
        "ApprovalRequest",
        approval.approval_id,
        None,
        ApprovalState.PENDING,
        "ApprovalRequested",
    )
    agg.record(ctx, ev.ApprovalRequested, approval)
    return approval


def pre_approve(
    agg: RunAggregate,
    ctx: CommandContext,
    approval: ApprovalRequest,
    pinned: Pinned,
    proposal: Any,
) -> bool:
    """Decide the request at once as Approved by the run's template if one of its
    pre-approvals covers it (``templates.pre_approval``: Active, unexpired, under its uses,
    the proposal inside its constraint, the requester neither its author nor its approver).
    Audited like a human decision: the vote (``decidedBy: template:{id}@{version}``, its
    approver named), the journal entry and the event, in this transaction; the vote names
    its pre-approval, whose use the statement writing it counts (refused past its maxUses:
    ``errors.PreApprovalUsedUp``, and the request is decided again on fresh uses)."""
    t = pinned.template
    found = templates.pre_approval(
        t, pinned.uses, approval.action_class, proposal, agg.run.requested_by, ctx.now
    )
    if isinstance(found, str):
        agg.audit(
            ctx,
            "template-pre-approval-declined",
            approval_id=approval.approval_id,
            template=t.reference,
            reason=found,
        )
        return False
    index, pre = found
    vote = agg.new(
        ApprovalDecision,
        approval_id=approval.approval_id,
        decided_by=t.reference,
        decision=Decision.APPROVE,
        proposal_hash=approval.proposal_hash,
        reason=f"pre-approved by {t.reference}, approved by {t.decided_by} ({pre.approver_role})",
        break_glass=False,
        decided_at=ctx.now,
        pre_approval=index,
    )
    agg.audit(
        ctx,
        "template-pre-approval",
        approval_id=approval.approval_id,
        template=t.reference,
        approver=t.decided_by,
        pre_approval=index,
        use=templates.used(pinned.uses, index) + 1,
    )
    _finish_approval(agg, ctx, approval, ApprovalState.APPROVED, "PreApprovedByTemplate", vote)
    return True


def _park(
    agg: RunAggregate, ctx: CommandContext, attempt: Attempt, approval: ApprovalRequest
) -> None:
    """A human's wait holds no worker: the lease is released (its holder's later reports
    are refused as stale) and the attempt waits, unclaimable, for the decision."""
    lease = release_lease(agg, ctx, attempt, "ParkedForApproval")
    agg.move_attempt(ctx, attempt, AttemptState.PARKED, "ParkedForApproval")
    agg.record(
        ctx,
        ev.AttemptParked,
        attempt,
        approval_id=approval.approval_id,
        lease_id=lease.lease_id if lease else None,
        fencing_token=lease.fencing_token if lease else None,
        holder=lease.holder if lease else None,
    )


def _resume_parked(
    agg: RunAggregate, ctx: CommandContext, attempt: Attempt, approval: ApprovalRequest
) -> None:
    """After the decision any worker may claim the attempt again (a new lease, a new
    fencing token); an approval's grant carries the approved proposal hash."""
    agg.move_attempt(ctx, attempt, AttemptState.DISPATCHED, "ApprovalDecided")
    attempt.dispatched_at = ctx.now
    agg.record(
        ctx,
        ev.AttemptResumed,
        attempt,
        agg.step(attempt.step_id),
        approval,
        approval_state=approval.state,
        attempt_number=attempt.number,
    )


def _may_decide(
    agg: RunAggregate,
    ctx: CommandContext,
    approval: ApprovalRequest,
    principal: Principal,
    version: int,
    proposal_hash: str,
    reason: str | None,
    policy: PolicyDocument,
) -> bool:
    """Refuse a decision this request cannot take (gone, decided, the requester, outside the
    approver rule, another version or proposal); answer whether it is a break-glass one."""
    if approval.state is ApprovalState.EXPIRED:
        raise errors.ApprovalGone(f"the approval request is {approval.state}", gone="expired")
    if approval.state is ApprovalState.STALE:
        raise errors.ApprovalGone(f"the approval request is {approval.state}", gone="stale")
    if approval.state.terminal:
        raise errors.ApprovalAlreadyDecided(f"the approval request is {approval.state}")
    if ctx.now >= approval.expires_at:
        raise errors.ApprovalGone("the approval request expired", gone="expired")
    if principal.subject == agg.run.requested_by:
        raise errors.SeparationOfDuties("the requester of a run may never decide its approvals")
    break_glass = outside_rule(
        policy.may_decide(principal.subject, principal.roles),
        principal.roles,
        reason,
        f"deciding needs to match the rule: {approval.approver_rule}",
    )
    bound_to(version, approval.version, proposal_hash, approval.proposal_hash, "approval")
    return break_glass


def decide_approval(
    agg: RunAggregate,
    ctx: CommandContext,
    approval_id: UUID,
    principal: Principal,
    decision: Decision,
    version: int,
    proposal_hash: str,
    reason: str | None,
    policy: PolicyDocument,
    options: Options,
) -> ApprovalRequest:
    approval = agg.approval(approval_id)
    if principal.tenant_id != agg.run.tenant_id:
        raise errors.ApprovalNotFound("approval not found")  # never reveal other tenants
    try:
        break_glass = _may_decide(
            agg, ctx, approval, principal, version, proposal_hash, reason, policy
        )
    except errors.RunControlError as refusal:
        # Audited like every refused decision: a bulk decision's refused items leave the
        # same trail as one refused call.
        agg.audit(
            ctx,
            "approval-decision-refused",
            approval_id=approval_id,
            decided_by=principal.subject,
            code=refusal.code,
            message=str(refusal),
        )
        raise
    if any(v.decided_by == principal.subject for v in agg.decisions.get(approval_id, ())):
        raise errors.ApprovalAlreadyDecided("this approver already decided")
    vote = agg.new(
        ApprovalDecision,
        approval_id=approval_id,
        decided_by=principal.subject,
        decision=decision,
        proposal_hash=proposal_hash,
        reason=reason,
        break_glass=break_glass,
        decided_at=ctx.now,
    )
    if break_glass:
        agg.audit(
            ctx,
            "break-glass-decision",
            approval_id=approval_id,
            decision=str(decision),
            reason=reason,
        )
    approvals = sum(1 for v in agg.decisions[approval_id] if v.decision is Decision.APPROVE)
    if decision is Decision.APPROVE and (break_glass or approvals >= approval.required_approvals):
        _finish_approval(agg, ctx, approval, ApprovalState.APPROVED, "Approve", vote)
        _resume_after_approval(agg, ctx, approval, options)
    elif decision is Decision.REJECT:
        _finish_approval(agg, ctx, approval, ApprovalState.REJECTED, "Reject", vote)
        fail_run(
            agg,
            ctx,
            FailureClass.POLICY_DENIED,
            f"approval rejected: {reason or 'no reason given'}",
            cause="ApprovalRejected",
        )
    elif decision is Decision.REQUEST_CHANGES:
        # The proposal must be regenerated: the request goes Stale, the worker resumes.
        _finish_approval(agg, ctx, approval, ApprovalState.STALE, "ChangesRequested", vote)
        _resume_after_approval(agg, ctx, approval, options)
    else:
        approval.version += 1  # a vote short of quorum: still Pending, new version
        agg.changed(approval)
        agg.touch(ctx)
    return approval


def _finish_approval(
    agg: RunAggregate,
    ctx: CommandContext,
    approval: ApprovalRequest,
    target: ApprovalState,
    cause: str,
    vote: ApprovalDecision,
) -> None:
    agg.move_approval(ctx, approval, target, cause)
    approval.decided_by = vote.decided_by
    approval.decided_at = vote.decided_at
    approval.reason = vote.reason
    emit_approval_decided(agg, ctx, approval)


def _resume_after_approval(
    agg: RunAggregate, ctx: CommandContext, approval: ApprovalRequest, options: Options
) -> None:
    if agg.run.state is RunState.WAITING_FOR_APPROVAL and not agg.pending_approvals():
        cause = (
            "ApprovalGranted" if approval.state is ApprovalState.APPROVED else "ChangesRequested"
        )
        agg.move_run(ctx, RunState.RUNNING, cause)
    attempt = agg.attempts.get(approval.attempt_id)
    if (
        attempt is not None
        and attempt.state is AttemptState.PARKED
        and agg.run.state is RunState.RUNNING
    ):
        _resume_parked(agg, ctx, attempt, approval)
    lease = agg.leases.get(approval.attempt_id)
    if lease is not None:
        # The lease was suspended while a human decided: give the holder a full term.
        full_term(agg, ctx, lease, options)


def expire_approval(
    agg: RunAggregate,
    ctx: CommandContext,
    approval_id: UUID,
    policy: PolicyDocument,
    options: Options,
) -> bool:
    """ApprovalExpiryReconciler: a Pending request past expiresAt gets its policy's expiry
    action (the run's pinned policy revision): ``fail`` (Expired, run Failed),
    ``reject`` (Rejected, run Failed policy-denied), ``auto-approve`` (Approved, the
    attempt resumes), ``re-request`` (Expired and asked again, up to
    ``maxReRequests`` times, then ``fail``). Each is audited as the reconciler's act."""
    approval = agg.approvals.get(approval_id)
    if approval is None or approval.state is not ApprovalState.PENDING:
        return False
    if ctx.now < approval.expires_at:
        return False
    action = policy.expiry_action
    if action is ExpiryAction.RE_REQUEST and _re_requests(agg, approval) >= (
        policy.max_re_requests
    ):
        action = ExpiryAction.FAIL
    agg.audit(ctx, "approval-expired", approval_id=approval_id, action=str(action))
    approval.decided_at = ctx.now
    approval.decided_by = APPROVAL_EXPIRY
    if action is ExpiryAction.AUTO_APPROVE:
        approval.reason = "expired without a decision: approved by policy"
        agg.move_approval(ctx, approval, ApprovalState.APPROVED, "ExpiryReminder")
        emit_approval_decided(agg, ctx, approval)
        _resume_after_approval(agg, ctx, approval, options)
        return True
    if action is ExpiryAction.REJECT:
        approval.reason = "expired without a decision: rejected by policy"
        agg.move_approval(ctx, approval, ApprovalState.REJECTED, "ExpiryReminder")
        emit_approval_decided(agg, ctx, approval)
        if agg.run.state is RunState.WAITING_FOR_APPROVAL:
            fail_run(
                agg,
                ctx,
                FailureClass.POLICY_DENIED,
                "approval expired; the policy rejects it",
                cause="ApprovalExpired",
            )
        return True
    approval.reason = "expired without a decision"
    agg.move_approval(ctx, approval, ApprovalState.EXPIRED, "ExpiryReminder")
    emit_approval_decided(agg, ctx, approval)
    if agg.run.state is not RunState.WAITING_FOR_APPROVAL:
        return True
    if action is ExpiryAction.RE_REQUEST:
        _open_approval(
            agg,
            ctx,
            agg.step(approval.step_id),
            approval.attempt_id,
            approval.action_class,
            approval.proposal_hash,
            policy,
            options,
        )
        return True
    fail_run(agg, ctx, FailureClass.CANCELLATION, "approval expired", cause="ApprovalExpired")
    return True


def _re_requests(agg: RunAggregate, approval: ApprovalRequest) -> int:
    """How many times this attempt's proposal was asked again after an expiry."""
    return sum(
        1
        for a in agg.approvals.values()
        if a.attempt_id == approval.attempt_id
        and a.proposal_hash == approval.proposal_hash
        and a.state is ApprovalState.EXPIRED
    )
