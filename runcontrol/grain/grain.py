"""``RunGrain``: one activation of a run, what its handlers share, and the parts of it a
commit's notice reaches (``bus.Committed``)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from ..commands import Command
from ..domain import (
    Attempt,
    CommandContext,
    Event,
    FlowGate,
    PolicyDocument,
    RunAggregate,
    errors,
)
from ..domain.rates import Admission, Draw
from ..domain.replay import Original
from ..domain.run.submission import next_attempt_number, start_ready
from ..domain.templates import Pinned
from ..store import rates, templates
from ..store.commit import Reservation, StoredAnswer
from ..workers.grants import Fused, fuse
from .bus import HANDLERS, Committed, subscribe
from .env import GrainEnv, Turn, log
from .memo import AnswerMemo

T = TypeVar("T")


class RunGrain:
    def __init__(self, env: GrainEnv, tenant_id: str, run_id: UUID) -> None:
        self.env = env
        self.tenant_id = tenant_id
        self.run_id = run_id
        # The cached rows: None until loaded, and while a command decides on them.
        self.agg: RunAggregate | None = None
        self.memo = AnswerMemo(env.store, tenant_id, run_id, env.options.answer_retention_seconds)
        # The concurrency keys (and the tenant's cap) the dispatching statement refused while
        # the current command decides (migration 0017): deciding again, it holds the steps
        # needing them. Emptied when a command starts deciding.
        self.flow_denied: dict[tuple[str, str], dict[str, Any]] = {}
        # The fused grants the command deciding now made (``dispatch_due``): committed with it.
        self.fused: list[Fused] = []
        # Rate reservations made for this run's next dispatches, by (step name, attempt
        # number), until a commit dispatches or holds the step (a lost activation loses them:
        # units taken and not used, never units used twice).
        self.admits: dict[tuple[str, int], Admission] = {}
        # A replay's original run as its commands read it (docs/replay.md): read once (a
        # finished run never changes).
        self.original: Original | None = None
        # While several commands are decided in one turn (``turn.turn``): what they decided,
        # committed together once the last has.
        self.turn: Turn | None = None

    @property
    def active(self) -> bool:
        """False once the cached run is terminal: the host may deactivate it."""
        return self.agg is None or not self.agg.run.state.terminal

    @property
    def cached(self) -> bool:
        """True while the activation holds the run's rows (its commands need no read)."""
        return self.agg is not None

    async def execute(self, command: Command[T]) -> T:
        """Handle one command to its answer (a resend gets the answer stored for its id)."""
        handler = HANDLERS.get(type(command))
        if handler is None:
            raise errors.ValidationFailed(f"{type(command).__name__} is not a grain command")
        if command.tenant_id != self.tenant_id or command.run_id != self.run_id:
            raise errors.ValidationFailed("the command is addressed to another run")
        answer: T = await handler(self, command)
        return answer

    # ------------------------------------------------------------------ the rows

    async def load(self, now: datetime) -> RunAggregate:
        agg, answered = await self.env.store.load(
            self.tenant_id, self.run_id, self.memo.window_start(now)
        )
        self.memo.loaded(answered)
        return agg

    async def load_cached(self) -> RunAggregate:
        if self.agg is None:
            self.agg = await self.load(self.env.clock.now())
        return self.agg

    async def version(self) -> int | None:
        return await self.env.store.run_version(self.tenant_id, self.run_id)

    async def pinned_policy(self) -> PolicyDocument:
        run = (await self.load_cached()).run
        return await self.env.policies.revision(
            self.tenant_id, run.policy.policy_id, run.policy.revision
        )

    async def pinned_template(self) -> Pinned | None:
        """The template version the run was submitted from, with its uses (issue 44)."""
        run = (await self.load_cached()).run
        if run.template_id is None:
            return None
        found = await self.env.store.rows(
            self.tenant_id, templates.PINNED, (run.template_id, run.template_version)
        )
        return templates.pinned(found[0]) if found else None

    async def replay_source(self) -> Original | None:
        """A replay run's original (its journaled calls and approvals), or None."""
        run = (await self.load_cached()).run
        if run.replay_of is None:
            return None
        if self.original is None:
            old, _ = await self.env.store.load(self.tenant_id, run.replay_of, self.env.clock.now())
            calls = old.calls.values()
            self.original = Original.of(old.run, old.steps, calls, old.approvals.values())
        return self.original

    def observe(self, agg: RunAggregate, events: Sequence[Event]) -> None:
        for observer in self.env.observers:
            try:
                observer(agg, events)
            except Exception:  # noqa: BLE001 - an observer never fails a committed command
                log.exception("observer %r failed", observer)

    # ------------------------------------------------------------------ budget and capacity

    def reservation(self, agg: RunAggregate, now: datetime) -> Reservation:
        """A reservation of the run's cost limit, for its accepting or starting statement."""
        amount = agg.run.limits.max_cost_usd or 0.0
        return Reservation(
            self.env.new_id(self.run_id, now), amount, self.env.budget.tenant_limit_usd, now
        )

    @staticmethod
    def records(agg: RunAggregate, reserve: Reservation) -> bool:
        return agg.run.budget_reservation_id == reserve.reservation_id

    @staticmethod
    def release_at(agg: RunAggregate, ctx: CommandContext) -> datetime | None:
        """When the run is terminal, the commit itself releases its reservation (at this time)."""
        if agg.run.state.terminal and agg.run.budget_reservation_id is not None:
            return ctx.now
        return None

    def dispatch_due(self, agg: RunAggregate, ctx: CommandContext) -> Attempt | None:
        """Start every step due now (a graph's fan-out, in one statement: attempts, and the
        timers of wait steps); answer the first attempt. A step needing a concurrency key (or
        a slot of the tenant's cap) the statement refused is held (docs/flow-control.md)."""
        if agg.run.budget_reservation_id is None:
            return None
        gate = FlowGate(self.env.capacity.max_open_attempts_per_tenant, self.flow_denied)
        attempts = start_ready(agg, ctx, gate, self.admits, self.env.options)
        for attempt in attempts:  # each to a credit waiting for its agent, if one is
            self._fuse(agg, ctx, attempt, agg.step(attempt.step_id).agent_id)
        return attempts[0] if attempts else None

    def flow_committed(self, changes: Any) -> None:
        """The commit is in: the holders a ``cancel-oldest`` limit displaces are cancelled."""
        cancel = self.env.cancel_runs
        if cancel is None:
            return
        for run_id, reason in changes.flow_cancel:
            try:
                cancel(self.tenant_id, run_id, reason, self.run_id)
            except Exception:  # noqa: BLE001 - the committed command stands; the audit says
                log.exception("cancelling run %s for cancel-oldest failed", run_id)

    def refused_flow(self, denied: errors.FlowDenied) -> None:
        """The statement refused a slot: decide again holding the steps that need it."""
        found = dict(denied.details)
        key = (str(found.get("name")), str(found.get("key")))
        if key in self.flow_denied:
            raise denied  # refused twice within one command: nothing more to hold
        self.flow_denied[key] = found

    async def reserve_rates(
        self, wanted: Sequence[tuple[str, int, Sequence[Draw]]], now: datetime
    ) -> None:
        """Reserve each wanted dispatch's units (``RatesNeeded``), one short transaction each,
        before the command decides again: a crash before its commit loses only the units."""
        for name, number, draws in wanted:
            self.admits[(name, number)] = await rates.reserve(
                self.env.store, self.tenant_id, draws, now
            )

    def rates_committed(self, agg: RunAggregate) -> None:
        """A commit is in: the reservations it dispatched or recorded on a held step are
        spent; the others (a decision that did not reach the dispatch) wait for the next."""
        if not self.admits:
            return
        spent: set[tuple[str, Any]] = {
            (s.name, n) for s in agg.steps for n in range(1, next_attempt_number(agg, s))
        }
        spent |= {(s.name, s.held.get("attempt")) for s in agg.steps if s.held is not None}
        self.admits = {k: v for k, v in self.admits.items() if k not in spent}

    def _fuse(self, agg: RunAggregate, ctx: CommandContext, attempt: Attempt, agent: str) -> None:
        """Lease the attempt just dispatched to a credit waiting for its agent, in the same
        commit (``runcontrol.workers.grants.fuse``)."""
        fused = fuse(self.env.credits, agg, ctx, attempt, agent, self.env.options)
        if fused is not None:
            self.fused.append(fused)

    def fused_answers(self) -> list[StoredAnswer]:
        return [f.answer for f in self.fused]

    def fused_committed(self) -> None:
        """The command's commit is in: its fused grants go to their sessions."""
        fused, self.fused = self.fused, []
        credits = self.env.credits
        for f in fused:
            self.memo.remember(f.answer)
            if credits is not None:
                credits.granted(f.match, f.grant)

    def fused_dropped(self) -> None:
        """The command decides again, or failed: its fused grants' credits wait again."""
        fused, self.fused = self.fused, []
        credits = self.env.credits
        if credits is not None:
            for f in fused:
                credits.refused(f.match)


# ---------------------------------------------------------------------- after a commit
# What a commit's notice reaches in the activation, in this order.


@subscribe
def remember_answer(grain: RunGrain, notice: Committed) -> None:
    """The exactly-once memo: a resend of the command gets this answer."""
    for _, answer in notice.each:
        grain.memo.remember(answer)


@subscribe
def tell_observers(grain: RunGrain, notice: Committed) -> None:
    grain.observe(notice.run, notice.changes.events)


@subscribe
def hand_over_fused_grants(grain: RunGrain, notice: Committed) -> None:
    grain.fused_committed()


@subscribe
def cancel_displaced_runs(grain: RunGrain, notice: Committed) -> None:
    grain.flow_committed(notice.changes)


@subscribe
def spend_rate_reservations(grain: RunGrain, notice: Committed) -> None:
    grain.rates_committed(notice.run)
