"""Schedules: their fire times (APScheduler's triggers), what a caller may do with them, and the
sweep that fires them from the store.

Exactly one run per fire time, whatever restarts: the sweep first decides each due fire time in
one transaction with the schedule's row locked (``advance``: the fire's row, the counters, the
last nominal time handled), then submits the started ones (``submit_started``) through the same
builder as ``POST /factory/runs`` (``edge.commands.submit_run``) as the schedule's owner, with
the idempotency key of the fire time (``domain.schedules.idempotency_key``), and marks each
submitted. A sweep killed anywhere in between leaves either a fire not yet decided (decided by
the next sweep) or a fire decided and not marked (submitted again by the next sweep: the key
finds the run the first submission started). Nothing of it is held in memory.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.base import BaseTrigger
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger
from sqlalchemy import Connection

from schemas.api import SubmitRunRequest

from .commands import Command, SubmitResult
from .domain import Limits, Principal, Role, errors
from .domain.access import Operation
from .domain.schedules import (
    DEFAULT_CATCH_UP_S,
    FireKind,
    FireOutcome,
    Overlap,
    ScheduleSpec,
    Timing,
    decide,
    due_at,
    idempotency_key,
    missed,
)
from .edge import commands
from .edge.auth import Caller
from .edge.commands import Outside
from .store import Database
from .store import schedules as store
from .store.database import refused_if_moved

log = logging.getLogger(__name__)

# Fire times one sweep decides per schedule at most (a long outage's misses are counted over
# several sweeps rather than in one long transaction).
MAX_FIRES_PER_SWEEP = 1000
MAX_BACKFILL_FIRES = 1000
# The fire times a new schedule's past startAt may leave the sweep to decide (ten sweeps'
# worth); a start further back is refused rather than counted for hours.
MAX_PAST_FIRES = 10 * MAX_FIRES_PER_SWEEP
SCHEDULES_PER_SWEEP = 100
SUBMISSIONS_PER_SWEEP = 200
TICK = timedelta(microseconds=1)

Send = Callable[[Command[Any]], Awaitable[Any]]


# ---------------------------------------------------------------------- fire times


def trigger(timing: Timing, anchor: datetime) -> BaseTrigger:
    """The APScheduler trigger of ``timing``; an interval counts from ``start_at`` or else
    ``anchor`` (the schedule's creation). Raises ``ValidationFailed`` for a bad expression or
    an unknown time zone."""
    try:
        zone = ZoneInfo(timing.time_zone)
    except (ZoneInfoNotFoundError, ValueError):
        raise errors.ValidationFailed(
            f"timeZone must be an IANA zone (Europe/Berlin, UTC), not {timing.time_zone!r}",
            field="timeZone",
        ) from None
    if timing.interval_seconds is not None:
        return IntervalTrigger(
            seconds=timing.interval_seconds,
            start_date=timing.start_at or anchor,
            end_date=timing.end_at,
            timezone=zone,
        )
    assert timing.cron is not None
    fields = timing.cron.split()
    if len(fields) == 5:
        fields = ["0", *fields]
    second, minute, hour, day, month, day_of_week = fields
    try:
        return CronTrigger(
            second=second,
            minute=minute,
            hour=hour,
            day=day,
            month=month,
            day_of_week=crontab_weekdays(day_of_week),
            start_date=timing.start_at,
            end_date=timing.end_at,
            timezone=zone,
        )
    except ValueError as exc:
        raise errors.ValidationFailed(f"cron: {exc}", field="cron") from None


_WEEKDAYS = ("sun", "mon", "tue", "wed", "thu", "fri", "sat", "sun")


def crontab_weekdays(field: str) -> str:
    """A crontab weekday field (0 and 7 are Sunday) as APScheduler 3 reads it: by name (its
    numbers start at Monday). A step (``*/2``) stays a number."""

    def name(m: re.Match[str]) -> str:
        n = int(m.group(1))
        if n >= len(_WEEKDAYS):
            raise errors.ValidationFailed(
                f"cron: a weekday must be 0 to 7 (0 and 7 are Sunday), not {n}", field="cron"
            )
        return _WEEKDAYS[n]

    return re.sub(r"(?<![/\d])(\d+)", name, field)


def next_nominal(fires: BaseTrigger, after: datetime) -> datetime | None:
    """The first nominal fire time strictly after ``after`` (None: the schedule has ended)."""
    try:
        found: datetime | None = fires.get_next_fire_time(None, after + TICK)
    except OverflowError:  # past the year 9999
        return None
    if found is None or found <= after:  # the trigger clamps at the end of time
        return None
    return found.astimezone(UTC)


def upcoming(fires: BaseTrigger, after: datetime, n: int) -> list[datetime]:
    out: list[datetime] = []
    while len(out) < n:
        nominal = next_nominal(fires, after)
        if nominal is None:
            break
        out.append(nominal)
        after = nominal
    return out


# ---------------------------------------------------------------------- stored form


@dataclass(frozen=True, slots=True)
class Stored:
    """A schedule's row as the sweep and the routes use it."""

    schedule_id: UUID
    tenant_id: str
    spec: ScheduleSpec
    run: dict[str, Any]  # the body of POST /factory/runs it submits (camelCase)
    created_at: datetime

    @classmethod
    def of(cls, row: Any) -> Stored:
        return cls(
            row.schedule_id, row.tenant_id, spec_of(row.spec), row.spec["run"], row.created_at
        )

    def fires(self) -> BaseTrigger:
        return trigger(self.spec.timing, self.created_at)

    def due_at(self, nominal: datetime) -> datetime:
        return due_at(self.schedule_id, nominal, self.spec.timing.jitter_seconds)


def _when(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def spec_of(doc: dict[str, Any]) -> ScheduleSpec:
    """The stored spec (the API's camelCase body, less ``paused`` and ``note``)."""
    timing = Timing(
        cron=doc.get("cron"),
        time_zone=doc.get("timeZone") or "UTC",
        interval_seconds=doc.get("intervalSeconds"),
        jitter_seconds=doc.get("jitterSeconds") or 0.0,
        start_at=_when(doc.get("startAt")),
        end_at=_when(doc.get("endAt")),
    )
    return ScheduleSpec(
        timing=timing,
        overlap=Overlap(doc.get("overlap") or Overlap.SKIP),
        catch_up_seconds=doc.get("catchUpWindowSeconds", DEFAULT_CATCH_UP_S),
    )


def checked(doc: dict[str, Any], anchor: datetime) -> ScheduleSpec:
    """The spec of ``doc``, refused (422) unless its timing yields fire times."""
    spec = spec_of(doc)
    spec.check()
    trigger(spec.timing, anchor)
    return spec


# ---------------------------------------------------------------------- the owner


def owner_caller(row: Any) -> Caller:
    principal = Principal(
        subject=row.owner,
        tenant_id=row.tenant_id,
        project_id=row.project_id,
        roles=frozenset(Role(r) for r in row.owner_roles),
    )
    return Caller(principal, frozenset(row.owner_scopes))


def submission(o: Outside, run: dict[str, Any], key: str, correlation_id: str) -> Any:
    """The SubmitRun a fire time sends: the HTTP route's builder, on the stored body."""
    body = SubmitRunRequest.model_validate(run)
    limits = Limits(**body.limits.model_dump())
    fields = body.model_dump(exclude={"limits"})
    return commands.submit_run(o, key, correlation_id=correlation_id, limits=limits, **fields)


async def check_submittable(o: Outside, run: dict[str, Any]) -> None:
    """A schedule is created (or its run changed) only by a caller who may submit that run
    now: the builder's checks (permission, priority) on a trial key, and the release it names
    in the catalog (404 otherwise). Nothing is sent."""
    command = submission(o, run, "schedule-check", "schedule-check")
    request = command.request
    found = await o.read(
        lambda conn: store.release_named(
            conn, request.workflow_id, request.release_alias, request.release_id
        )
    )
    if not found:
        raise errors.NotFound(
            f"workflow {request.workflow_id} has no release "
            f"{request.release_id or request.release_alias or 'latest'} in this tenant"
        )


# ---------------------------------------------------------------------- deciding fire times


@dataclass
class Advance:
    """What one pass over a schedule decided."""

    started: int = 0
    skipped: int = 0
    missed: int = 0
    buffered_at: datetime | None = None


def fire(
    conn: Connection,
    s: Stored,
    nominal: datetime,
    kind: FireKind,
    now: datetime,
    tally: Advance,
    overlap: Overlap | None = None,
) -> FireOutcome | None:
    """Decide one fire time under the overlap policy and record it; None when it was decided
    already (each fire time once)."""
    open_now = store.open_runs(conn, s.schedule_id)
    decision = decide(overlap or s.spec.overlap, len(open_now), tally.buffered_at is not None)
    cancels = [r for r in open_now if r is not None] if decision.cancel_open else None
    recorded = store.record_fire(
        conn,
        tenant_id=s.tenant_id,
        schedule_id=s.schedule_id,
        nominal_at=nominal,
        kind=kind.value,
        outcome=decision.outcome.value,
        cancels=cancels,
        now=now,
    )
    if not recorded:
        return None
    if decision.outcome is FireOutcome.STARTED:
        tally.started += 1
    elif decision.outcome is FireOutcome.SKIPPED:
        tally.skipped += 1
    elif decision.outcome is FireOutcome.BUFFERED:
        tally.buffered_at = nominal
    return decision.outcome


def advance(conn: Connection, row: Any, now: datetime) -> Advance:
    """Decide the schedule's due fire times (its row locked by the caller): a buffered one
    whose open runs ended starts; each due one is missed (older than the catch-up window),
    or started, skipped or buffered by the overlap policy. Then the row's sweep state."""
    s = Stored.of(row)
    tally = Advance(buffered_at=row.buffered_at)
    if tally.buffered_at is not None and not store.open_runs(conn, s.schedule_id):
        store.start_buffered(conn, s.schedule_id, tally.buffered_at)
        tally.started += 1
        tally.buffered_at = None
    fires = s.fires()
    after = row.last_nominal_at or row.created_at
    next_fire: datetime | None = now  # more to decide at the next sweep, unless found below
    for _ in range(MAX_FIRES_PER_SWEEP):
        nominal = next_nominal(fires, after)
        if nominal is None:
            next_fire = None
            break
        due = s.due_at(nominal)
        if due > now:
            next_fire = due
            break
        after = nominal
        if missed(due, now, s.spec.catch_up_seconds):
            tally.missed += 1
            continue
        fire(conn, s, nominal, FireKind.SCHEDULED, now, tally)
    store.update_schedule(
        conn,
        s.schedule_id,
        last_nominal_at=after,
        next_fire_at=next_fire,
        buffered_at=tally.buffered_at,
    )
    store.count(
        conn, s.schedule_id, started=tally.started, skipped=tally.skipped, missed=tally.missed
    )
    return tally


def decide_due(db: Database, now: datetime) -> int:
    """The sweep's first half: every due schedule advanced, each in the one transaction that
    locks it. Answers how many fire times started."""
    with db.system_tx() as conn:
        return sum(
            _advance_unless_moved(conn, row, now)
            for row in store.due_schedules(conn, now, SCHEDULES_PER_SWEEP)
        )


def _advance_unless_moved(conn: Connection, row: Any, now: datetime) -> int:
    """``advance`` in a savepoint: a schedule whose tenant's shard is moving (its writes
    refused by the fence, docs/sharding.md) is left as it was, for the database it moves to,
    and the sweep goes on with the other tenants'. How many fire times started."""
    try:
        with refused_if_moved(), conn.begin_nested():
            return advance(conn, row, now).started
    except errors.ShardMoved as moved:
        log.info("schedule %s not advanced here: %s", row.schedule_id, moved)
        return 0


async def submit_started(
    db: Database, send: Send, now: Callable[[], datetime], *, routed: Database | None = None
) -> int:
    """The sweep's second half: submit every started fire not yet submitted, as its schedule's
    owner, with the fire time's key; cancel-other's open runs are cancelled after it. A
    refusal that retrying cannot change (the release is gone, the owner may no longer submit)
    is recorded on the fire; anything else is tried again at the next sweep. ``db``: the shard
    database swept; ``routed``: every shard's, as the edge's (a run's id minted in its tenant's
    placement: docs/sharding.md), else ``db``."""

    def unsubmitted() -> list[Any]:
        with db.system_tx() as conn:
            return store.unsubmitted(conn, SUBMISSIONS_PER_SWEEP)

    def mark(f: Any, run_id: UUID | None, error: str | None) -> None:
        with db.system_tx() as conn:
            store.mark_submitted(
                conn, f.schedule_id, f.nominal_at, now(), run_id=run_id, error=error
            )

    submitted = 0
    pending = await asyncio.to_thread(unsubmitted)
    for f in pending:
        o = Outside(owner_caller(f), routed or db, "schedule")
        key = idempotency_key(f.schedule_id, f.nominal_at)
        run_id: UUID | None = None
        error: str | None = None
        try:
            command = submission(o, f.spec["run"], key, f"schedule:{f.schedule_id}")
            result: SubmitResult = await send(command)
            run_id = result.run_id
            for other in f.cancels or ():
                cancel = await commands.cancel_run(
                    o, key, run_id=UUID(other), reason="schedule overlap: cancel-other"
                )
                await send(cancel)
        except errors.RunControlError as refusal:
            if refusal.retryable or isinstance(refusal, errors.Unavailable):
                log.warning(
                    "schedule %s: fire %s not submitted yet: %s",
                    f.schedule_id,
                    f.nominal_at,
                    refusal,
                )
                continue
            error = f"{refusal.code}: {refusal}"
        try:
            await asyncio.to_thread(mark, f, run_id, error)
        except errors.ShardMoved as moved:  # marked on the database it moves to (same key)
            log.info("schedule %s: fire %s not marked here: %s", f.schedule_id, f.nominal_at, moved)
            continue
        submitted += 1
    return submitted


# ---------------------------------------------------------------------- callers' changes


def new_row(
    caller: Caller, doc: dict[str, Any], paused: bool, note: str | None, now: datetime
) -> dict[str, Any]:
    """The row of a new schedule owned by ``caller``; its first fire time after ``now``, or,
    its ``startAt`` past, its first one from then (the sweep decides those by the catch-up
    window: started within it, missed before)."""
    schedule_id = uuid4()
    spec = checked(doc, now)
    fires = trigger(spec.timing, now)
    after = _sweep_from(spec.timing.start_at, fires, now)
    first = next_nominal(fires, after)
    due = None if first is None else due_at(schedule_id, first, spec.timing.jitter_seconds)
    return {
        "schedule_id": schedule_id,
        "tenant_id": caller.tenant_id,
        "project_id": caller.principal.project_id,
        "owner": caller.principal.subject,
        "owner_roles": sorted(str(r) for r in caller.principal.roles),
        "owner_scopes": sorted(caller.scopes),
        "spec": doc,
        "paused": paused,
        "note": note,
        "last_nominal_at": after,
        "next_fire_at": due,
        "buffered_at": None,
        "started": 0,
        "skipped": 0,
        "missed": 0,
        "created_at": now,
        "updated_at": now,
    }


def _sweep_from(start_at: datetime | None, fires: BaseTrigger, now: datetime) -> datetime:
    """Where a new schedule's sweep starts: just before a past ``start_at``, else ``now``."""
    if start_at is None or start_at >= now:
        return now
    after = nominal = start_at - TICK
    for _ in range(MAX_PAST_FIRES + 1):
        found = next_nominal(fires, nominal)
        if found is None or found > now:
            return after
        nominal = found
    raise errors.ValidationFailed(
        f"startAt must be at most {MAX_PAST_FIRES} fire times in the past (each is started "
        "or counted missed by the catch-up window): move it later",
        field="startAt",
    )


def resumed_from(row: Any, doc: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The sweep state from ``now`` on (a resume, a new timing): the fire times passed while
    paused, or under the old timing, are not fired."""
    spec = checked(doc, row.created_at)
    after = max(row.last_nominal_at or row.created_at, now)
    nominal = next_nominal(trigger(spec.timing, row.created_at), after)
    due = None if nominal is None else due_at(row.schedule_id, nominal, spec.timing.jitter_seconds)
    return {"last_nominal_at": after, "next_fire_at": due}


# The PATCH fields a null clears (the others' null leaves them as they are).
CLEARABLE = frozenset({"note", "cron", "intervalSeconds", "startAt", "endAt"})
TIMING_FIELDS = (
    "cron",
    "timeZone",
    "intervalSeconds",
    "jitterSeconds",
    "startAt",
    "endAt",
    "overlap",
    "catchUpWindowSeconds",
)


def changed(caller: Caller, row: Any, given: dict[str, Any], now: datetime) -> dict[str, Any]:
    """The columns a change sets: ``given`` is the PATCH body's fields (camelCase). A resume or
    a new timing fires from ``now`` on; a new run makes the caller the owner."""
    doc = dict(row.spec)
    values: dict[str, Any] = {"updated_at": now}
    timing = {k: v for k, v in given.items() if k in TIMING_FIELDS}
    if timing:
        doc.update(timing)
        if doc.get("cron") is not None and doc.get("intervalSeconds") is not None:
            # the one given replaces the other
            doc["intervalSeconds" if "cron" in timing else "cron"] = None
    if "run" in given:
        doc["run"] = given["run"]
        values |= {
            "owner": caller.principal.subject,
            "owner_roles": sorted(str(r) for r in caller.principal.roles),
            "owner_scopes": sorted(caller.scopes),
            "project_id": caller.principal.project_id,
        }
    values["spec"] = doc
    if "note" in given:
        values["note"] = given["note"]
    paused = given.get("paused")
    if paused is not None:
        values["paused"] = paused
    resumed = row.paused and paused is False
    if timing or resumed:
        values |= resumed_from(row, doc, now)
    else:
        checked(doc, row.created_at)
    return values


def fire_now(conn: Connection, row: Any, now: datetime) -> FireOutcome | None:
    """Trigger now: the nominal time ``now``, under the overlap policy."""
    s = Stored.of(row)
    tally = Advance(buffered_at=row.buffered_at)
    outcome = fire(conn, s, now, FireKind.MANUAL, now, tally)
    _settle(conn, s, tally)
    return outcome


def backfill(
    conn: Connection,
    row: Any,
    start: datetime,
    end: datetime,
    overlap: Overlap | None,
    now: datetime,
) -> dict[str, int]:
    """Every fire time in ``[start, end)`` once, in order, under the overlap policy (or
    ``overlap`` for this backfill); a time already fired keeps its first decision."""
    s = Stored.of(row)
    fires = s.fires()
    times: list[datetime] = []
    after = start - TICK
    while True:
        nominal = next_nominal(fires, after)
        if nominal is None or nominal >= end:
            break
        times.append(nominal)
        if len(times) > MAX_BACKFILL_FIRES:
            raise errors.ValidationFailed(
                f"a backfill covers at most {MAX_BACKFILL_FIRES} fire times: bring endAt "
                "closer to startAt",
                field="endAt",
            )
        after = nominal
    tally = Advance(buffered_at=row.buffered_at)
    found = {o.value: 0 for o in FireOutcome if o is not FireOutcome.MISSED}
    found["alreadyFired"] = 0
    for nominal in times:
        outcome = fire(conn, s, nominal, FireKind.BACKFILL, now, tally, overlap)
        found["alreadyFired" if outcome is None else outcome.value] += 1
    _settle(conn, s, tally)
    return found


def _settle(conn: Connection, s: Stored, tally: Advance) -> None:
    store.update_schedule(conn, s.schedule_id, buffered_at=tally.buffered_at)
    store.count(conn, s.schedule_id, started=tally.started, skipped=tally.skipped)


def require_submitter(o: Outside) -> None:
    """Changing a schedule (or firing it) is submitting runs of its workflow."""
    o.admit(Operation.SUBMIT_RUN)
