"""Replays over real HTTP (docs/replay.md): ``POST /factory/runs/{runId}/replays`` starts a
replay of a finished run on the release an alias names now (an operator's control, idempotent
on its key), the run's view shows ``replayOf`` and its options, the list leaves it out unless
asked, and ``GET /factory/runs/{runId}/replay-report`` reports it (404 for a run that is not a
replay); the refusals (roles, an unfinished run, a bad option)."""

from __future__ import annotations

import json
import threading
from typing import Any

import httpx
import pytest
from api_harness import TenantView, assert_problem, wait_until

from runcontrol.cli import main
from runcontrol.domain import Role

BODY = {"reason": "before moving latest", "releaseAlias": "latest", "liveCalls": True}


def operator(t: TenantView) -> httpx.Client:
    return t.user("olga", Role.OPERATOR)


def listed(t: TenantView, query: str = "") -> set[str]:
    return {r["runId"] for r in operator(t).get(f"/factory/runs{query}").json()["items"]}


def test_a_replay_is_started_shown_listed_apart_and_reported(t: TenantView) -> None:
    t.publish()
    run_id = t.submit()
    path = f"/factory/runs/{run_id}/replays"
    assert_problem(operator(t).post(path, json=BODY), 409, "run-not-finished")
    t.succeed(t.claim(run_id))
    original = t.wait_state(run_id, "Completed")
    assert_problem(t.requester().post(path, json=BODY), 403)
    assert_problem(operator(t).post(path, json={**BODY, "approvals": "maybe"}), 422)
    release = t.publish()  # release 2: what `latest` names now
    started = operator(t).post(path, json=BODY, headers={"Idempotency-Key": "replay-1"})
    assert started.status_code == 201, started.text
    replay_id = started.json()["runId"]
    assert started.headers["Location"] == f"/factory/runs/{replay_id}"
    assert (started.json()["replayOf"], started.json()["created"]) == (run_id, True)
    again = operator(t).post(path, json=BODY, headers={"Idempotency-Key": "replay-1"})
    assert (again.json()["runId"], again.json()["created"]) == (replay_id, False)

    run = t.run(replay_id)
    assert (run["replayOf"], run["input"], run["releaseId"]) == (
        run_id,
        original["input"],
        release,
    )
    assert run["replay"] == {"liveCalls": True, "approvals": "park"}
    assert replay_id not in listed(t) and run_id in listed(t)
    assert listed(t, "?replays=only") == {replay_id}
    assert {run_id, replay_id} <= listed(t, "?replays=include")
    assert_problem(operator(t).get("/factory/runs?replays=all"), 422)

    found = operator(t).get(f"/factory/runs/{replay_id}/replay-report")
    assert found.status_code == 200, found.text
    report = found.json()
    assert (report["originalRunId"], report["replayRunId"]) == (run_id, replay_id)
    assert report["diverged"]  # its step has not run yet
    assert [s["step"] for s in report["steps"]] == [s["name"] for s in original["steps"]]
    not_a_replay = operator(t).get(f"/factory/runs/{run_id}/replay-report")
    assert_problem(not_a_replay, 404, "run-not-found")


def test_the_cli_replays_a_workflow_s_last_runs_and_summarises(
    t: TenantView,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Any,
) -> None:
    monkeypatch.setenv("RUNCONTROL_URL", t.api.base_url)
    monkeypatch.setenv("RUNCONTROL_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.setenv("RUNCONTROL_TOKEN", t.token("olga", Role.OPERATOR))
    t.publish()
    run_id = t.submit()
    t.succeed(t.claim(run_id))
    t.wait_state(run_id, "Completed")
    t.publish()  # release 2
    argv = ["runs", "replay-batch", "--workflow", t.workflow, "--last", "1", "--json"]
    done: dict[str, int] = {}
    batch = threading.Thread(target=lambda: done.setdefault("code", main(argv)))
    batch.start()
    replay_id = wait_until(lambda: next(iter(listed(t, "?replays=only")), None))
    t.succeed(t.claim(replay_id))  # the replay's worker reports the same outcome
    batch.join(60)
    assert done == {"code": 0}
    found = json.loads(capsys.readouterr().out)
    assert (found["runs"], found["diverged"]) == (1, 0)
    assert found["steps"] == {"only": {"equal": 1, "diverged": 0}}
    (report,) = found["reports"]
    assert (report["originalRunId"], report["replayRunId"]) == (run_id, replay_id)
