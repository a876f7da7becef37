"""What one command records for the unit of work to persist atomically (``Changes``), and the
commands to child runs sent once it commits (``ChildCall``). Rules record through
``RunAggregate``, never here directly."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, TypeVar
from uuid import UUID

from .. import model


class ChildAction(StrEnum):
    SUBMIT = "submit"  # submit the child run (idempotent: its key is the parent's step's)
    CHECK = "check"  # ask the child for its end; submit it if it is not there (a re-drive)
    CANCEL = "cancel"  # ask the child run to cancel (the parent is being cancelled)


@dataclass(frozen=True, slots=True)
class ChildCall:
    """A command to a run step's child run, sent after the parent's commit (never written by
    the parent's statement: the child's own grain decides it). Both are idempotent, and the
    parent's reminder sends them again until the child's end is reported."""

    action: ChildAction
    step_id: UUID
    step_name: str
    child_run_id: UUID
    number: int
    workflow_id: str
    release_alias: str | None = None
    input: dict[str, Any] | None = None
    reason: str | None = None


@dataclass(slots=True)
class Changes:
    """What one command must persist, atomically."""

    run: model.Run
    expected_version: int | None
    steps: dict[UUID, model.Step] = field(default_factory=dict)
    attempts: dict[UUID, model.Attempt] = field(default_factory=dict)
    leases: dict[UUID, model.Lease] = field(default_factory=dict)
    approvals: dict[UUID, model.ApprovalRequest] = field(default_factory=dict)
    decisions: list[model.ApprovalDecision] = field(default_factory=list)
    intents: list[model.CancellationIntent] = field(default_factory=list)
    events: list[model.Event] = field(default_factory=list)
    journal: list[model.RecoveryJournalEntry] = field(default_factory=list)
    audits: list[model.AuditRecord] = field(default_factory=list)
    tool_calls: dict[UUID, model.ToolCall] = field(default_factory=dict)
    results: list[model.AttemptResult] = field(default_factory=list)
    calls: list[model.JournaledCall] = field(default_factory=list)
    # Flow control (issue 21): the slots the dispatches need (the statement admits or refuses
    # them) and the held steps' places in their keys' queues.
    flow: list[dict[str, Any]] = field(default_factory=list)
    flow_wait: list[dict[str, Any]] = field(default_factory=list)
    # ``cancel-oldest``: the runs holding a key this run now waits for, and why; the host
    # cancels them after the commit (not stored: the audit record is).
    flow_cancel: list[tuple[UUID, str]] = field(default_factory=list)
    # Child runs to submit or cancel once this commits (not stored: the step's ``child`` and
    # ``due_at`` are, and the reminder sends them again).
    child_calls: list[ChildCall] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        return not (
            self.steps
            or self.attempts
            or self.leases
            or self.approvals
            or self.decisions
            or self.intents
            or self.events
            or self.journal
            or self.tool_calls
            or self.results
            or self.calls
            or self.flow_wait
            or self.run_dirty
        )

    run_dirty: bool = False


# A row a command creates (``RunAggregate.add``).
NewRow = (
    model.Attempt
    | model.Lease
    | model.ApprovalRequest
    | model.ToolCall
    | model.JournaledCall
    | model.ApprovalDecision
    | model.CancellationIntent
    | model.AttemptResult
)
# A row the run holds that a command creates (``RunAggregate.new``).
HeldRow = TypeVar(
    "HeldRow",
    model.Attempt,
    model.Lease,
    model.ApprovalRequest,
    model.ToolCall,
    model.JournaledCall,
    model.ApprovalDecision,
    model.CancellationIntent,
)
