"""End to end with gRPC workers only: two worker processes with no Ray in them (one is
``runcontrol worker --transport grpc``) complete a three-step run with an approval gate and a
transient failure; the reviewer decides over HTTP."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from api_harness import decision, wait_until
from grpc_harness import WORKER_SUB, GrpcTenant

from runcontrol.domain import WorkflowDefinition

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
NO_RAY = "import sys; sys.modules['ray'] = None; from runcontrol.cli import main; sys.exit(main())"


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        proc.send_signal(signal.SIGTERM)
    for proc in started:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def test_three_steps_approval_and_transient_failure_with_grpc_workers_only(
    g: GrpcTenant, grpc_port: int, processes: list[subprocess.Popen[str]]
) -> None:
    plan, apply, verify = (f"{g.view.agent}-{s}" for s in ("plan", "apply", "verify"))
    g.view.runtime.container.releases.publish(
        g.tenant,
        WorkflowDefinition.from_dict(
            {
                "workflowId": g.view.workflow,
                "steps": [
                    {"name": "plan", "agentId": plan},
                    {
                        "name": "apply",
                        "agentId": apply,
                        "gate": "approval",
                        "sideEffectClass": "local-write",
                    },
                    {"name": "verify", "agentId": verify, "maxAttempts": 3},
                ],
            }
        ),
        "publisher",
        datetime.now(UTC),
        ["latest"],
    )
    target = f"127.0.0.1:{grpc_port}"
    env = {**os.environ, "RUNCONTROL_WORKER_TOKEN": g.worker_token()}
    cli = [sys.executable, "-c", NO_RAY, "worker", "--transport", "grpc", "--target", target]
    cli += ["--holder", "cli-1", "--agents", plan, apply, "--work-seconds", "0.05"]
    cli += ["--renew-seconds", "0.5", "--claim-seconds", "1"]
    script = [sys.executable, str(HERE / "grpc_worker_proc.py"), target, g.worker_token()]
    script += ["flaky-1", verify, verify]
    for argv in (cli, script):
        processes.append(
            subprocess.Popen(argv, cwd=ROOT, env=env, text=True, stdout=subprocess.PIPE)
        )
    run_id = g.view.submit()

    def pending() -> Any:
        found = g.view.reviewer().get("/factory/approvals?state=Pending").json()["items"]
        return [a for a in found if a["runId"] == run_id]

    (approval,) = wait_until(pending, timeout=60)
    decided = g.view.reviewer().post(
        f"/factory/approvals/{approval['approvalId']}/decision", json=decision(approval)
    )
    assert decided.status_code == 200, decided.text
    view = g.view.wait_state(run_id, "Completed", "Failed", timeout=60)
    assert view["state"] == "Completed", view

    by_agent = {s["agentId"]: s["attempts"] for s in view["steps"]}
    assert [a["state"] for a in by_agent[plan]] == ["Succeeded"]
    assert [a["state"] for a in by_agent[apply]] == ["Succeeded"]
    first, second = by_agent[verify]
    assert (first["state"], first["failureClass"]) == ("Failed", "transient")
    assert second["state"] == "Succeeded"
    # Every lease was held by the token's subject and a worker instance, never a free string.
    history = g.view.history(run_id)
    holders = {
        e["payload"]["attemptId"]: e["payload"]["holder"]
        for e in history
        if e["type"] == "LeaseGranted"
    }
    # (each slot of a worker is an instance of its own: INSTANCE.k)
    cli_attempts = [a["attemptId"] for a in by_agent[plan] + by_agent[apply]]
    assert all(holders[a].startswith(f"{WORKER_SUB}/cli-1.") for a in cli_attempts), holders
    flaky = {holders[first["attemptId"]], holders[second["attemptId"]]}
    assert all(h.startswith(f"{WORKER_SUB}/flaky-1.") for h in flaky), holders
    for proc in processes:
        assert proc.poll() is None, "a worker process died"
    processes[1].send_signal(signal.SIGTERM)
    out, _ = processes[1].communicate(timeout=20)
    assert "ray importable: False" in out
