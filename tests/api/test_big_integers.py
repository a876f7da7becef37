"""Valid JSON the engine could not hash (issue 34): an integer beyond 64 bits in a run's input
or a signal's body is accepted and reaches the step unchanged, over HTTP (a submission, a
signal) and gRPC (a signal; a worker of the SDK over the session exchange, reporting progress
data holding one too). Before: ``TypeError: Integer exceeds 64-bit range`` from the command's
fingerprint, a 500."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

from api_harness import TenantView
from grpc_harness import GrpcTenant
from sqlalchemy import select
from test_sdk_grpc import serve_over_grpc
from test_signals import publish, send

from runcontrol.sdk import Backoff, Step, Worker
from runcontrol.store.tables import steps
from schemas import runcontrol_pb2 as pb

BIG = 2**70
INPUT = {"bigInt": 1180591620717411303424, "nested": [{"n": -(2**100)}], "ok": 1}


def submit(t: TenantView) -> str:
    response = t.requester().post(
        "/factory/runs",
        json=t.body(input=INPUT),
        headers={"Idempotency-Key": f"big-{uuid.uuid4().hex}"},
    )
    assert response.status_code == 202, response.text
    again = t.requester().post(  # a resend: the same fingerprint, the same run
        "/factory/runs",
        json=t.body(input=INPUT),
        headers={"Idempotency-Key": response.request.headers["Idempotency-Key"]},
    )
    assert again.status_code in (200, 202) and again.json()["runId"] == response.json()["runId"]
    return str(response.json()["runId"])


def signal_body(t: TenantView, run_id: str) -> Any:
    """The body the signal step holds (``steps.signal``: what settled it)."""
    with t.runtime.container.db.tenant(t.tenant) as conn:
        row = conn.execute(
            select(steps.c.signal).where(steps.c.run_id == uuid.UUID(run_id), steps.c.name == "go")
        ).scalar_one()
    return row["body"]


def test_a_big_integer_reaches_the_step_over_http(t: TenantView) -> None:
    publish(t, {"name": "plan"}, {"name": "go", "kind": "signal"}, {"name": "after"})
    run_id = submit(t)
    claim = t.claim(run_id)
    assert claim.input == INPUT
    t.succeed(claim)
    sent = send(t, run_id, "go", {"n": BIG})
    assert sent.status_code == 202, sent.text
    t.succeed(t.claim(run_id))  # "after": "go" succeeded with the signal
    assert t.wait_state(run_id, "Completed")["input"] == INPUT
    assert signal_body(t, run_id) == {"n": BIG}


def test_a_big_integer_reaches_the_step_over_grpc(g: GrpcTenant, grpc_port: int) -> None:
    t = g.view
    publish(t, {"name": "plan"}, {"name": "go", "kind": "signal"}, {"name": "after"})
    worker = Worker("big-grpc", concurrency=2, wait_s=2.0, backoff=Backoff(0.05, 0.5))
    seen: dict[str, Any] = {}

    @worker.agent(t.agent)
    async def agent(step: Step) -> Any:
        seen.setdefault("inputs", []).append(step.input)
        await step.progress("counted", {"count": BIG})
        return {"done": BIG}

    async def scenario() -> None:
        run_id = await asyncio.to_thread(submit, t)
        await asyncio.to_thread(lambda: t.wait_state(run_id, "Running", timeout=30))
        request = pb.SendSignalRequest(
            run_id=run_id, name="go", body_json=json.dumps({"n": BIG}), command_id="sig-1"
        )
        # Sent before "go" waits, it is kept until then: either way the step gets it.
        await asyncio.to_thread(
            lambda: g.stub.SendSignal(
                request, metadata=(("authorization", f"Bearer {t.token()}"),), timeout=30
            )
        )
        view = await asyncio.to_thread(
            lambda: t.wait_state(run_id, "Completed", "Failed", timeout=60)
        )
        assert view["state"] == "Completed", view
        assert view["result"] == {"done": BIG}
        seen["signal"] = await asyncio.to_thread(signal_body, t, run_id)

    serve_over_grpc(g, grpc_port, worker, scenario)
    assert seen == {"inputs": [INPUT, INPUT], "signal": {"n": BIG}}
