"""Steps no worker executes (``kind: wait``): a ready wait step starts at once, without an
attempt (it holds no worker), and its timer is the run's durable reminder (``due_at``, in
``next_due``): the sweep wakes the run, from the store, however many hosts died meanwhile, and
the step succeeds once (a Running step moves to Succeeded exactly once, under the run's version
guard). A timer already due when the step starts, or overdue after downtime, fires at the
next wake."""

from __future__ import annotations

from datetime import datetime, timedelta

from .. import events as ev
from ..hashing import canonical_hash
from ..machines import RunCommand, require
from ..model import Step
from ..states import RunState, StepState
from ..workflow import WAIT
from .settlement import Settlement
from .values import CommandContext, Options

TIMER_FIRED = "timer-fired"


class Waits(Settlement):
    def start_wait(self, ctx: CommandContext, step: Step) -> None:
        """A ready wait step starts waiting (the dispatch of a step no worker executes)."""
        require(RunCommand.DISPATCH, self.run.state)
        wait = step.wait or {}
        if "until" in wait:
            due = datetime.fromisoformat(str(wait["until"]))
        else:
            due = ctx.now + timedelta(seconds=float(wait.get("seconds") or 0))
        step.due_at = due
        self._move_step(ctx, step, StepState.RUNNING, "WaitStarted")
        self._emit(
            ctx,
            ev.StepWaiting(run_id=self.run.run_id, step_id=step.step_id, kind=WAIT, until=due),
            step_id=step.step_id,
        )
        if self.run.state is RunState.ACCEPTED:
            self._move_run(ctx, RunState.RUNNING)

    def waiting_steps(self) -> list[Step]:
        return [s for s in self.steps if s.kind == WAIT and s.state is StepState.RUNNING]

    def fire_due_waits(self, ctx: CommandContext, options: Options) -> int:
        """The reminder's part: every waiting step whose timer is due succeeds (once: a
        second wake finds it Succeeded). Answers how many fired."""
        if self.run.state.terminal or self.run.state is RunState.CANCELLING:
            return 0
        fired = 0
        for step in self.waiting_steps():
            if step.due_at is None or step.due_at > ctx.now:
                continue
            step.outcome_hash = canonical_hash(
                {"step": step.name, "firedAt": step.due_at.isoformat()}
            )
            self._emit(
                ctx,
                ev.StepWaitEnded(run_id=self.run.run_id, step_id=step.step_id, cause=TIMER_FIRED),
                step_id=step.step_id,
            )
            self._step_succeeded(ctx, step, "TimerFired")
            fired += 1
        return fired
