"""``GET /factory/schemas/events`` over real HTTP: read scope, every event type's payload
schema, and a run's event history valid against what is served."""

from __future__ import annotations

from api_harness import TenantView, assert_problem
from jsonschema import Draft202012Validator

from runcontrol.api.auth import RUNS_READ, RUNS_WRITE
from runcontrol.domain import Role
from runcontrol.domain.events import EVENT_TYPES


def test_a_reader_gets_every_schema_and_a_run_history_matches_them(t: TenantView) -> None:
    t.publish()
    run_id = t.submit()
    t.succeed(t.claim(run_id))
    t.wait_state(run_id, "Completed")

    reader = t.user("reader", Role.OBSERVER, scopes=[RUNS_READ])
    served = reader.get("/factory/schemas/events")
    assert served.status_code == 200, served.text
    schemas = served.json()["eventTypes"]
    assert set(schemas) == set(EVENT_TYPES)

    history = t.requester().get(f"/factory/runs/{run_id}/events/history")
    assert history.status_code == 200, history.text
    events = history.json()
    assert [e["type"] for e in events][-1] == "RunCompleted"
    for event in events:
        entry = schemas[event["type"]]
        assert event["topic"] == entry["topic"]
        validator = Draft202012Validator(entry["payload"])
        assert not list(validator.iter_errors(event["payload"])), event


def test_schemas_need_the_read_scope(t: TenantView) -> None:
    with t.api.client() as anonymous:
        assert_problem(anonymous.get("/factory/schemas/events"), 401, "unauthorized")
    writer = t.user("writer", Role.REQUESTER, scopes=[RUNS_WRITE])
    assert_problem(writer.get("/factory/schemas/events"), 403, "insufficient-scope")
