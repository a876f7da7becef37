"""Schedules' fire times (APScheduler's triggers, in time zones and across DST) and what a due
fire time becomes (the overlap policies, the catch-up window): pure, no database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from runcontrol.domain import errors
from runcontrol.domain.schedules import (
    FireOutcome,
    Overlap,
    ScheduleSpec,
    Timing,
    decide,
    idempotency_key,
    jitter,
    missed,
)
from runcontrol.schedules import crontab_weekdays, next_nominal, trigger, upcoming

ANCHOR = datetime(2026, 1, 1, tzinfo=UTC)


def times(timing: Timing, after: datetime, n: int) -> list[datetime]:
    return upcoming(trigger(timing, ANCHOR), after, n)


def test_cron_in_a_time_zone_fires_at_local_wall_time() -> None:
    daily = Timing(cron="30 9 * * *", time_zone="America/New_York")
    assert times(daily, datetime(2026, 7, 1, tzinfo=UTC), 2) == [
        datetime(2026, 7, 1, 13, 30, tzinfo=UTC),  # EDT, UTC-4
        datetime(2026, 7, 2, 13, 30, tzinfo=UTC),
    ]
    assert times(daily, datetime(2026, 1, 10, tzinfo=UTC), 1) == [
        datetime(2026, 1, 10, 14, 30, tzinfo=UTC)  # EST, UTC-5
    ]


def test_spring_forward_a_skipped_wall_time_fires_once_an_hour_later() -> None:
    # Europe/Berlin, 2026-03-29: 02:00 CET jumps to 03:00 CEST, so 02:30 never happens.
    daily = Timing(cron="30 2 * * *", time_zone="Europe/Berlin")
    fired = times(daily, datetime(2026, 3, 27, 12, tzinfo=UTC), 3)
    assert fired == [
        datetime(2026, 3, 28, 1, 30, tzinfo=UTC),  # 02:30 CET
        datetime(2026, 3, 29, 1, 30, tzinfo=UTC),  # the instant 02:30 CET would be (03:30 CEST)
        datetime(2026, 3, 30, 0, 30, tzinfo=UTC),  # 02:30 CEST
    ]
    assert len(set(fired)) == 3


def test_fall_back_a_repeated_wall_time_fires_at_both_instants() -> None:
    # Europe/Berlin, 2026-10-25: 03:00 CEST goes back to 02:00 CET, so 02:30 happens twice:
    # APScheduler's trigger gives both instants, two nominal times, one run each (documented
    # in docs/schedules.md; pick a time outside 02:00-03:00 for once a day).
    daily = Timing(cron="30 2 * * *", time_zone="Europe/Berlin")
    fired = times(daily, datetime(2026, 10, 24, 12, tzinfo=UTC), 3)
    assert fired == [
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),  # 02:30 CEST
        datetime(2026, 10, 25, 1, 30, tzinfo=UTC),  # 02:30 CET, an hour later
        datetime(2026, 10, 26, 1, 30, tzinfo=UTC),
    ]


def test_hourly_cron_across_fall_back_counts_real_hours() -> None:
    hourly = Timing(cron="0 * * * *", time_zone="Europe/Berlin")
    fired = times(hourly, datetime(2026, 10, 24, 23, 30, tzinfo=UTC), 4)
    gaps = {b - a for a, b in zip(fired, fired[1:], strict=False)}
    assert gaps == {timedelta(hours=1)}


def test_six_fields_have_seconds_first_and_crontab_weekdays_start_on_sunday() -> None:
    every_two = Timing(cron="*/2 * * * * *")
    start = datetime(2026, 1, 1, 0, 0, 3, tzinfo=UTC)
    assert times(every_two, start, 2) == [
        start + timedelta(seconds=1),
        start + timedelta(seconds=3),
    ]
    assert crontab_weekdays("0") == "sun" and crontab_weekdays("1-5") == "mon-fri"
    assert crontab_weekdays("*/2") == "*/2" and crontab_weekdays("7,mon") == "sun,mon"
    sundays = Timing(cron="0 12 * * 0")
    (first,) = times(sundays, datetime(2026, 12, 1, tzinfo=UTC), 1)  # a Tuesday
    assert first == datetime(2026, 12, 6, 12, tzinfo=UTC) and first.weekday() == 6


def test_interval_counts_from_its_start_and_stops_at_its_end() -> None:
    timing = Timing(
        interval_seconds=2,
        start_at=ANCHOR,
        end_at=ANCHOR + timedelta(seconds=7),
    )
    assert times(timing, ANCHOR, 10) == [ANCHOR + timedelta(seconds=s) for s in (2, 4, 6)]
    assert next_nominal(trigger(timing, ANCHOR), ANCHOR + timedelta(seconds=6)) is None


@pytest.mark.parametrize(
    ("timing", "field"),
    [
        (Timing(), "cron"),
        (Timing(cron="* * * * *", interval_seconds=5), "cron"),
        (Timing(cron="* * *"), "cron"),
        (Timing(interval_seconds=0.5), "intervalSeconds"),
        (Timing(interval_seconds=5, jitter_seconds=-1), "jitterSeconds"),
        (Timing(interval_seconds=5, start_at=ANCHOR, end_at=ANCHOR), "endAt"),
    ],
)
def test_bad_timing_is_refused_with_its_field(timing: Timing, field: str) -> None:
    """Each refusal names its field and says what it must be (issue 46: "endAt is after
    startAt" told the opposite of what was wrong)."""
    with pytest.raises(errors.ValidationFailed) as refused:
        ScheduleSpec(timing=timing).check()
    assert refused.value.details["field"] == field
    assert field in str(refused.value) and " must " in str(refused.value), refused.value


@pytest.mark.parametrize(
    ("timing", "field"),
    [
        (Timing(cron="61 * * * *"), "cron"),
        (Timing(cron="* * * * 9"), "cron"),
        (Timing(cron="* * * * *", time_zone="Mars/Olympus"), "timeZone"),
    ],
)
def test_bad_expressions_and_zones_are_refused(timing: Timing, field: str) -> None:
    with pytest.raises(errors.ValidationFailed) as refused:
        trigger(timing, ANCHOR)
    assert refused.value.details["field"] == field and field in str(refused.value)


def test_overlap_policies() -> None:
    assert decide(Overlap.SKIP, 0, False).outcome is FireOutcome.STARTED
    assert decide(Overlap.SKIP, 1, False).outcome is FireOutcome.SKIPPED
    assert decide(Overlap.BUFFER_ONE, 1, False).outcome is FireOutcome.BUFFERED
    assert decide(Overlap.BUFFER_ONE, 1, True).outcome is FireOutcome.SKIPPED
    assert decide(Overlap.ALLOW_ALL, 3, True).outcome is FireOutcome.STARTED
    cancel = decide(Overlap.CANCEL_OTHER, 1, False)
    assert cancel.outcome is FireOutcome.STARTED and cancel.cancel_open
    assert not decide(Overlap.CANCEL_OTHER, 0, False).cancel_open


def test_catch_up_window_and_stable_keys_and_jitter() -> None:
    due = ANCHOR
    assert not missed(due, due + timedelta(seconds=10), 10)
    assert missed(due, due + timedelta(seconds=10.001), 10)
    schedule = uuid.uuid4()
    assert idempotency_key(schedule, ANCHOR) == idempotency_key(schedule, ANCHOR)
    assert idempotency_key(schedule, ANCHOR) != idempotency_key(schedule, ANCHOR + timedelta(1))
    spread = {jitter(schedule, ANCHOR + timedelta(seconds=s), 30) for s in range(50)}
    assert all(timedelta(0) <= j < timedelta(seconds=30) for j in spread) and len(spread) > 40
    assert jitter(schedule, ANCHOR, 30) == jitter(schedule, ANCHOR, 30)
    assert jitter(schedule, ANCHOR, 0) == timedelta(0)
