"""Signals: an input from outside for a run's signal step (issue 22).

``POST /factory/runs/{runId}/signals/{name}`` with a JSON body (required: none, or null, is a
422): the body becomes the result of
the step waiting for ``name``. One sent before its step waits is kept and delivered when the
step starts; a resend with the same ``Idempotency-Key`` is answered with the first answer (the
grain's memo); a finished run refuses it (409 ``run-terminal``). Sending a signal is giving a
run input, as a submission does: the same scope and roles (``factory.runs.write``: Requester,
WorkspaceAdmin, PlatformAdmin), within the caller's project; the grain audits the caller.
"""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from fastapi import Body, Path

from schemas.api import SignalResponse

from ..commands import SignalResult
from ..edge import commands
from . import routes
from .context import Svc
from .limits import MeteredSubmitter
from .problems import responses
from .runs import IdempotencyKey

router = routes.router("/factory/runs", "signals")

RunIdPath = Annotated[UUID, Path(alias="runId")]
SignalName = Annotated[str, Path(min_length=1, max_length=200, pattern=r"^[^\x00/]+$")]


@router.post(
    "/{runId}/signals/{name}",
    status_code=202,
    response_model=SignalResponse,
    responses=responses(400, 409, 429, 503),
)
async def send_signal(
    caller: MeteredSubmitter,
    svc: Svc,
    run_id: RunIdPath,
    name: SignalName,
    body: Annotated[
        Any, Body(description="Any JSON value but null (at most 64 KiB canonical): required.")
    ] = None,
    idempotency_key: IdempotencyKey = None,
) -> SignalResult:
    """Send the run's signal step its input; the body becomes the step's result.

    Scope `factory.runs.write`; roles Requester (its project's runs), WorkspaceAdmin, PlatformAdmin.
    `Idempotency-Key` required. `delivered` is false when the step does not wait yet: the signal is
    kept and delivered when it does.
    """
    command = await commands.send_signal(
        svc.outside(caller), idempotency_key, run_id=run_id, name=name, body=body
    )
    return await svc.send(command)
