"""Schedules: create, list, show, change (pause and resume with a note), delete, trigger now
and backfill.

A schedule is tenant data under row-level security, seen and changed within the caller's
project unless a role spans the tenant. Changing one (or firing it) needs the permission to
submit its runs; the runs it starts are its owner's. The rules are ``runcontrol.schedules``';
the sweep that fires them is the scheduler's.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Path, Query, Response
from sqlalchemy import Connection

from schemas.api import (
    BackfillRequest,
    BackfillResponse,
    SchedulePage,
    SchedulePatch,
    ScheduleRequest,
    ScheduleView,
    TriggerResponse,
)

from .. import schedules as rules
from ..domain import errors
from ..domain.schedules import Overlap, check_window
from ..store import schedules as store
from .auth import RunsReader, RunSubmitter
from .context import Svc, found, location
from .problems import responses

router = APIRouter(prefix="/factory/schedules", tags=["schedules"])
ScheduleIdPath = Annotated[UUID, Path(alias="scheduleId")]
NEXT_FIRE_TIMES = 5


def _missing(schedule_id: UUID) -> errors.ScheduleNotFound:
    return errors.ScheduleNotFound(f"schedule {schedule_id} not found")


def _detail(conn: Connection, schedule_id: UUID, now: datetime) -> dict[str, Any] | None:
    row = store.get_row(conn, schedule_id)
    if row is None:
        return None
    view = store.schedule_view(row._mapping)
    if not row.paused and row.next_fire_at is not None:
        fires = rules.Stored.of(row).fires()
        after = max(row.last_nominal_at or row.created_at, now)
        view["nextFireTimes"] = rules.upcoming(fires, after, NEXT_FIRE_TIMES)
    view["lastFires"] = store.last_fires(conn, schedule_id)
    return view


@router.post(
    "",
    operation_id="CreateSchedule",
    status_code=201,
    response_model=ScheduleView,
    responses=responses(401, 403, 404, 413, 422),
    summary="A schedule that submits the given run at each fire time.",
    description="Scope `factory.runs.write`; the roles that submit runs. The caller must be "
    "able to submit `run` now (its workflow and alias exist, its priority is allowed): the "
    "runs the schedule starts are the caller's, in the caller's project.",
)
async def create_schedule(
    caller: RunSubmitter, svc: Svc, body: ScheduleRequest, response: Response
) -> dict[str, Any]:
    o = svc.outside(caller)
    doc = body.model_dump(mode="json", by_alias=True, exclude={"paused", "note"})
    await rules.check_submittable(o, doc["run"])
    now = datetime.now(UTC)
    row = rules.new_row(caller, doc, body.paused, body.note, now)

    def create(conn: Connection) -> dict[str, Any] | None:
        store.insert_schedule(conn, row)
        return _detail(conn, row["schedule_id"], now)

    created = await svc.read_in_scope(caller, create)
    response.headers["Location"] = location(router.prefix, row["schedule_id"])
    return found(created, _missing(row["schedule_id"]))


@router.get(
    "",
    operation_id="ListSchedules",
    response_model=SchedulePage,
    responses=responses(401, 403, 422),
    summary="The schedules in the caller's scope, oldest first; paged.",
    description="Scope `factory.runs.read`.",
)
async def list_schedules(
    caller: RunsReader,
    svc: Svc,
    cursor: Annotated[datetime | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=200)] = 50,
) -> dict[str, Any]:
    items = await svc.read_in_scope(
        caller, lambda conn: store.list_schedules(conn, cursor=cursor, limit=limit)
    )
    next_cursor = items[-1]["createdAt"] if len(items) == limit else None
    return {"items": items, "nextCursor": next_cursor}


@router.get(
    "/{scheduleId}",
    operation_id="GetSchedule",
    response_model=ScheduleView,
    responses=responses(401, 403, 404, 422),
    summary="A schedule with its next fire times, its last fires and their runs, and counts.",
    description="Scope `factory.runs.read`. Another tenant's or project's schedule is 404.",
)
async def get_schedule(caller: RunsReader, svc: Svc, schedule_id: ScheduleIdPath) -> Any:
    now = datetime.now(UTC)
    view = await svc.read_in_scope(caller, lambda conn: _detail(conn, schedule_id, now))
    return found(view, _missing(schedule_id))


@router.patch(
    "/{scheduleId}",
    operation_id="UpdateSchedule",
    response_model=ScheduleView,
    responses=responses(401, 403, 404, 413, 422),
    summary="Change a schedule: pause or resume with a note, its timing, policy or run.",
    description="Scope `factory.runs.write`. A resume or a new timing fires from now on (the "
    "fire times passed meanwhile are not fired); a new `run` makes the caller the owner.",
)
async def update_schedule(
    caller: RunSubmitter, svc: Svc, schedule_id: ScheduleIdPath, body: SchedulePatch
) -> Any:
    o = svc.outside(caller)
    given = {
        k: v
        for k, v in body.model_dump(mode="json", by_alias=True, exclude_unset=True).items()
        if v is not None or k in rules.CLEARABLE  # null elsewhere: left as it is
    }
    if "run" in given:
        await rules.check_submittable(o, given["run"])
    now = datetime.now(UTC)

    def change(conn: Connection) -> dict[str, Any] | None:
        row = store.get_row(conn, schedule_id, lock=True)
        if row is None:
            return None
        store.update_schedule(conn, schedule_id, **rules.changed(caller, row, given, now))
        return _detail(conn, schedule_id, now)

    return found(await svc.read_in_scope(caller, change), _missing(schedule_id))


@router.delete(
    "/{scheduleId}",
    operation_id="DeleteSchedule",
    status_code=204,
    responses=responses(401, 403, 404, 422),
    summary="Delete a schedule and its fire records (the runs it started stay).",
)
async def delete_schedule(caller: RunSubmitter, svc: Svc, schedule_id: ScheduleIdPath) -> Response:
    rules.require_submitter(svc.outside(caller))
    deleted = await svc.read_in_scope(caller, lambda conn: store.delete_schedule(conn, schedule_id))
    if not deleted:
        raise _missing(schedule_id)
    return Response(status_code=204)


@router.post(
    "/{scheduleId}/trigger",
    operation_id="TriggerSchedule",
    status_code=202,
    response_model=TriggerResponse,
    responses=responses(401, 403, 404, 422),
    summary="Fire the schedule now (nominal time: now), under its overlap policy.",
    description="Scope `factory.runs.write`. The run is submitted by the scheduler's sweep "
    "(within `scheduler.schedule_sweep_interval`), as the schedule's owner.",
)
async def trigger_schedule(caller: RunSubmitter, svc: Svc, schedule_id: ScheduleIdPath) -> Any:
    rules.require_submitter(svc.outside(caller))
    now = datetime.now(UTC)

    def fire(conn: Connection) -> dict[str, Any] | None:
        row = store.get_row(conn, schedule_id, lock=True)
        if row is None:
            return None
        outcome = rules.fire_now(conn, row, now)
        outcome_text = None if outcome is None else str(outcome)
        return {"nominalAt": now, "outcome": outcome_text, "paused": row.paused}

    return found(await svc.read_in_scope(caller, fire), _missing(schedule_id))


@router.post(
    "/{scheduleId}/backfill",
    operation_id="BackfillSchedule",
    status_code=202,
    response_model=BackfillResponse,
    responses=responses(401, 403, 404, 422),
    summary="Fire each fire time in [startAt, endAt) once, under the overlap policy.",
    description="Scope `factory.runs.write`. A fire time already fired (by the sweep, a "
    "trigger or an earlier backfill) keeps its first outcome and run. At most 1,000 fire "
    "times per call.",
)
async def backfill_schedule(
    caller: RunSubmitter, svc: Svc, schedule_id: ScheduleIdPath, body: BackfillRequest
) -> Any:
    rules.require_submitter(svc.outside(caller))
    check_window(body.start_at, body.end_at)
    now = datetime.now(UTC)
    overlap = None if body.overlap is None else Overlap(body.overlap)

    def backfill(conn: Connection) -> dict[str, Any] | None:
        row = store.get_row(conn, schedule_id, lock=True)
        if row is None:
            return None
        found = rules.backfill(conn, row, body.start_at, body.end_at, overlap, now)
        return {**found, "paused": row.paused}

    return found(await svc.read_in_scope(caller, backfill), _missing(schedule_id))
