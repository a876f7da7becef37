"""The run's state as data (``RunAggregate``): the entities it holds, what a command records
(changed rows, events, journal entries, audits), the guarded moves of each state machine, and
the queries every concern shares. The rules are functions over it, in the concern modules
beside this one; none of them keeps state of its own."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import fields, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any
from uuid import UUID

from .. import errors, flow
from .. import events as ev
from ..hashing import result_hash
from ..machines import (
    APPROVAL_TRANSITIONS,
    ATTEMPT_TRANSITIONS,
    RUN_TRANSITIONS,
    STEP_TRANSITIONS,
    TOOL_CALL_TRANSITIONS,
    check,
)
from ..model import (
    ApprovalDecision,
    ApprovalRequest,
    Attempt,
    AttemptResult,
    AuditRecord,
    CancellationIntent,
    Event,
    JournaledCall,
    Lease,
    RecoveryJournalEntry,
    Run,
    Step,
    ToolCall,
)
from ..replay import replay_mode
from ..states import (
    ApprovalState,
    AttemptOutcome,
    AttemptState,
    RunState,
    StepState,
    ToolCallState,
)
from ..workflow import RUN, dependencies, dependency_map, final_step
from .changes import Changes, ChildCall, HeldRow, NewRow
from .values import (
    LIFETIME_EXCEEDED,
    WALL_CLOCK_EXCEEDED,
    CommandContext,
    LeaseGrant,
    Options,
)

_RUN_IDS = ("run_id", "tenant_id")
_FIELDS: dict[type[ev.EventBody], tuple[tuple[str, ...], tuple[str, ...]]] = {}


def _fields_of(kind: type[ev.EventBody]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The run's ids ``kind`` has, and its other fields."""
    found = _FIELDS.get(kind)
    if found is None:
        names = [f.name for f in fields(kind)]
        ids = tuple(n for n in names if n in _RUN_IDS)
        found = _FIELDS[kind] = (ids, tuple(n for n in names if n not in _RUN_IDS))
    return found


_NONE: Any = object()  # no such attribute


def _first(sources: tuple[Any, ...], name: str, default: Any = _NONE) -> Any:
    """The attribute ``name`` of the first of ``sources`` that has one (else ``default``)."""
    for source in sources:
        value = getattr(source, name, _NONE)
        if value is not _NONE:
            return value
    return default


def _missing(error: type[errors.NotFound], entity: str, row_id: UUID) -> errors.NotFound:
    """The ``error`` that the run has no ``entity`` ``row_id``."""
    return error(f"{entity} {row_id} not found", **{f"{entity}_id": str(row_id)})


class RunAggregate:
    """One run's state as data: its entities, what the current command recorded (changed
    rows, events, journal entries, audits), the guarded moves of its state machines and the
    queries every concern shares. The rules are functions over it, one module per concern."""

    def __init__(
        self,
        run: Run,
        steps: Iterable[Step],
        attempts: Iterable[Attempt] = (),
        leases: Iterable[Lease] = (),
        approvals: Iterable[ApprovalRequest] = (),
        decisions: Iterable[ApprovalDecision] = (),
        intents: Iterable[CancellationIntent] = (),
        tool_calls: Iterable[ToolCall] = (),
        results: Iterable[AttemptResult] = (),
        calls: Iterable[JournaledCall] = (),
        *,
        is_new: bool = False,
    ) -> None:
        self.run = run
        self.steps: list[Step] = sorted(steps, key=lambda s: s.ordinal)
        self.attempts: dict[UUID, Attempt] = {a.attempt_id: a for a in attempts}
        self.leases: dict[UUID, Lease] = {}
        for lease in leases:
            if lease.current:
                self.leases[lease.attempt_id] = lease
        self.approvals: dict[UUID, ApprovalRequest] = {a.approval_id: a for a in approvals}
        self.decisions: dict[UUID, list[ApprovalDecision]] = {}
        for d in decisions:
            self.decisions.setdefault(d.approval_id, []).append(d)
        self.intents: list[CancellationIntent] = sorted(intents, key=lambda i: i.requested_at)
        self.tool_calls: dict[str, ToolCall] = {t.call_id: t for t in tool_calls}
        # attempt -> its stored result: kept in the cache so a grant reads no row
        self.results: dict[UUID, AttemptResult] = {r.attempt_id: r for r in results}
        # (step, name, occurrence) -> the journaled call's stored value: a grant reads no row
        self.calls: dict[tuple[UUID, str, int], JournaledCall] = {c.key: c for c in calls}
        self._is_new = is_new
        self.changes = self._fresh_changes()
        # step id -> the steps it waits for (``dependencies_of``), made on first use: a run's
        # steps and what each waits for never change once accepted, only their states do
        self._waits_for: dict[UUID, list[Step]] | None = None
        self._run_text = str(run.run_id)  # every event's default correlation id

    def _fresh_changes(self) -> Changes:
        expected = None if self._is_new else self.run.version
        return Changes(run=self.run, expected_version=expected, run_dirty=self._is_new)

    def take_changes(self) -> Changes:
        """Hand the pending writes to the unit of work and start a new batch."""
        changes = self.changes
        if changes.run_dirty and not self._is_new:
            self.run.version += 1
        self._is_new = False
        self.changes = self._fresh_changes()
        return changes

    def take_audits(self) -> list[AuditRecord]:
        audits, self.changes.audits = self.changes.audits, []
        return audits

    def touch(self, ctx: CommandContext) -> None:
        self.run.updated_at = ctx.now
        self.run_changed()

    def run_changed(self) -> None:
        """The run's row is written by this command (without a new ``updated_at``)."""
        self.changes.run_dirty = True

    def changed(self, row: Step | Attempt | Lease | ApprovalRequest | ToolCall) -> None:
        """``row``, one the run holds, is written by this command."""
        match row:
            case Step():
                self.changes.steps[row.step_id] = row
            case Attempt():
                self.changes.attempts[row.attempt_id] = row
            case Lease():
                self.changes.leases[row.lease_id] = row
            case ApprovalRequest():
                self.changes.approvals[row.approval_id] = row
            case ToolCall():
                self.changes.tool_calls[row.tool_call_id] = row

    def add(self, row: NewRow) -> None:
        """``row`` is new: the run holds it from now on, and this command writes it."""
        match row:
            case Attempt():
                self.attempts[row.attempt_id] = row
            case Lease():
                self.leases[row.attempt_id] = row
            case ApprovalRequest():
                self.approvals[row.approval_id] = row
            case ToolCall():
                self.tool_calls[row.call_id] = row
            case JournaledCall():
                self.calls[row.key] = row
                self.changes.calls.append(row)
                return
            case ApprovalDecision():
                self.decisions.setdefault(row.approval_id, []).append(row)
                self.changes.decisions.append(row)
                return
            case CancellationIntent():
                self.intents.append(row)
                self.changes.intents.append(row)
                return
            case AttemptResult():
                self.results[row.attempt_id] = row
                self.changes.results.append(row)
                return
        self.changed(row)

    def new(self, kind: type[HeldRow], /, **values: Any) -> HeldRow:
        """A new row of this run (its ``run_id`` and ``tenant_id`` the run's, the rest
        ``values``), ``add``ed."""
        row = kind(run_id=self.run.run_id, tenant_id=self.run.tenant_id, **values)
        self.add(row)
        return row

    def want_slot(self, slot: dict[str, Any]) -> None:
        """The dispatch needs ``slot`` of a flow key (the statement admits or refuses it)."""
        self.changes.flow.append(slot)

    def queue_for_slot(self, place: dict[str, Any]) -> None:
        """A held step's ``place`` in its flow key's queue."""
        self.changes.flow_wait.append(place)

    def cancel_holders(self, run_ids: Iterable[UUID], reason: str) -> None:
        """The runs holding a key this run waits for are cancelled after the commit."""
        self.changes.flow_cancel.extend((run_id, reason) for run_id in run_ids)

    def ask_child(self, call: ChildCall) -> None:
        """Send ``call`` to its child run once this command commits."""
        self.changes.child_calls.append(call)

    def record(
        self, ctx: CommandContext, kind: type[ev.EventBody], /, *about: Any, **payload: Any
    ) -> None:
        """Record an event of type ``kind`` as the run's next. Its ``run_id`` and ``tenant_id``
        are the run's; a field ``payload`` does not give is the attribute of that name of the
        first of ``about`` (what the event is about: its attempt, step, approval, lease...)
        that has one. The envelope names the step and attempt it is about."""
        ids, rest = _fields_of(kind)
        for name in ids:
            if name not in payload:
                payload[name] = getattr(self.run, name)
        for name in rest:
            if name not in payload:
                for source in about:
                    value = getattr(source, name, _NONE)
                    if value is not _NONE:
                        payload[name] = value
                        break
        step_id, attempt_id = _first(about, "step_id", None), _first(about, "attempt_id", None)
        self.emit(ctx, kind(**payload), step_id=step_id, attempt_id=attempt_id)

    def emit(
        self,
        ctx: CommandContext,
        body: ev.EventBody,
        *,
        step_id: UUID | None = None,
        attempt_id: UUID | None = None,
    ) -> None:
        """Record ``body`` as the run's next event (its stored payload made once, here). The
        envelope names the step and attempt the body names, unless told otherwise."""
        if step_id is None:
            step_id = getattr(body, "step_id", None)
        if attempt_id is None:
            attempt_id = getattr(body, "attempt_id", None)
        self.run.event_seq += 1
        self.touch(ctx)
        self.changes.events.append(
            Event(
                event_id=ctx.new_id(),
                run_id=self.run.run_id,
                tenant_id=self.run.tenant_id,
                project_id=self.run.project_id,
                seq=self.run.event_seq,
                event_type=type(body).__name__,
                topic=body.topic,
                payload=body.to_payload(),
                schema_version=body.schema_version,
                body=body,
                occurred_at=ctx.now,
                step_id=step_id,
                attempt_id=attempt_id,
                correlation_id=self.run.correlation_id or self._run_text,
                causation_id=ctx.command_id,
            )
        )

    def journal(
        self,
        ctx: CommandContext,
        entity: str,
        entity_id: UUID,
        from_state: str | None,
        to_state: str,
        cause: str,
    ) -> None:
        self.run.journal_seq += 1
        self.touch(ctx)
        self.changes.journal.append(
            RecoveryJournalEntry(
                run_id=self.run.run_id,
                tenant_id=self.run.tenant_id,
                sequence=self.run.journal_seq,
                entity=entity,
                entity_id=entity_id,
                from_state=from_state,
                to_state=to_state,
                cause=cause,
                actor=ctx.actor,
                occurred_at=ctx.now,
            )
        )

    def audit(self, ctx: CommandContext, kind: str, **detail: Any) -> None:
        self.changes.audits.append(
            AuditRecord(
                tenant_id=self.run.tenant_id,
                run_id=self.run.run_id,
                kind=kind,
                actor=ctx.actor,
                detail={k: (str(v) if isinstance(v, UUID) else v) for k, v in detail.items()},
                occurred_at=ctx.now,
            )
        )

    def move_run(self, ctx: CommandContext, target: RunState, cause: str | None = None) -> None:
        current = self.run.state
        spec_cause = check("Run", RUN_TRANSITIONS, current, target)
        self.run.state = target
        if target.terminal:
            self.run.suspended_at = None  # a suspension ends with the run
        self.journal(ctx, "Run", self.run.run_id, current, target, cause or spec_cause)
        self.record(
            ctx, ev.RunStateChanged, from_state=current, to_state=target, cause=cause or spec_cause
        )

    def move_step(self, ctx: CommandContext, step: Step, target: StepState, cause: str) -> None:
        self._move(ctx, "Step", STEP_TRANSITIONS, step, step.step_id, target, cause)
        self.changed(step)

    def move_attempt(
        self, ctx: CommandContext, attempt: Attempt, target: AttemptState, cause: str
    ) -> None:
        self._move(ctx, "Attempt", ATTEMPT_TRANSITIONS, attempt, attempt.attempt_id, target, cause)
        self.changed(attempt)

    def move_approval(
        self, ctx: CommandContext, approval: ApprovalRequest, target: ApprovalState, cause: str
    ) -> None:
        table = APPROVAL_TRANSITIONS
        self._move(ctx, "ApprovalRequest", table, approval, approval.approval_id, target, cause)
        approval.version += 1
        self.changed(approval)

    def move_tool_call(self, ctx: CommandContext, call: ToolCall, target: ToolCallState) -> None:
        self._move(ctx, "ToolCall", TOOL_CALL_TRANSITIONS, call, call.tool_call_id, target, None)
        self.changed(call)

    def _move(
        self,
        ctx: CommandContext,
        entity: str,
        table: Mapping[tuple[Any, Any], str],
        thing: Any,
        thing_id: UUID,
        target: StrEnum,
        cause: str | None,
    ) -> None:
        """``thing`` (an ``entity``) moves to ``target`` by its machine's ``table``, journaled
        with ``cause`` (or the table's)."""
        current = thing.state
        spec_cause = check(entity, table, current, target)
        thing.state = target
        self.journal(ctx, entity, thing_id, current, target, cause or spec_cause)

    def step(self, step_id: UUID) -> Step:
        for step in self.steps:
            if step.step_id == step_id:
                return step
        raise _missing(errors.StepNotFound, "step", step_id)

    def attempt(self, attempt_id: UUID) -> Attempt:
        found = self.attempts.get(attempt_id)
        if found is None:
            raise _missing(errors.AttemptNotFound, "attempt", attempt_id)
        return found

    def approval(self, approval_id: UUID) -> ApprovalRequest:
        found = self.approvals.get(approval_id)
        if found is None:
            raise _missing(errors.ApprovalNotFound, "approval", approval_id)
        return found

    def attempts_of(self, step: Step) -> list[Attempt]:
        return sorted(
            (a for a in self.attempts.values() if a.step_id == step.step_id),
            key=lambda a: a.number,
        )

    def step_result(self, step: Step) -> AttemptResult | None:
        """The result of the step's succeeded attempt (None: none yet, or it sent none); a
        step no worker executes has its own (``Step.result_json``), under the step's id."""
        if step.result_json is not None:
            return AttemptResult(
                attempt_id=step.step_id,
                step_id=step.step_id,
                run_id=step.run_id,
                tenant_id=step.tenant_id,
                outcome_hash=result_hash(step.result_json),
                bytes=len(step.result_json.encode()),
                created_at=self.run.updated_at,
                result_json=step.result_json,
            )
        for attempt in reversed(self.attempts_of(step)):
            if attempt.outcome is AttemptOutcome.SUCCEEDED:
                return self.results.get(attempt.attempt_id)
        return None

    def dependency_results(self, step: Step) -> dict[str, Any]:
        """What ``step``'s grant carries: the results of the steps it depends on, by name
        (a dependency that sent no result has no key)."""
        by_name = {s.name: s for s in self.steps}
        found: dict[str, Any] = {}
        for name in dependencies(self.steps, step.name):
            result = self.step_result(by_name[name])
            if result is not None:
                found[name] = result.value
        return found

    def grant_results(self, attempt_id: UUID) -> dict[str, Any]:
        return self.dependency_results(self.step(self.attempt(attempt_id).step_id))

    def step_calls(self, step_id: UUID) -> list[JournaledCall]:
        """The step's journaled calls, in the order they were recorded."""
        found = [c for c in self.calls.values() if c.step_id == step_id]
        return sorted(found, key=lambda c: (c.recorded_at, c.name, c.occurrence))

    def grant_calls(self, attempt_id: UUID, max_bytes: int) -> tuple[JournaledCall, ...]:
        """What an attempt's grant carries: its step's journaled calls, their values inline
        while their sum stays within ``max_bytes``; past it, a call comes without its value
        (its hash and size only) and the worker reads it when its execution gets there."""
        carried: list[JournaledCall] = []
        total = 0
        for call in self.step_calls(self.attempt(attempt_id).step_id):
            total += call.bytes
            if total > max_bytes and call.value_json is not None:
                call = replace(call, value_json=None)
            carried.append(call)
        return tuple(carried)

    def run_result(self) -> AttemptResult | None:
        """The run's result: its final step's."""
        name = final_step(self.steps)
        return self.step_result(next(s for s in self.steps if s.name == name))

    def open_attempts(self) -> list[Attempt]:
        return [a for a in self.attempts.values() if not a.state.terminal]

    def open_children(self) -> list[Step]:
        """The run steps whose child run has not ended yet (they hold the run open)."""
        return [s for s in self.steps if s.kind == RUN and s.state is StepState.RUNNING and s.child]

    def pending_approvals(self) -> list[ApprovalRequest]:
        return [a for a in self.approvals.values() if a.state is ApprovalState.PENDING]

    def open_tool_calls(self) -> list[ToolCall]:
        return [t for t in self.tool_calls.values() if not t.state.terminal]

    def next_due(self, options: Options) -> datetime | None:
        """When this run next needs a command nobody will send (its durable reminder)."""
        state = self.run.state
        if state.terminal:
            return None
        if state is RunState.ACCEPTED:
            ready = self.ready_steps()
            if (
                self.run.budget_reservation_id is not None
                and ready
                and all(s.held is not None and s.not_before is not None for s in ready)
            ):
                return min(s.not_before for s in ready if s.not_before is not None)  # held
            return self.run.created_at  # budget and first dispatch are due at once
        # A step held for a slot (issue 21) is not due: the transaction that frees its slot
        # makes the run due (runs.next_due_at), so the dispatcher's sweep wakes it then, never
        # before. A step a rate limit holds is due at its reservation's instant (not_before).
        times: list[datetime] = []
        if state is RunState.CANCELLING:
            stop = self.stop_deadline(options)
            # Past it, only open children hold the run: their checks are its reminder.
            if stop is not None and (self.open_attempts() or not self.open_children()):
                times.append(stop)
        elif state is not RunState.WAITING_FOR_APPROVAL:  # a human's wait has its own expiry
            times.append(self.deadline(options))
        if state is RunState.RUNNING and self.run.suspended_at is None:
            times.extend(
                s.not_before or self.run.updated_at
                for s in self.ready_steps()
                if not flow.waits_for_slot(s.held)
            )
        if state in (RunState.RUNNING, RunState.WAITING_FOR_APPROVAL):
            # a wait step's timer: the durable reminder that fires it
            times.extend(
                s.due_at
                for s in self.steps
                if s.state is StepState.RUNNING and s.due_at is not None
            )
        elif state is RunState.CANCELLING:  # an open child is asked to cancel until it ends
            times.extend(s.due_at for s in self.open_children() if s.due_at is not None)
        if state is not RunState.WAITING_FOR_APPROVAL:
            grace = timedelta(seconds=options.renewal_grace_seconds)
            times.extend(lease.expires_at + grace for lease in self.leases.values())
        times.extend(a.expires_at for a in self.pending_approvals())
        times.extend(t.expires_at for t in self.open_tool_calls())
        return min(times) if times else None

    def dependencies_of(self, step: Step) -> list[Step]:
        """The steps ``step`` waits for (``workflow.dependencies``: its ``depends_on``; a row
        stored before graphs waits for the step before it), in the run's order."""
        return list(self._dependencies()[step.step_id])

    def _dependencies(self) -> dict[UUID, list[Step]]:
        """Every step's ``dependencies_of``, made once (ready_steps and next_due ask for
        each pending step's on every command: issue 33)."""
        if self._waits_for is None:
            names = dependency_map(self.steps)
            waits_for: dict[UUID, list[Step]] = {}
            for step in self.steps:
                wanted = set(names[step.name])
                waits_for[step.step_id] = [s for s in self.steps if s.name in wanted]
            self._waits_for = waits_for
        return self._waits_for

    def ready_steps(self) -> list[Step]:
        """Pending steps whose dependencies have all succeeded or were skipped (a retry's
        backoff aside), in the release's order: the fan-out a dispatch starts together; a
        fan-in step is ready only once every one of its dependencies is."""
        waits_for = self._dependencies()
        return [
            s
            for s in self.steps
            if s.state is StepState.PENDING
            and all(d.state.settled_for_dependants for d in waits_for[s.step_id])
        ]

    def deadline(self, options: Options) -> datetime:
        """When the control plane cancels the run: its wall-clock budget (``maxMinutes`` from
        the first lease grant) or its maximum lifetime, whichever comes first."""
        lifetime = self.run.created_at + timedelta(seconds=options.max_run_lifetime_seconds)
        wall_clock = self.run.deadline_at
        return lifetime if wall_clock is None else min(lifetime, wall_clock)

    def stop_deadline(self, options: Options) -> datetime | None:
        """While Cancelling: when the lease holders' time to stop and report runs out."""
        if self.run.state is not RunState.CANCELLING or not self.intents:
            return None
        intent = max(self.intents, key=lambda i: i.requested_at)
        own = intent.reason in (WALL_CLOCK_EXCEEDED, LIFETIME_EXCEEDED)
        wait = options.cancel_grace_seconds if own else options.cancel_stop_timeout_seconds
        return intent.requested_at + timedelta(seconds=wait)

    def lease_grant(self, attempt: Attempt, lease: Lease) -> LeaseGrant:
        step = self.step(attempt.step_id)
        return LeaseGrant(
            run_id=self.run.run_id,
            step_id=step.step_id,
            attempt_id=attempt.attempt_id,
            lease_id=lease.lease_id,
            fencing_token=lease.fencing_token,
            holder=lease.holder,
            expires_at=lease.expires_at,
            agent_id=step.agent_id,
            skill_id=step.skill_id,
            attempt_number=attempt.number,
            side_effect_class=step.side_effect_class,
            gate=step.gate,
            cancel_requested=self.run.state is RunState.CANCELLING,
            approved_proposal_hash=self._approved_hash(attempt),
            replay=None if self.run.replay_of is None else replay_mode(self.run.replay),
        )

    def _approved_hash(self, attempt: Attempt) -> str | None:
        approved = [
            a
            for a in self.approvals.values()
            if a.attempt_id == attempt.attempt_id and a.state is ApprovalState.APPROVED
        ]
        return max(approved, key=lambda a: a.created_at).proposal_hash if approved else None
