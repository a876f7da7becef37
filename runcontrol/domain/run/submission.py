"""Submission and dispatch: accepting a run (invariants 1 and 2), its budget reservation,
and dispatching its next step as an attempt (invariant 4)."""

from __future__ import annotations

from datetime import datetime
from typing import Self
from uuid import UUID

from .. import errors
from .. import events as ev
from ..hashing import is_hash
from ..machines import (
    RunCommand,
    allows,
    require,
)
from ..model import (
    Attempt,
    PolicyRef,
    ReleaseRef,
    Run,
    Step,
)
from ..states import (
    AttemptState,
    FailureClass,
    RunState,
    StepState,
)
from ..workflow import AGENT, PolicyDocument, Release, dependencies
from .values import (
    CommandContext,
    Options,
    Submission,
)
from .waits import Waits


class Submissions(Waits):
    @classmethod
    def accept(
        cls,
        submission: Submission,
        release: Release,
        policy: PolicyDocument,
        options: Options,
        ctx: CommandContext,
    ) -> Self:
        if not is_hash(submission.input_hash):
            raise errors.ValidationFailed("inputHash must be a sha256 canonical hash")
        if release.workflow_id != submission.workflow_id:
            raise errors.ValidationFailed("release does not belong to the submitted workflow")
        limits = submission.limits
        run = Run(
            run_id=submission.run_id,
            tenant_id=submission.tenant_id,
            project_id=submission.project_id,
            environment_id=submission.environment_id,
            idempotency_key=submission.idempotency_key,
            workflow_id=submission.workflow_id,
            release=ReleaseRef(release.release_id, release.content_hash),
            policy=PolicyRef(policy.policy_id, policy.revision),
            model_profile_id=submission.model_profile_id,
            state=RunState.ACCEPTED,
            input_hash=submission.input_hash,
            snapshot_id=submission.snapshot_id,
            requested_by=submission.requested_by,
            created_at=ctx.now,
            updated_at=ctx.now,
            limits=limits,  # limits.max_minutes runs from the first lease grant (deadline_at)
            correlation_id=submission.correlation_id,
            input=submission.input,
        )
        steps = [
            Step(
                step_id=ctx.new_id(),
                run_id=run.run_id,
                tenant_id=run.tenant_id,
                ordinal=i + 1,
                name=spec.name,
                agent_id=spec.agent_id,
                skill_id=spec.skill_id,
                state=StepState.PENDING,
                max_attempts=spec.max_attempts or options.default_max_attempts,
                gate=spec.gate,
                side_effect_class=spec.side_effect_class,
                depends_on=list(dependencies(release.definition.steps, spec.name)),
                kind=spec.kind,
                wait=spec.wait,
            )
            for i, spec in enumerate(release.definition.steps)
        ]
        agg = cls(run, steps, is_new=True)
        for step in steps:
            agg._changes.steps[step.step_id] = step
        agg._journal(ctx, "Run", run.run_id, None, RunState.ACCEPTED, "SubmitRun")
        agg._emit(
            ctx,
            ev.RunAccepted(
                run_id=run.run_id,
                tenant_id=run.tenant_id,
                project_id=run.project_id,
                workflow_id=run.workflow_id,
                release_id=run.release_id,
                policy_revision=run.policy_revision,
                model_profile_id=run.model_profile_id,
                requested_by=run.requested_by,
            ),
        )
        return agg

    def assert_same_submission(self, input_hash: str) -> None:
        """Invariant 1: same key + same canonical input -> same run; otherwise a conflict."""
        if input_hash != self.run.input_hash:
            raise errors.IdempotencyConflict(
                "this Idempotency-Key was used with a different payload",
                run_id=str(self.run.run_id),
            )

    def record_budget_reservation(self, reservation_id: UUID) -> None:
        self.run.budget_reservation_id = reservation_id
        self._changes.run_dirty = True

    def deny_budget(self, ctx: CommandContext, reason: str) -> None:
        self._fail_run(ctx, FailureClass.POLICY_DENIED, reason, cause="BudgetReservationDenied")

    def dispatchable_steps(self, now: datetime) -> list[Step]:
        """The steps to dispatch now (a fan-out is several), if the run may dispatch at all:
        invariant 4 holds per run (no dispatch while WaitingForApproval or Cancelling) and
        per step (a ready step is Pending, so it has no open attempt)."""
        if not allows(RunCommand.DISPATCH, self.run.state):
            return []
        if self.run.suspended_at is not None:
            return []  # an operator suspended the run: nothing new starts
        return [s for s in self.ready_steps() if s.not_before is None or s.not_before <= now]

    def dispatchable_step(self, now: datetime) -> Step | None:
        """The first of ``dispatchable_steps`` (in the release's order), or None."""
        steps = self.dispatchable_steps(now)
        return steps[0] if steps else None

    def start_ready(self, ctx: CommandContext) -> list[Attempt]:
        """Start every step due now, together: an agent step as a dispatched attempt, a wait
        step as its timer (no attempt). Answers the attempts, in the release's order."""
        attempts = []
        ready = self.dispatchable_steps(ctx.now)
        while ready:  # a wait that ends as it starts (a kept signal) readies the next ones
            for step in ready:
                if step.kind == AGENT:
                    attempts.append(self.dispatch(ctx, step))
                else:
                    self.start_wait(ctx, step)
            ready = self.dispatchable_steps(ctx.now)
        return attempts

    def dispatch(self, ctx: CommandContext, step: Step) -> Attempt:
        require(RunCommand.DISPATCH, self.run.state)
        if step.kind != AGENT:
            raise errors.IllegalTransition(
                f"a {step.kind} step has no attempt: no worker executes it",
                step_id=str(step.step_id),
            )
        if any(not a.state.terminal for a in self.attempts_of(step)):
            raise errors.IllegalTransition(
                "a step may have only one non-terminal attempt", step_id=str(step.step_id)
            )
        previous = self.attempts_of(step)
        attempt = Attempt(
            attempt_id=ctx.new_id(),
            step_id=step.step_id,
            run_id=self.run.run_id,
            tenant_id=self.run.tenant_id,
            number=len(previous) + 1,
            state=AttemptState.DISPATCHED,
            dispatched_at=ctx.now,
        )
        self._move_step(ctx, step, StepState.RUNNING, "AttemptDispatched")
        step.not_before = None
        self.attempts[attempt.attempt_id] = attempt
        self._changes.attempts[attempt.attempt_id] = attempt
        self._journal(
            ctx, "Attempt", attempt.attempt_id, None, AttemptState.DISPATCHED, "RunDispatcher"
        )
        # Dispatch is pull-based: the lease and its fencing token are granted when a worker
        # claims the attempt (LeaseGranted), so they are null here.
        self._emit(
            ctx,
            ev.AttemptDispatched(
                run_id=self.run.run_id,
                step_id=step.step_id,
                attempt_id=attempt.attempt_id,
                agent_id=step.agent_id,
                skill_id=step.skill_id,
                attempt_number=attempt.number,
            ),
            step_id=step.step_id,
            attempt_id=attempt.attempt_id,
        )
        if self.run.state is RunState.ACCEPTED:
            self._move_run(ctx, RunState.RUNNING)
        return attempt
