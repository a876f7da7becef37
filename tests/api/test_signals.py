"""Signals over real HTTP (issue 22 item 2): a signal sent before its step waits is delivered
exactly once, when the step starts; a resend with the same Idempotency-Key gets the first
answer; a second signal is refused; a finished run refuses one with a clear problem; the run's
view and events say what the step waits for."""

from __future__ import annotations

import json
import uuid
from typing import Any

from api_harness import TenantView, assert_problem

from runcontrol.cli import main
from runcontrol.domain import Role


def publish(t: TenantView, *steps: dict[str, Any]) -> None:
    definition = {"workflowId": t.workflow, "steps": [dict(s, agentId=t.agent) for s in steps]}
    admin = t.user("wanda", Role.WORKSPACE_ADMIN)
    response = admin.post("/factory/releases", json={"definition": definition})
    assert response.status_code == 201, response.text


def send(t: TenantView, run_id: str, name: str, body: Any, key: str | None = None) -> Any:
    return t.requester().post(
        f"/factory/runs/{run_id}/signals/{name}",
        json=body,
        headers={"Idempotency-Key": key or f"sig-{uuid.uuid4().hex}"},
    )


def test_an_early_signal_is_delivered_once_and_a_resend_gets_the_first_answer(
    t: TenantView,
) -> None:
    publish(t, {"name": "plan"}, {"name": "go", "kind": "signal"}, {"name": "after"})
    run_id = t.submit()
    key = f"sig-{uuid.uuid4().hex}"
    first = send(t, run_id, "go", {"approved": True}, key)
    assert first.status_code == 202, first.text
    assert first.json()["delivered"] is False  # "go" does not wait yet: kept
    again = send(t, run_id, "go", {"approved": True}, key)
    assert again.json() == first.json()
    other = send(t, run_id, "go", {"approved": False})  # another key: a second signal
    assert_problem(other, 409, "signal-already-received")
    assert_problem(send(t, run_id, "nope", {}), 404, "signal-not-awaited")
    t.succeed(t.claim(run_id))  # plan; "go" starts and takes the kept signal
    t.succeed(t.claim(run_id))  # after
    view = t.wait_state(run_id, "Completed")
    go = next(s for s in view["steps"] if s["name"] == "go")
    assert go["state"] == "Succeeded" and go["kind"] == "signal" and go["attempts"] == []
    types = [e["type"] for e in t.history(run_id)]
    assert types.count("SignalReceived") == 1 and types.count("StepWaitEnded") == 1
    assert_problem(send(t, run_id, "go", {}), 409, "run-terminal")


def test_a_waiting_step_says_what_it_waits_for_and_a_signal_ends_it(t: TenantView) -> None:
    publish(t, {"name": "go", "kind": "signal", "signal": "review", "timeoutSeconds": 3600})
    run_id = t.submit()
    view = t.wait_state(run_id, "Running")
    (go,) = view["steps"]
    assert go["state"] == "Running"
    assert go["wait"]["signal"] == "review" and go["dueAt"] is not None
    waiting = next(e for e in t.history(run_id) if e["type"] == "StepWaiting")
    assert waiting["payload"]["signal"] == "review" and waiting["payload"]["until"]
    sent = send(t, run_id, "review", {"ok": 1})
    assert sent.status_code == 202 and sent.json()["delivered"] is True, sent.text
    assert sent.json()["state"] == "Completed"
    assert_problem(
        t.user("obs", Role.OBSERVER).post(
            f"/factory/runs/{run_id}/signals/review", json={}, headers={"Idempotency-Key": "k"}
        ),
        403,
    )


def test_the_cli_sends_a_signal(
    t: TenantView, capsys: Any, monkeypatch: Any, tmp_path: Any
) -> None:
    monkeypatch.setenv("RUNCONTROL_URL", t.api.base_url)
    monkeypatch.setenv("RUNCONTROL_CONFIG", str(tmp_path / "absent.toml"))
    monkeypatch.setenv("RUNCONTROL_TOKEN", t.token())
    publish(t, {"name": "go", "kind": "signal"})
    run_id = t.submit()
    t.wait_state(run_id, "Running")
    argv = ["runs", "signal", run_id, "go", "--data", '{"ok": 1}', "--key", "k1", "--json"]
    assert main(argv) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["delivered"] is True and answer["state"] == "Completed"
    assert main(["runs", "signal", run_id, "go", "--data", "{nope"]) == 1
    err = capsys.readouterr().err
    assert "--data is not JSON" in err and len(err.strip().splitlines()) == 1
    assert main(["runs", "signal", run_id, "go", "--data", "{}"]) == 1  # finished: refused
    assert "run-terminal" in capsys.readouterr().err


def test_a_signal_over_grpc_is_the_same_command(t: TenantView, g: Any) -> None:
    """``SendSignal`` through Serve's gRPC ingress: kept when early, the same answer for the
    same command_id, refused for a role that does not submit and for a finished run."""
    from grpc_harness import GrpcWorker

    from schemas import runcontrol_pb2 as pb

    publish(t, {"name": "plan"}, {"name": "go", "kind": "signal"})
    run_id = t.submit()
    sender = GrpcWorker(g.stub, t.token())  # the requester
    request = pb.SendSignalRequest(run_id=run_id, name="go", body_json='{"ok": 1}', command_id="c1")
    first = sender._call("SendSignal", request)
    assert (first.delivered, first.name, first.run_id) == (False, "go", run_id)
    assert sender._call("SendSignal", request) == first  # the same answer
    observer = GrpcWorker(g.stub, t.api.token(t.tenant, "obs", (Role.OBSERVER,)))
    assert observer.refused("SendSignal", request).reason == "insufficient-scope"
    t.succeed(t.claim(run_id))
    assert t.wait_state(run_id, "Completed")["state"] == "Completed"
    late = pb.SendSignalRequest(run_id=run_id, name="go", body_json="{}", command_id="c2")
    assert sender.refused("SendSignal", late).reason == "run-terminal"


def test_a_signal_without_a_body_is_refused_and_the_real_one_is_taken(t: TenantView) -> None:
    """Issue 34: a signal with no body was delivered (the step succeeded with null) and the
    real one then got 409."""
    publish(t, {"name": "go", "kind": "signal"})
    run_id = t.submit()
    t.wait_state(run_id, "Running")
    empty = t.requester().post(
        f"/factory/runs/{run_id}/signals/go", headers={"Idempotency-Key": "empty"}
    )
    assert_problem(empty, 422, "validation-failed")
    real = send(t, run_id, "go", {"approved": True})
    assert real.status_code == 202 and real.json()["delivered"] is True, real.text
    assert t.wait_state(run_id, "Completed")["state"] == "Completed"
