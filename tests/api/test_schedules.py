"""Schedules over HTTP, fired by the session's real scheduler: create, show, change, pause
and resume, trigger now, backfill, delete; bad input and other tenants' probes."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from api_harness import REQUESTER, TenantView, assert_problem, wait_until
from sqlalchemy import func, select

from runcontrol.api.auth import RUNS_READ
from runcontrol.domain import Role
from runcontrol.store import Database
from runcontrol.store.tables import runs, schedules

URL = "/factory/schedules"


def body(t: TenantView, **overrides: Any) -> dict[str, Any]:
    b: dict[str, Any] = {"run": t.body(), "cron": "0 3 * * *", "timeZone": "Europe/Berlin"}
    b.update(overrides)
    return b


def stored(db: Database, tenant: str) -> int:
    with db.tenant(tenant) as conn:
        return int(conn.execute(select(func.count()).select_from(schedules)).scalar_one())


def schedule_runs(db: Database, tenant: str, schedule_id: str) -> list[Any]:
    with db.tenant(tenant) as conn:
        return list(
            conn.execute(
                select(runs.c.run_id, runs.c.idempotency_key, runs.c.requested_by).where(
                    runs.c.idempotency_key.like(f"schedule:{schedule_id}:%")
                )
            )
        )


def test_create_show_pause_resume_and_delete(t: TenantView, db: Database) -> None:
    t.publish()
    created = t.requester().post(URL, json=body(t))
    assert created.status_code == 201, created.text
    view = created.json()
    sid = view["scheduleId"]
    assert created.headers["Location"] == f"{URL}/{sid}"
    assert view["owner"] == REQUESTER and view["overlap"] == "skip"
    assert view["catchUpWindowSeconds"] == 300 and view["run"]["workflowId"] == t.workflow
    first, second = (datetime.fromisoformat(x) for x in view["nextFireTimes"][:2])
    assert second - first == timedelta(days=1) and first.astimezone(UTC).hour in (1, 2)
    assert [s["scheduleId"] for s in t.requester().get(URL).json()["items"]] == [sid]

    paused = t.requester().patch(f"{URL}/{sid}", json={"paused": True, "note": "freeze"})
    assert paused.status_code == 200, paused.text
    assert paused.json()["paused"] is True and paused.json()["note"] == "freeze"
    # Paused, nothing is next: neither a next fire time nor the ones after it.
    assert paused.json()["nextFireAt"] is None and paused.json()["nextFireTimes"] == []
    assert t.requester().get(URL).json()["items"][0]["nextFireAt"] is None
    resumed = t.requester().patch(f"{URL}/{sid}", json={"paused": False, "note": "thawed"})
    assert resumed.json()["paused"] is False and resumed.json()["nextFireTimes"]
    assert resumed.json()["nextFireAt"] is not None
    timed = t.requester().patch(f"{URL}/{sid}", json={"intervalSeconds": 3600})
    assert timed.status_code == 200, timed.text
    assert timed.json()["cron"] is None and timed.json()["intervalSeconds"] == 3600

    assert t.requester().delete(f"{URL}/{sid}").status_code == 204
    assert_problem(t.requester().get(f"{URL}/{sid}"), 404, "schedule-not-found")
    assert_problem(t.requester().delete(f"{URL}/{sid}"), 404, "schedule-not-found")


def test_bad_input_is_a_clear_4xx_and_stores_nothing(t: TenantView, db: Database) -> None:
    t.publish()
    http = t.requester()
    cases: list[tuple[dict[str, Any], int, str | None]] = [
        (body(t, cron="61 * * * *"), 422, "validation-failed"),
        (body(t, cron="* * *"), 422, None),
        (body(t, timeZone="Mars/Olympus"), 422, "validation-failed"),
        (body(t, intervalSeconds=60), 422, "validation-failed"),  # cron and interval
        (body(t, cron=None), 422, "validation-failed"),  # neither
        (body(t, cron=None, intervalSeconds=0.1), 422, "validation-failed"),
        (body(t, jitterSeconds=-1), 422, "validation-failed"),
        (body(t, catchUpWindowSeconds=0), 422, "validation-failed"),
        (body(t, overlap="sometimes"), 422, None),
        (body(t, startAt="2026-01-01T00:00:00"), 422, None),  # no zone
        (body(t, startAt="2026-02-01T00:00:00Z", endAt="2026-01-01T00:00:00Z"), 422, None),
        (body(t, run={**t.body(), "workflowId": "no-such-workflow"}), 404, "not-found"),
        (body(t, run={**t.body(), "releaseAlias": "nope"}), 404, "not-found"),
        (body(t, run={**t.body(), "priority": 5}), 403, "forbidden"),
        (body(t, run={"workflowId": t.workflow}), 422, None),
    ]
    for case, status, code in cases:
        assert_problem(http.post(URL, json=case), status, code)
    # An unknown field is refused, named (a typo is not silently the default timing); the
    # run inside keeps SubmitRun's rules. Timing errors say what must change.
    for typo in ("color", "intervalSecond"):
        refused = assert_problem(http.post(URL, json=body(t, **{typo: 60})), 422)
        assert [e["field"] for e in refused["errors"]] == [typo], refused
    inverted = {"startAt": "2026-01-02T00:00:00Z", "endAt": "2026-01-01T00:00:00Z"}
    refused = assert_problem(http.post(URL, json=body(t, **inverted)), 422, "validation-failed")
    assert refused["detail"] == "endAt must be after startAt", refused
    # Reading runs does not let one schedule them.
    reader = t.user("olive", Role.OBSERVER)
    assert_problem(reader.post(URL, json=body(t)), 403)
    assert_problem(
        t.user(REQUESTER, Role.REQUESTER, scopes=[RUNS_READ]).post(URL, json=body(t)), 403
    )
    assert stored(db, t.tenant) == 0

    sid = http.post(URL, json=body(t)).json()["scheduleId"]
    assert_problem(http.patch(f"{URL}/{sid}", json={"cron": "99 * * * *"}), 422)
    assert_problem(http.patch(f"{URL}/{sid}", json={"unknown": 1}), 422)
    # null leaves a field as it is, except where it clears one (then the timing must hold)
    kept = http.patch(f"{URL}/{sid}", json={"run": None, "paused": None, "note": None})
    assert kept.status_code == 200, kept.text
    assert_problem(http.patch(f"{URL}/{sid}", json={"cron": None}), 422, "validation-failed")
    refused = assert_problem(http.post(f"{URL}/{sid}/backfill", json=inverted), 422)
    assert refused["detail"] == "endAt must be after startAt", refused
    assert_problem(  # over 1,000 fire times
        http.post(
            f"{URL}/{sid}/backfill",
            json={"startAt": "2020-01-01T00:00:00Z", "endAt": "2026-01-01T00:00:00Z"},
        ),
        422,
        "validation-failed",
    )
    assert http.get(f"{URL}/{sid}").json()["cron"] == "0 3 * * *"  # unchanged
    assert http.get(f"{URL}/{sid}").json()["lastFires"] == []


def test_another_tenant_or_project_sees_404(t: TenantView, db: Database) -> None:
    t.publish()
    sid = t.requester().post(URL, json=body(t)).json()["scheduleId"]
    other = TenantView(t.api, t.runtime, f"t-other-{uuid.uuid4().hex[:8]}")
    elsewhere = t.api.client(t.api.token(t.tenant, "paula", (Role.REQUESTER,), project="proj-2"))
    try:
        for http in (other.requester(), elsewhere):
            assert_problem(http.get(f"{URL}/{sid}"), 404, "schedule-not-found")
            assert_problem(http.patch(f"{URL}/{sid}", json={"paused": True}), 404)
            assert_problem(http.post(f"{URL}/{sid}/trigger"), 404)
            assert_problem(
                http.post(
                    f"{URL}/{sid}/backfill",
                    json={"startAt": "2026-01-01T00:00:00Z", "endAt": "2026-01-02T00:00:00Z"},
                ),
                404,
            )
            assert_problem(http.delete(f"{URL}/{sid}"), 404)
            assert http.get(URL).json()["items"] == []
    finally:
        other.close()
        elsewhere.close()
    assert t.requester().get(f"{URL}/{sid}").json()["paused"] is False


def test_trigger_now_and_a_backfill_start_one_run_per_fire_time(
    t: TenantView, db: Database
) -> None:
    t.publish()
    start = datetime(2026, 1, 1, tzinfo=UTC)
    sid = (
        t.requester()
        .post(
            URL,
            json=body(
                t,
                cron=None,
                intervalSeconds=2,
                startAt=start.isoformat(),
                endAt=(start + timedelta(minutes=5)).isoformat(),  # ended: only what we fire
                overlap="allow-all",
            ),
        )
        .json()["scheduleId"]
    )
    # A reviewer (not a submitter) may not fire it.
    assert_problem(t.reviewer().post(f"{URL}/{sid}/trigger"), 403)
    window = {"startAt": start.isoformat(), "endAt": (start + timedelta(minutes=1)).isoformat()}
    filled = t.user("sam", Role.REQUESTER).post(f"{URL}/{sid}/backfill", json=window)
    assert filled.status_code == 202, filled.text
    counts = {"skipped": 0, "buffered": 0, "paused": False}
    assert filled.json() == {"started": 30, "alreadyFired": 0, **counts}
    again = t.requester().post(f"{URL}/{sid}/backfill", json=window)
    assert again.json() == {"started": 0, "alreadyFired": 30, **counts}
    # The sweep submits them as the owner, one run per fire time.
    found = wait_until(lambda: (r := schedule_runs(db, t.tenant, sid)) and len(r) == 30 and r, 30)
    assert {r.requested_by for r in found} == {REQUESTER}  # the owner's, not sam's
    nominal = {r.idempotency_key.rsplit(":", 3)[0] for r in found}
    assert len({r.idempotency_key for r in found}) == 30 and len(nominal) == 1
    view = t.requester().get(f"{URL}/{sid}").json()
    assert view["started"] == 30 and view["nextFireTimes"] == []
    assert len(view["lastFires"]) == 10
    assert all(f["kind"] == "backfill" and f["runId"] for f in view["lastFires"])

    trigger = t.requester().post(f"{URL}/{sid}/trigger")
    assert trigger.status_code == 202 and trigger.json()["outcome"] == "started"
    wait_until(lambda: len(schedule_runs(db, t.tenant, sid)) == 31, 30)


def test_a_paused_schedule_fires_only_by_hand_and_says_so(t: TenantView, db: Database) -> None:
    """A pause stops the schedule's own fire times; a trigger or a backfill is an operator's
    explicit act and fires through it (Temporal's rule), its answer saying it was paused."""
    t.publish()
    start = datetime.now(UTC) - timedelta(seconds=10)
    timing = {"cron": None, "intervalSeconds": 2, "startAt": start.isoformat()}
    created = t.requester().post(
        URL, json=body(t, **timing, overlap="allow-all", paused=True, note="by hand only")
    )
    assert created.status_code == 201, created.text
    sid = created.json()["scheduleId"]
    assert created.json()["nextFireAt"] is None and created.json()["nextFireTimes"] == []
    window = {"startAt": start.isoformat(), "endAt": (start + timedelta(seconds=10)).isoformat()}
    filled = t.requester().post(f"{URL}/{sid}/backfill", json=window)
    assert filled.status_code == 202, filled.text
    assert filled.json() == {
        "started": 5,
        "skipped": 0,
        "buffered": 0,
        "alreadyFired": 0,
        "paused": True,
    }
    fired = t.requester().post(f"{URL}/{sid}/trigger")
    assert fired.status_code == 202 and fired.json()["outcome"] == "started"
    assert fired.json()["paused"] is True
    wait_until(lambda: len(schedule_runs(db, t.tenant, sid)) == 6, 30)
    view = t.requester().get(f"{URL}/{sid}").json()
    assert view["paused"] is True and view["started"] == 6 and view["missed"] == 0
    assert {f["kind"] for f in view["lastFires"]} == {"backfill", "manual"}
