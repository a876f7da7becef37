"""Each outside command built once, for both doors.

An outside command comes from a caller outside the cluster: a submission, a cancel, an
approval's decision, an operator's control or rerun, a signal. Its builder here does what no
door may decide by itself: the permission (``domain.access``: a role of the caller grants the
operation and its token holds the operation's scope), the visibility (another project's run or
approval answers as an unknown one does), the command id made from the caller's idempotency
key, and the checks of the input against what the store holds. It answers the command, or
raises the typed error both doors map through ``edge.errors.STATUS``: the same bad input is
the same refusal over HTTP and gRPC. The HTTP routes (``runcontrol.api``) and the gRPC
servicer (``runcontrol.rpc``, the rows of ``rpc.table.RPCS`` with a ``build``) call these
and keep only the translation of their own request and answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from uuid import UUID

from sqlalchemy import Connection

from ..commands import (
    CancelRun,
    Command,
    ControlResult,
    DecideApproval,
    ReplayRun,
    RerunRelease,
    RerunRun,
    SendSignal,
    SubmitRequest,
    SubmitRun,
    new_command_id,
)
from ..domain import Decision, Limits, canonical_json, errors
from ..domain.access import RUNS_OPERATE, Operation, may_set_priority
from ..domain.limits import name as checked_id
from ..domain.run.waits import MAX_SIGNAL_BYTES
from ..ids import new_run_id
from ..store import Database
from ..store import queries as q
from . import reads
from .auth import Caller, permit
from .errors import IdempotencyKeyRequired, RequestInvalid
from .metering import TenantRateLimiter
from .storable import storable_json

T = TypeVar("T")
C = TypeVar("C", RerunRun, ReplayRun)


@dataclass(frozen=True, slots=True)
class Outside:
    """Who sends an outside command, through which door, and the database its builder reads
    (in the caller's tenant and, for a caller bound to its project, that project). ``meter``:
    the replica's tenant command rate, taken once the caller may send the command; None where
    the door took it already (HTTP's caller dependency, before the body is read)."""

    caller: Caller
    db: Database
    door: str  # "http" or "grpc": the head of a command id made from an idempotency key
    meter: TenantRateLimiter | None = None

    @property
    def tenant_id(self) -> str:
        return self.caller.tenant_id

    @property
    def subject(self) -> str:
        return self.caller.principal.subject

    def admit(self, operation: Operation) -> None:
        """The caller may ``operation`` (``edge.auth.permit``); then its tenant's rate."""
        permit(self.caller, operation)
        if self.meter is not None:
            self.meter.check(self.tenant_id)

    async def read(self, query: Callable[[Connection], T]) -> T:
        project = self.caller.project_scope
        return await reads.read(self.db, self.tenant_id, query, project_id=project)

    def command_id(self, operation: str, target: UUID, key: str | None) -> str:
        """The caller's idempotency key, scoped to the door, the caller, the operation and its
        target (one key reused elsewhere never answers for another call); without a key, a
        new id (the call is then not deduplicated)."""
        if not key:
            return new_command_id()
        return f"{self.door}:{self.subject}:{operation}:{target}:{key}"


def required_key(key: str | None) -> str:
    if not key or not key.strip():
        raise IdempotencyKeyRequired(
            "an idempotency key is required (HTTP: the Idempotency-Key header; gRPC: command_id)"
        )
    return key


async def require_visible(
    caller: Caller, db: Database, run_id: UUID, *, tenant_wide_too: bool = False
) -> None:
    """Before a command (or a read by run) on ``run_id``: another project's run answers as an
    unknown one does (a run's project never changes, so this cannot go stale before the
    command lands). For a caller whose roles span the tenant a command finds out itself
    whether the run exists; a read asks (``tenant_wide_too``)."""
    project = caller.project_scope
    if (project is not None or tenant_wide_too) and not await reads.read(
        db,
        caller.tenant_id,
        lambda conn: q.run_visible(conn, run_id, project_id=project),
        project_id=project,
    ):
        raise errors.RunNotFound(f"run {run_id} not found", run_id=str(run_id))


# ---------------------------------------------------------------------- runs


def submit_run(
    o: Outside, key: str | None, *, correlation_id: str | None, limits: Limits, **fields: Any
) -> SubmitRun:
    """SubmitRun in the caller's project; ``fields``: those of ``SubmitRequest`` the caller
    gives (``workflow_id``, ``release_alias`` ...). A priority above the default is an
    operator's decision."""
    o.admit(Operation.SUBMIT_RUN)
    request = SubmitRequest(
        project_id=o.caller.principal.project_id,
        idempotency_key=required_key(key),
        correlation_id=correlation_id,
        limits=limits,
        **fields,
    )
    # The id character set at both doors (an id outside it is a 422, never a 404 at one).
    checked_id(request.workflow_id, "workflowId")
    for where, value in (
        ("releaseAlias", request.release_alias),
        ("releaseId", request.release_id),
    ):
        if value is not None:
            checked_id(value, where)
    if not may_set_priority(o.caller.principal.roles, o.caller.scopes, request.priority):
        raise errors.Forbidden(
            f"priority {request.priority} needs the {RUNS_OPERATE} scope (above the default 3)"
        )
    return SubmitRun(
        tenant_id=o.tenant_id,
        run_id=new_run_id(o.tenant_id, o.db.placement),
        principal=o.caller.principal,
        request=request,
    )


async def cancel_run(o: Outside, key: str | None, *, run_id: UUID, reason: str) -> CancelRun:
    o.admit(Operation.CANCEL_RUN)
    await require_visible(o.caller, o.db, run_id)
    return CancelRun(
        tenant_id=o.tenant_id,
        run_id=run_id,
        command_id=o.command_id("CancelRun", run_id, key),
        requested_by=o.subject,
        reason=reason,
    )


async def send_signal(
    o: Outside, key: str | None, *, run_id: UUID, name: str, body: Any
) -> SendSignal:
    """Input from outside for the run's signal step ``name``: giving a run input, as a
    submission does (the same operation), within the caller's project."""
    o.admit(Operation.SUBMIT_RUN)
    key = required_key(key)
    checked_id(name, "name", segment=True)  # a step's signal, as publication checks it
    try:
        storable_json(body)
    except ValueError as exc:
        raise RequestInvalid(f"body: {exc}") from None
    if len(canonical_json(body)) > MAX_SIGNAL_BYTES:
        raise errors.ValidationFailed(
            f"a signal's body is at most {MAX_SIGNAL_BYTES} bytes of canonical JSON",
            field="body",
        )
    await require_visible(o.caller, o.db, run_id)
    if body is None:  # no body at all (or null) would settle the step with nothing
        raise errors.ValidationFailed("a signal needs a body: a JSON value, not null", field="body")
    return SendSignal(
        tenant_id=o.tenant_id,
        run_id=run_id,
        command_id=o.command_id(f"SendSignal:{name}", run_id, key),
        name=name,
        body=body,
        sent_by=o.subject,
    )


# ---------------------------------------------------------------------- approvals


async def decide_approval(
    o: Outside,
    key: str | None,
    *,
    approval_id: UUID,
    decision: Decision,
    version: int,
    proposal_hash: str,
    reason: str | None = None,
) -> DecideApproval:
    """A decision is a command to the approval's run: its run is found here, by a read in
    the caller's scope (unknown, another tenant's or another project's: the same 404), so only
    the command itself goes to the run's host. Who may decide on this request (never its
    requester, the policy's approvers, break-glass) is the domain's rule."""
    o.admit(Operation.DECIDE_APPROVAL)
    project = o.caller.project_scope
    run_id = await o.read(lambda conn: q.approval_run(conn, approval_id, project_id=project))
    if run_id is None:
        raise errors.ApprovalNotFound(f"approval {approval_id} not found")
    return DecideApproval(
        tenant_id=o.tenant_id,
        run_id=run_id,
        command_id=o.command_id("DecideApproval", approval_id, key),
        approval_id=approval_id,
        principal=o.caller.principal,
        decision=decision,
        version=version,
        proposal_hash=proposal_hash,
        reason=reason,
    )


# ---------------------------------------------------------------------- operator controls


async def control(
    o: Outside,
    key: str | None,
    kind: type[Command[ControlResult]],
    *,
    run_id: UUID,
    target: UUID | None = None,
    **fields: Any,
) -> Command[ControlResult]:
    """The operator control ``kind`` (suspend, resume, retry a step, resolve an attempt) on
    ``run_id``; ``target`` (the step or attempt it names) scopes the key beside the run;
    ``fields``: the control's own (``reason``, ``step_id`` ...)."""
    o.admit(Operation.OPERATE_RUNS)
    await require_visible(o.caller, o.db, run_id)
    operation = kind.__name__ if target is None else f"{kind.__name__}:{target}"
    fields |= {
        "tenant_id": o.tenant_id,
        "run_id": run_id,
        "command_id": o.command_id(operation, run_id, key),
        "principal": o.caller.principal,
    }
    return kind(**fields)


async def rerun_run(
    o: Outside,
    key: str | None,
    *,
    run_id: UUID,
    reason: str,
    release: RerunRelease,
    release_alias: str,
) -> RerunRun:
    """A new run (a new id) with the input of the finished run ``run_id``, linked to it."""
    return await new_run_from(
        o,
        key,
        RerunRun,
        run_id,
        reason=reason,
        rerun_of=run_id,
        release=release,
        release_alias=release_alias,
    )


async def new_run_from(
    o: Outside, key: str | None, kind: type[C], run_id: UUID, **fields: Any
) -> C:
    """An operator's new run (``kind``: a rerun or a replay, docs/replay.md; its ``fields``)
    from the finished run ``run_id``."""
    o.admit(Operation.OPERATE_RUNS)
    await require_visible(o.caller, o.db, run_id)
    return kind(
        tenant_id=o.tenant_id,
        run_id=new_run_id(o.tenant_id, o.db.placement),
        command_id=o.command_id(kind.__name__, run_id, key),
        principal=o.caller.principal,
        **fields,
    )
