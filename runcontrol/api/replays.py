"""Replay of a run against a newer release (issue 44, docs/replay.md): start one, read its
divergence report.

Starting a replay is an operator's control (scope ``factory.runs.operate``), like a rerun: a
new run of the release ``releaseAlias`` names now, with the finished run's input, marked
``replayOf``. Its report is read like the run (scope ``factory.runs.read``).
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from fastapi import Response

from schemas.api import ReplayReport, ReplayRequest, ReplayResponse

from ..commands import ReplayRun
from ..domain.replay import ReplayApprovals
from ..edge import commands
from ..store import replays
from . import routes
from .auth import RunsReader
from .context import Svc
from .controls import CONTROL_RESPONSES, ROLES, RunOperator
from .runs import RetryKey, RunIdPath, run_location

router = routes.router("/factory/runs", "replays")


@router.post(
    "/{runId}/replays",
    status_code=201,
    response_model=ReplayResponse,
    responses=CONTROL_RESPONSES,
    summary="Replay a finished run against the release an alias names now.",
    description=ROLES + " The replay is a new run with the finished run's input, marked "
    "`replayOf`: its journaled calls are answered from the original's journal when the "
    "original made the same call (name, occurrence, arguments); any other fails its step "
    "`replay-diverged` unless `liveCalls`; it executes no side effect; an approval the "
    "original approved for an equal proposal is reused. 201 with the new run and its "
    "Location; its report is `GET /factory/runs/{runId}/replay-report`. 409 "
    "`run-not-finished` while the run has not ended.",
)
async def replay_run(
    caller: RunOperator,
    svc: Svc,
    body: ReplayRequest,
    run_id: RunIdPath,
    response: Response,
    idempotency_key: RetryKey = None,
) -> Any:
    command = await commands.new_run_from(
        svc.outside(caller),
        idempotency_key,
        ReplayRun,
        run_id,
        replay_of=run_id,
        reason=body.reason,
        release_alias=body.release_alias,
        live_calls=body.live_calls,
        approvals=ReplayApprovals(body.approvals),
    )
    result = await svc.send(command)
    response.headers["Location"] = run_location(result.run_id)
    return {**asdict(result), **body.model_dump(exclude={"reason"}), "replay_of": run_id}


@router.get("/{runId}/replay-report", response_model=ReplayReport)
async def get_replay_report(caller: RunsReader, svc: Svc, run_id: RunIdPath) -> Any:
    """A replay's divergence report against its original.

    Scope `factory.runs.read`. Per step, whether its result is equal (both hashes, a JSON diff
    of small results); the replay's calls the original did not make; the original's calls the
    replay did not make; the approvals whose proposal changed. 404 for a run that is not a
    replay (or not in the caller's scope)."""
    return await svc.read_in_scope(caller, lambda conn: replays.replay_report(conn, run_id))


__all__ = ["router"]
