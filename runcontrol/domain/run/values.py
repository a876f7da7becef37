"""What the aggregate's commands take and answer: options, the command context, the
caller, a submission and a lease grant; and the constants its rules name."""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

from .. import errors
from ..model import Limits
from ..states import AttemptOutcome, FailureClass, Role, SideEffectClass

# Who decides an approval that expired (``decided_by``): the reconciler, on the policy's behalf.
APPROVAL_EXPIRY = "approval-expiry-reconciler"

WORKER_OUTCOMES = frozenset(
    {
        AttemptOutcome.SUCCEEDED,
        AttemptOutcome.FAILED,
        AttemptOutcome.UNCERTAIN,
        AttemptOutcome.CANCELLED,
    }
)


@dataclass(frozen=True, slots=True)
class Options:
    """The spec's RunControl options that the rules read (see ``runcontrol.config``)."""

    lease_seconds: float = 120
    renewal_grace_seconds: float = 30
    default_max_attempts: int = 3
    approval_expiry_hours: float = 72
    retry_base_seconds: float = 1.0
    retry_cap_seconds: float = 300.0
    # How long a committed command's answer answers its resends (exactly-once window).
    answer_retention_seconds: float = 86400.0
    # How long the holders of a cancelled run's leases have to stop and report, before the
    # reminder settles their attempts Uncertain (RunControl:Cancel:StopTimeoutSeconds).
    cancel_stop_timeout_seconds: float = 120.0
    # The same for a run the control plane itself cancels (wall clock, lifetime): cancelGrace.
    cancel_grace_seconds: float = 30.0
    # Every run is cancelled this long after it was accepted (RunControl:Runs:MaxLifetimeHours).
    max_run_lifetime_seconds: float = 86400.0
    # A claimed tool call without a result this long is closed by the reminder, never
    # executed (RunControl:ToolCalls:ClaimTimeoutSeconds).
    tool_call_claim_timeout_seconds: float = 300.0
    # The largest inline result an outcome may carry, as canonical JSON bytes; a larger one is
    # refused (``ResultTooLarge``) and goes by reference (RunControl:Results:MaxInlineBytes).
    result_max_bytes: int = 256 * 1024
    # Journaled calls (``step.run``), per step: at most this many, of at most this many bytes
    # of canonical JSON in all (RunControl:Calls:MaxPerStep, :MaxBytesPerStep); a grant
    # carries their values inline up to ``calls_grant_max_bytes`` (:GrantMaxBytes).
    calls_max_per_step: int = 1000
    calls_max_bytes_per_step: int = 16 * 1024 * 1024
    calls_grant_max_bytes: int = 1024 * 1024
    # A run step's open child is submitted again and asked for its end this often (issue 32:
    # the re-drive of a host killed between the two runs' commits).
    child_check_seconds: float = 10.0


# At most this many progress messages per report (one transaction).
PROGRESS_BATCH_MAX = 50
MAX_CALL_ID = 200
MAX_CALL_NAME = 200  # a journaled call's name
CLAIM_TIMED_OUT = "no result before the claim timeout; never executed"

# Reasons of the cancellations the control plane itself records.
WALL_CLOCK_EXCEEDED = "wall-clock-exceeded"
LIFETIME_EXCEEDED = "lifetime-exceeded"
RUN_CONTROL = "run-control"  # the actor of what the reminder does on its own
RESTORED_FROM_BACKUP = "restored-from-backup"  # why restore-check settles a lease
RESTORE_CHECK = "restore-check"  # the actor of that settlement


@dataclass(slots=True)
class CommandContext:
    now: datetime
    actor: str
    command_id: str | None = None
    # The grain's mints in the run's virtual shard (``GrainEnv.context``, ``domain/shards.py``).
    new_id: Callable[[], UUID] = uuid.uuid4
    uniform: Callable[[float, float], float] = random.uniform


@dataclass(frozen=True, slots=True)
class Principal:
    """Who issues a command, taken from a verified token (never from a request body)."""

    subject: str
    tenant_id: str
    project_id: str
    roles: frozenset[Role] = frozenset()


@dataclass(frozen=True, slots=True)
class FlowGate:
    """What a dispatch decides on beside the run (issue 21): the tenant's cap on open attempts
    (a key of its own), and the keys the dispatching statement refused so far, with what it
    found (deciding again, the steps needing them are held)."""

    capacity: int | None = None
    denied: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Submission:
    run_id: UUID
    tenant_id: str
    project_id: str
    idempotency_key: str
    workflow_id: str
    model_profile_id: str
    input_hash: str
    snapshot_id: UUID
    requested_by: str
    environment_id: str | None = None
    limits: Limits = Limits()
    correlation_id: str | None = None
    input: dict[str, Any] | None = None
    priority: int = 3
    # A child run's parent run and step, and its depth (issue 32)
    parent_run_id: UUID | None = None
    parent_step_id: UUID | None = None
    depth: int = 0
    # The template version it is submitted from (issue 44)
    template_id: str | None = None
    template_version: int | None = None


@dataclass(frozen=True, slots=True)
class LeaseGrant:
    run_id: UUID
    step_id: UUID
    attempt_id: UUID
    lease_id: UUID
    fencing_token: int
    holder: str
    expires_at: datetime
    agent_id: str
    skill_id: str | None
    attempt_number: int
    side_effect_class: SideEffectClass
    gate: str = "none"
    cancel_requested: bool = False
    # Set when the attempt resumes after a human approved this exact proposal: a holder whose
    # proposal hashes the same may execute at once (asking again answers the same approval).
    approved_proposal_hash: str | None = None
    # A replay run's (docs/replay.md): what the worker does with a call the original did not
    # make, ``refuse`` (the step fails replay-diverged) or ``live``; None: not a replay.
    replay: str | None = None


def control_reason(reason: str) -> str:
    if not reason or not reason.strip():
        raise errors.ValidationFailed("an operator control needs a reason")
    return reason


def failure_class_for(
    outcome: AttemptOutcome, failure_class: FailureClass | None
) -> FailureClass | None:
    if outcome is AttemptOutcome.SUCCEEDED:
        return None
    if outcome is AttemptOutcome.UNCERTAIN:
        return FailureClass.UNCERTAIN
    if outcome is AttemptOutcome.CANCELLED:
        return FailureClass.CANCELLATION
    if outcome is AttemptOutcome.TIMED_OUT:
        return FailureClass.TRANSIENT
    return failure_class or FailureClass.TRANSIENT
