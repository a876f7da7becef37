"""Runs: SubmitRun, GetRun, ListRuns, CancelRun.

Commands go to the run hosts through ``RunControlClient``; reads come from the tenant-scoped
read models. Routes translate HTTP to calls and back, nothing more.
"""

from __future__ import annotations

import asyncio
import math
from typing import Annotated, Any, Literal
from uuid import UUID

from fastapi import Header, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from schemas.api import (
    BulkCancelRequest,
    BulkCancelResponse,
    CancelRunRequest,
    CancelRunResponse,
    RunPage,
    RunView,
    SubmitRunBody,
    SubmitRunResponse,
    id_check,
)

from ..domain import Limits, RunState, errors
from ..domain.access import Operation
from ..edge import bulk, commands
from ..store import queries as q
from ..store.commit import EVENTS_CHANNEL
from . import routes, templates
from .auth import Caller, RunCanceller, RunsReader, verified
from .context import Cursor, PageLimit, Services, Svc, found, list_page, location
from .limits import MeteredCanceller, MeteredSubmitter, metered
from .problems import responses

router = routes.router("/factory/runs", "runs")

IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=255,
        description="Required. The same key with the same payload answers with the same run.",
    ),
]
RetryKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        max_length=255,
        description="Optional. A retry with the same key gets the first call's answer, never a "
        "second effect (kept 24 h: `RunControl:Commands:AnswerRetentionHours`).",
    ),
]
RunIdPath = Annotated[UUID, Path(alias="runId")]


CorrelationId = Annotated[str | None, Header(alias="X-Correlation-Id", max_length=200)]
MAX_PREFER = 200  # characters of a Prefer header read; a longer one is ignored (RFC 7240)
Prefer = Annotated[
    str | None,
    Header(
        description="`wait=<seconds>` (RFC 7240): answer 200 with the run if it ends within "
        "the wait (capped by `api.prefer_wait_max_seconds`), otherwise the usual 202. A "
        "preference the server cannot honour (not a finite number, a header over 200 "
        "characters) is ignored, never refused.",
    ),
]


def preferred_wait(prefer: str | None, cap: float) -> float:
    """The ``wait`` preference in seconds, capped; 0 when absent, not a finite number, or in
    a header too long to read (``inf`` or ``1e309`` waited the whole cap)."""
    if prefer is None or len(prefer) > MAX_PREFER:
        return 0.0
    for part in prefer.replace(";", ",").split(","):
        name, _, value = part.strip().partition("=")
        if name.strip().lower() == "wait":
            try:
                seconds = float(value.strip().strip('"'))
            except ValueError:
                return 0.0
            return max(0.0, min(seconds, cap)) if math.isfinite(seconds) else 0.0
    return 0.0


async def wait_terminal(
    svc: Services, caller: Caller, run_id: UUID, seconds: float
) -> dict[str, Any] | None:
    """The run's view once it is terminal, if that happens within ``seconds`` (woken by the
    replica's LISTEN feed, as the event streams are); None otherwise."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    key = (str(run_id),)
    project = caller.project_scope
    svc.feed.start()
    while True:
        since = svc.feed.generation(EVENTS_CHANNEL, key)
        view = await svc.read_in_scope(
            caller, lambda conn: q.get_run(conn, run_id, project_id=project)
        )
        if view is not None and RunState(view["state"]).terminal:
            return view
        left = deadline - loop.time()
        if left <= 0:
            return None
        await svc.feed.wait(EVENTS_CHANNEL, key, since, left)


def run_location(run_id: UUID) -> str:
    return location(router.prefix, run_id)


async def submit_run(
    caller: MeteredSubmitter,
    svc: Svc,
    body: SubmitRunBody,
    idempotency_key: IdempotencyKey = None,
    correlation_id: CorrelationId = None,
    prefer: Prefer = None,
) -> Response:
    """Accept a run; 202 with the run location; idempotent on Idempotency-Key.

    Scope `factory.runs.write`; roles Requester, WorkspaceAdmin, PlatformAdmin. The run belongs to
    the token's project.
    """
    wait = preferred_wait(prefer, svc.settings.api.prefer_wait_max_seconds)
    fields = body.model_dump(exclude={"limits", "template_id"})
    limits = Limits(**body.limits.model_dump())
    if body.template_id is not None:
        limits = await templates.submission(svc, caller, body.template_id, fields, limits)
    command = commands.submit_run(
        svc.outside(caller), idempotency_key, correlation_id=correlation_id, limits=limits, **fields
    )
    result = await svc.send(command)
    headers = {"Location": run_location(result.run_id)}
    if wait > 0:
        view = await wait_terminal(svc, caller, result.run_id, wait)
        if view is not None:  # ended within the wait: the run itself, as GetRun answers it
            run = RunView.model_validate(view).model_dump(mode="json", by_alias=True)
            headers["Preference-Applied"] = "wait"
            return JSONResponse(run, status_code=200, headers=headers)
    accepted = SubmitRunResponse.model_validate(result, from_attributes=True)
    return Response(
        accepted.model_dump_json(by_alias=True),
        status_code=202,
        media_type="application/json",
        headers=headers,
    )


async def _submit_plainly(route: APIRoute, request: Request) -> Response:
    """``submit_run`` served by a plain handler (``routes.plain``, issue 42): its arguments
    made in FastAPI's order (the JSON body read, the caller verified, permitted and metered,
    then the headers and the body checked), without its dependency solving."""
    body = await routes.json_body(request)
    caller = metered(await verified(request, Operation.SUBMIT_RUN), request)
    svc: Services = request.app.state.services
    return await submit_run(caller, svc, **routes.arguments(route, request, body))


router.add_api_route(
    "",
    submit_run,
    methods=["POST"],
    status_code=202,
    response_model=SubmitRunResponse,
    responses={
        200: {"model": RunView, "description": "With `Prefer: wait=N`: the run ended within it."},
        **responses(400, 404, 409, 429, 503),
    },
    route_class_override=routes.plain(_submit_plainly),
)


@router.get("/{runId}", response_model=RunView)
async def get_run(
    caller: RunsReader,
    svc: Svc,
    run_id: RunIdPath,
) -> dict[str, Any]:
    """Run with steps, attempts, current lease and pending approvals.

    Scope `factory.runs.read`. A run outside the caller's project is 404 unless a role spans the
    tenant (Operator, WorkspaceAdmin, PlatformAdmin).
    """
    project = caller.project_scope
    view = await svc.read_in_scope(caller, lambda conn: q.get_run(conn, run_id, project_id=project))
    return found(view, errors.RunNotFound(f"run {run_id} not found"))


@router.get("", response_model=RunPage, responses=responses(400))
async def list_runs(
    caller: RunsReader,
    svc: Svc,
    state: Annotated[list[RunState] | None, Query()] = None,
    workflow_id: Annotated[
        str | None,
        Query(alias="workflowId", min_length=1, max_length=200, pattern=r"^[^\x00]*$"),
        id_check(),
    ] = None,
    parent_run_id: Annotated[UUID | None, Query(alias="parentRunId")] = None,
    cursor: Cursor = None,
    limit: PageLimit = 50,
    replays: Literal["exclude", "only", "include"] = "exclude",
) -> dict[str, Any]:
    """Runs in the trusted scope with state and freshness; paged.

    Scope `factory.runs.read`. Newest first. The caller's project only, unless a role spans the
    tenant (Operator, WorkspaceAdmin, PlatformAdmin). Replays (docs/replay.md) are not
    production: listed only with `replays=only` or `include`.
    """
    states = [str(s) for s in state or ()]
    return await list_page(
        svc,
        caller,
        q.list_runs,
        cursor,
        limit,
        states=states,
        workflow_id=workflow_id,
        parent_run_id=parent_run_id,
        replays=replays,
    )


@router.post(
    "/{runId}/cancel",
    status_code=202,
    response_model=CancelRunResponse,
    responses=responses(409, 429, 503),
)
async def cancel_run(
    caller: MeteredCanceller,
    svc: Svc,
    body: CancelRunRequest,
    run_id: RunIdPath,
    idempotency_key: RetryKey = None,
) -> dict[str, Any]:
    """Record cancellation intent; the resulting state is observed, not assumed.

    Scope `factory.runs.write`; roles Requester (its project's runs), Operator, WorkspaceAdmin,
    PlatformAdmin (any run of the tenant).
    """
    command = await commands.cancel_run(
        svc.outside(caller), idempotency_key, run_id=run_id, reason=body.reason
    )
    return {"runId": run_id, "state": await svc.send(command)}


@router.post("/cancel", response_model=BulkCancelResponse)
async def cancel_runs(
    caller: RunCanceller,
    svc: Svc,
    body: BulkCancelRequest,
    request: Request,
    idempotency_key: RetryKey = None,
) -> dict[str, Any]:
    """Record cancellation intent on each run of an explicit list; one outcome each.

    Scope `factory.runs.write`; the roles of CancelRun. Each run is one CancelRun with the same
    reason: `accepted` with the state observed, or the refusal the single call would have answered
    (`not-found`, `forbidden`, `conflict`, ...). Each run takes one command of the tenant's rate.
    """
    bulk.distinct(body.run_ids, "run")
    outside = svc.outside(caller, meter=request.app.state.rate_limiter)

    async def build(run_id: UUID) -> Any:
        return await commands.cancel_run(
            outside, idempotency_key, run_id=run_id, reason=body.reason
        )

    outcomes = await bulk.each(body.run_ids, lambda r: r, build, svc.send, bulk.Outcome.ACCEPTED)
    return bulk.answer(outcomes, "runId", lambda state: {"state": str(state)})
