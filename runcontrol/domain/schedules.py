"""Schedules: what one is, and what becomes of each of its fire times (pure, no I/O).

A schedule starts runs of one workflow (alias) with one input at the fire times of a cron
expression (in a time zone) or of an interval, between optional start and end times. Each
nominal fire time starts at most one run: the run's idempotency key is derived from the
schedule and the nominal time (``idempotency_key``), so a sweep that fires it again after a
restart finds the run the first one started. The fire times themselves come from APScheduler's
triggers (``runcontrol.schedules``: this module imports nothing but the standard library).

What a due fire time becomes (``decide``) depends on the overlap policy when a run the schedule
started is still open, and on the catch-up window: a fire time older than the window when the
sweep finds it (the service was down) is missed, counted and never started.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import StrEnum
from uuid import UUID

from . import errors

MAX_JITTER_S = 3600.0
MIN_INTERVAL_S = 1.0
MAX_INTERVAL_S = 366 * 86400.0
MIN_CATCH_UP_S = 1.0
MAX_CATCH_UP_S = 366 * 86400.0
DEFAULT_CATCH_UP_S = 300.0
MAX_NOTE = 1000


class Overlap(StrEnum):
    """What a fire time does while a run the schedule started is still open (Temporal's)."""

    SKIP = "skip"  # the fire time is skipped (counted)
    BUFFER_ONE = "buffer-one"  # kept until the open run ends, then started; a second skipped
    ALLOW_ALL = "allow-all"  # started anyway
    CANCEL_OTHER = "cancel-other"  # started, and the open runs are cancelled


class FireOutcome(StrEnum):
    STARTED = "started"
    SKIPPED = "skipped"  # by the overlap policy
    BUFFERED = "buffered"  # waits for the open run to end (buffer-one)
    MISSED = "missed"  # older than the catch-up window when found (counted, not stored)


class FireKind(StrEnum):
    SCHEDULED = "scheduled"
    BACKFILL = "backfill"
    MANUAL = "manual"  # trigger now


@dataclass(frozen=True, slots=True)
class Timing:
    """When a schedule fires: a cron expression (5 fields, or 6 with seconds first) in
    ``time_zone``, or every ``interval_seconds`` from ``start_at`` (its creation if None)."""

    cron: str | None = None
    time_zone: str = "UTC"
    interval_seconds: float | None = None
    jitter_seconds: float = 0.0
    start_at: datetime | None = None
    end_at: datetime | None = None

    def check(self) -> None:
        if (self.cron is None) == (self.interval_seconds is None):
            raise errors.ValidationFailed(
                "exactly one of cron and intervalSeconds must be given", field="cron"
            )
        if self.cron is not None and not 5 <= len(self.cron.split()) <= 6:
            raise errors.ValidationFailed(
                "cron must have 5 fields (minute hour day month weekday), or 6 with seconds first",
                field="cron",
            )
        if self.interval_seconds is not None and not (
            MIN_INTERVAL_S <= self.interval_seconds <= MAX_INTERVAL_S
        ):
            raise errors.ValidationFailed(
                f"intervalSeconds must be {MIN_INTERVAL_S:g} to {MAX_INTERVAL_S:g}",
                field="intervalSeconds",
            )
        if not 0 <= self.jitter_seconds <= MAX_JITTER_S:
            raise errors.ValidationFailed(
                f"jitterSeconds must be 0 to {MAX_JITTER_S:g}", field="jitterSeconds"
            )
        if self.start_at and self.end_at:
            check_window(self.start_at, self.end_at)


def check_window(start_at: datetime, end_at: datetime) -> None:
    """A schedule's ``[startAt, endAt)``, or a backfill's: refused unless it holds time."""
    if end_at <= start_at:
        raise errors.ValidationFailed("endAt must be after startAt", field="endAt")


@dataclass(frozen=True, slots=True)
class ScheduleSpec:
    """When a schedule fires and how its fire times are handled (what it submits is the body
    of a run submission, checked by the submission's own rules)."""

    timing: Timing
    overlap: Overlap = Overlap.SKIP
    catch_up_seconds: float = DEFAULT_CATCH_UP_S

    def check(self) -> None:
        self.timing.check()
        if not MIN_CATCH_UP_S <= self.catch_up_seconds <= MAX_CATCH_UP_S:
            raise errors.ValidationFailed(
                f"catchUpWindowSeconds must be {MIN_CATCH_UP_S:g} to {MAX_CATCH_UP_S:g}",
                field="catchUpWindowSeconds",
            )


def idempotency_key(schedule_id: UUID, nominal_at: datetime) -> str:
    """The run key of one fire time: the same for every sweep, backfill or trigger that fires
    it (a backfill over a time already fired finds the run it started)."""
    return f"schedule:{schedule_id}:{nominal_at.isoformat(timespec='microseconds')}"


def jitter(schedule_id: UUID, nominal_at: datetime, jitter_seconds: float) -> timedelta:
    """A fire time's delay, spread over ``[0, jitter_seconds)`` and the same at every sweep
    (a hash of the schedule and the time, not a random draw: a restart keeps it)."""
    if jitter_seconds <= 0:
        return timedelta(0)
    digest = hashlib.sha256(f"{schedule_id}:{nominal_at.isoformat()}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    return timedelta(seconds=jitter_seconds * fraction)


def due_at(schedule_id: UUID, nominal_at: datetime, jitter_seconds: float) -> datetime:
    """When the fire time ``nominal_at`` is submitted: with its jitter (none past year 9999)."""
    try:
        return nominal_at + jitter(schedule_id, nominal_at, jitter_seconds)
    except OverflowError:
        return nominal_at


@dataclass(frozen=True, slots=True)
class Decision:
    outcome: FireOutcome
    cancel_open: bool = False  # cancel-other: the open runs are cancelled


def decide(overlap: Overlap, open_runs: int, buffered: bool) -> Decision:
    """What a due fire time becomes, given the runs the schedule started that are still open
    and whether a fire time is already buffered."""
    if open_runs == 0 or overlap is Overlap.ALLOW_ALL:
        return Decision(FireOutcome.STARTED)
    if overlap is Overlap.CANCEL_OTHER:
        return Decision(FireOutcome.STARTED, cancel_open=True)
    if overlap is Overlap.BUFFER_ONE and not buffered:
        return Decision(FireOutcome.BUFFERED)
    return Decision(FireOutcome.SKIPPED)


def missed(due_at: datetime, now: datetime, catch_up_seconds: float) -> bool:
    """A fire time found more than the catch-up window after it was due is missed."""
    return (now - due_at).total_seconds() > catch_up_seconds
