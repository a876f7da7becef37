"""Journaled calls (``step.run``) over gRPC (``GrpcSessionTransport`` through Serve's gRPC
ingress): a ``runcontrol worker --transport grpc`` process killed after its step's first
journaled call was recorded, and restarted, completes the run without calling the function
again; an approval of a proposal a journaled call made at random holds on re-entry."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from api_harness import decision, wait_until
from grpc_harness import GrpcTenant
from support import stop_processes
from test_grpc_end_to_end import NO_RAY
from test_sdk_grpc import serve_over_grpc

from runcontrol.domain import SideEffectClass
from runcontrol.sdk import Backoff, Step, Worker

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


def journal_worker(
    g: GrpcTenant, grpc_port: int, marks: Path, holder: str
) -> subprocess.Popen[bytes]:
    """``runcontrol worker --transport grpc --app journal_apps:worker`` (no Ray in it)."""
    env = {
        **os.environ,
        "RUNCONTROL_WORKER_TOKEN": g.worker_token(),
        "JOURNAL_TEST_MARKS": str(marks),
        "JOURNAL_TEST_AGENT": g.view.agent,
        "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "actors"), str(ROOT)]),
    }
    cli = [sys.executable, "-c", NO_RAY, "worker", "--transport", "grpc"]
    cli += ["--target", f"127.0.0.1:{grpc_port}", "--app", "journal_apps:worker"]
    cli += ["--holder", holder, "--renew-seconds", "0.5", "--claim-seconds", "1"]
    with (marks / f"{holder}.log").open("wb") as log:
        return subprocess.Popen(cli, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


def test_a_grpc_worker_killed_after_a_journaled_call_completes_without_calling_it_again(
    g: GrpcTenant, grpc_port: int, tmp_path: Path
) -> None:
    g.view.publish()
    first = journal_worker(g, grpc_port, tmp_path, "journal-g1")
    second: subprocess.Popen[bytes] | None = None
    try:
        run_id = g.view.submit()
        wait_until(lambda: list(tmp_path.glob("recorded-*")), timeout=60)
        first.send_signal(signal.SIGKILL)  # after the record: its lease is left to expire
        first.wait(10)
        second = journal_worker(g, grpc_port, tmp_path, "journal-g2")
        view = g.view.wait_state(run_id, "Completed", "Failed", timeout=90)
    finally:
        stop_processes(first, second)
    assert view["state"] == "Completed", view
    assert (tmp_path / "plan-calls").read_text() == "release notes\n"  # called once
    marks = sorted(tmp_path.glob("recorded-*"))
    assert len(marks) == 2 and len({m.read_text() for m in marks}) == 1
    (step,) = view["steps"]
    assert [c["name"] for c in step["calls"]] == ["plan"]


def test_an_approval_of_a_journaled_random_proposal_holds_on_re_entry_over_grpc(
    g: GrpcTenant, grpc_port: int
) -> None:
    g.view.publish(side_effect=SideEffectClass.SHARED_WRITE)
    worker = Worker("journal-grpc", concurrency=1, wait_s=2.0, backoff=Backoff(0.05, 0.5))
    made: list[str] = []

    def propose() -> dict[str, Any]:
        made.append(f"plan-{len(made)}")  # worded differently on every call
        return {"patch": made[-1]}

    @worker.agent(g.view.agent)
    async def apply(step: Step) -> dict[str, Any]:
        proposal = await step.run("propose", propose)
        approval = await step.approval(proposal)
        return {"applied": approval.proposal_hash}

    async def scenario() -> None:
        run_id = await asyncio.to_thread(g.view.submit)

        def pending() -> Any:
            found = g.view.reviewer().get("/factory/approvals?state=Pending").json()["items"]
            return [a for a in found if a["runId"] == run_id]

        (approval,) = await asyncio.to_thread(wait_until, pending, 60)
        decided = await asyncio.to_thread(
            g.view.reviewer().post,
            f"/factory/approvals/{approval['approvalId']}/decision",
            json=decision(approval),
        )
        assert decided.status_code == 200, decided.text
        view = await asyncio.to_thread(
            lambda: g.view.wait_state(run_id, "Completed", "Failed", timeout=60)
        )
        assert view["state"] == "Completed", view

    serve_over_grpc(g, grpc_port, worker, scenario)
    assert made == ["plan-0"]  # the re-entry got the stored proposal
