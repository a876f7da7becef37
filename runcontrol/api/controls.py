"""Run controls for operators: suspend, resume, retry a step, resolve an Uncertain attempt,
rerun a finished run.

Scope ``factory.runs.operate``; roles Operator, WorkspaceAdmin, PlatformAdmin (all span the
tenant). Each route sends one typed command (``runcontrol.commands``) carrying the caller and
the required reason; the grain commits the change with its journal entry, outbox event and an
audit record in the run's one transaction. An ``Idempotency-Key`` makes a retry get the first
answer, as for cancels. Routes translate HTTP to commands and back, nothing more.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any
from uuid import UUID

from fastapi import Depends, Path, Request, Response

from schemas.api import (
    ControlRequest,
    ControlResponse,
    RerunRequest,
    RerunResponse,
    ResolveRequest,
)

from ..commands import (
    Command,
    ControlResult,
    RerunRelease,
    ResolveAttempt,
    ResumeRun,
    RetryStep,
    SuspendRun,
)
from ..domain import AttemptOutcome
from ..domain.access import Operation
from ..edge import commands
from ..edge.metering import TenantRateLimiter
from . import routes
from .auth import Caller, require
from .context import Services, Svc
from .problems import responses
from .runs import RetryKey, RunIdPath, run_location

router = routes.router("/factory/runs", "run controls")

ROLES = "Scope `factory.runs.operate`; roles Operator, WorkspaceAdmin, PlatformAdmin."


async def _operator(
    caller: Annotated[Caller, Depends(require(Operation.OPERATE_RUNS))], request: Request
) -> Caller:
    limiter: TenantRateLimiter = request.app.state.rate_limiter
    limiter.check(caller.tenant_id)
    return caller


RunOperator = Annotated[Caller, Depends(_operator)]
StepIdPath = Annotated[UUID, Path(alias="stepId")]
AttemptIdPath = Annotated[UUID, Path(alias="attemptId")]
# Besides those of every route with a caller, a path and a body (``routes.Operation``).
CONTROL_RESPONSES = responses(409, 429, 503)


async def _control(
    svc: Services,
    caller: Caller,
    kind: type[Command[ControlResult]],
    run_id: UUID,
    idempotency_key: str | None,
    *,
    target: UUID | None = None,
    **fields: Any,
) -> Any:
    """Send the control ``kind`` on ``run_id`` as the caller (``edge.commands.control``)."""
    command = await commands.control(
        svc.outside(caller), idempotency_key, kind, run_id=run_id, target=target, **fields
    )
    return await svc.send(command)


def _run_control(kind: type[Command[ControlResult]], path: str, summary: str, refused: str) -> None:
    """The route of a control on the run itself, whose body is its reason alone."""

    async def route(
        caller: RunOperator,
        svc: Svc,
        body: ControlRequest,
        run_id: RunIdPath,
        idempotency_key: RetryKey = None,
    ) -> Any:
        return await _control(svc, caller, kind, run_id, idempotency_key, reason=body.reason)

    route.__name__ = route.__qualname__ = f"{path.rsplit('/', 1)[-1]}_run"
    router.post(
        path,
        response_model=ControlResponse,
        responses=CONTROL_RESPONSES,
        summary=summary,
        description=f"{ROLES} {refused}",
    )(route)


_run_control(
    SuspendRun,
    "/{runId}/suspend",
    "Suspend a run: nothing new is dispatched or leased; leases in hand may finish.",
    "409 when the run has ended, is being cancelled, has not started or is suspended already.",
)
_run_control(
    ResumeRun,
    "/{runId}/resume",
    "Resume a suspended run and dispatch what is due.",
    "409 `run-not-suspended` when it is not suspended.",
)


@router.post(
    "/{runId}/steps/{stepId}/retry",
    response_model=ControlResponse,
    responses=CONTROL_RESPONSES,
    summary="Dispatch a new attempt now of a step waiting for its retry.",
    description=ROLES + " The step's last attempt Failed, TimedOut or settled Uncertain and "
    "the run is Running; a finished run is rerun instead (409 `run-terminal`). The new "
    "attempt (its lease carries a new fencing token) is dispatched now, or by the resume of a "
    "suspended run.",
)
async def retry_step(
    caller: RunOperator,
    svc: Svc,
    body: ControlRequest,
    run_id: RunIdPath,
    step_id: StepIdPath,
    idempotency_key: RetryKey = None,
) -> Any:
    return await _control(
        svc,
        caller,
        RetryStep,
        run_id,
        idempotency_key,
        target=step_id,
        reason=body.reason,
        step_id=step_id,
    )


@router.post(
    "/{runId}/attempts/{attemptId}/resolve",
    response_model=ControlResponse,
    responses=CONTROL_RESPONSES,
    summary="Resolve an Uncertain attempt as Succeeded or Failed.",
    description=ROLES + " When its step waits for the retry it scheduled, Succeeded settles the "
    "step and the run moves on; otherwise (a finished run, a later attempt) the attempt's "
    "record alone changes. 409 unless the attempt is Uncertain.",
)
async def resolve_attempt(
    caller: RunOperator,
    svc: Svc,
    body: ResolveRequest,
    run_id: RunIdPath,
    attempt_id: AttemptIdPath,
    idempotency_key: RetryKey = None,
) -> Any:
    return await _control(
        svc,
        caller,
        ResolveAttempt,
        run_id,
        idempotency_key,
        target=attempt_id,
        reason=body.reason,
        attempt_id=attempt_id,
        outcome=AttemptOutcome(body.outcome),
    )


@router.post(
    "/{runId}/rerun",
    status_code=201,
    response_model=RerunResponse,
    responses=CONTROL_RESPONSES,
    summary="Rerun a finished run as a new run linked to it (same input).",
    description=ROLES + " `release`: `pinned` (default) runs the release the finished run "
    "pinned, `current` the one `releaseAlias` (default `latest`) names now. 201 with the new "
    "run and its Location; the new run shows `rerunOf`. 409 `run-not-finished` while the run "
    "has not ended.",
)
async def rerun_run(
    caller: RunOperator,
    svc: Svc,
    body: RerunRequest,
    run_id: RunIdPath,
    response: Response,
    idempotency_key: RetryKey = None,
) -> Any:
    release = RerunRelease(body.release)
    command = await commands.rerun_run(
        svc.outside(caller),
        idempotency_key,
        run_id=run_id,
        reason=body.reason,
        release=release,
        release_alias=body.release_alias,
    )
    result = await svc.send(command)
    response.headers["Location"] = run_location(result.run_id)
    return {**asdict(result), "rerun_of": run_id, "release": str(release)}


__all__ = ["router"]
