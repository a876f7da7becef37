"""The example ``examples/repository_assessment`` over gRPC (its worker app on
``GrpcSessionTransport`` through Serve's gRPC ingress) driven over HTTP by the example's own
driver (``follow``: the reviewer checks the shown patch's hash and approves it): the run
completes with the summary as its result and the patch committed on a branch; a cancel during
``analyse`` stops the running ruff/git work and the run ends Cancelled within seconds."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from grpc_harness import GrpcTenant
from test_sdk_grpc import serve_over_grpc

from examples.repository_assessment import agents
from examples.repository_assessment.__main__ import follow, submit
from examples.repository_assessment.repository import SAMPLE, branch_head, make_sample
from runcontrol.domain import WorkflowDefinition, canonical_hash


def publish(g: GrpcTenant) -> Any:
    agent = lambda name: f"{name}-{g.view.agent}"  # noqa: E731 - this test's own agent ids
    definition = WorkflowDefinition.from_dict(agents.workflow(agent))
    g.view.runtime.container.releases.publish(
        g.tenant, definition, "publisher", datetime.now(UTC), ("latest",)
    )
    return agents.assessment_worker(agent, wait_s=2.0)


def reviewed(approval: dict[str, Any], proposal: dict[str, Any] | None) -> bool:
    return proposal is not None and canonical_hash(proposal) == approval["proposalHash"]


def test_the_example_assesses_a_repository_over_grpc(
    g: GrpcTenant, grpc_port: int, tmp_path: Path
) -> None:
    worker = publish(g)
    repository = tmp_path / "repo"
    revision = make_sample(repository)
    runs: list[dict[str, Any]] = []

    async def scenario() -> None:
        def drive() -> dict[str, Any]:
            run_id = submit(g.view.requester(), str(repository), revision)
            return follow(
                g.view.requester(), g.view.reviewer(), run_id, reviewed, say=lambda _: None
            )

        runs.append(await asyncio.to_thread(drive))

    serve_over_grpc(g, grpc_port, worker, scenario)
    (run,) = runs
    assert run["state"] == "Completed", run
    result = run["result"]
    assert run["resultHash"] == canonical_hash(result)
    assert result["totals"]["files"] == len(SAMPLE) and result["totals"]["ruff"] >= 2
    assert branch_head(str(repository), result["branch"]) == result["commit"]


def test_a_cancel_during_analyse_stops_it_over_grpc(
    g: GrpcTenant, grpc_port: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REPOSITORY_ASSESSMENT_PAUSE_S", "2")  # 5 files: about 10 s of analyse
    worker = publish(g)
    repository = tmp_path / "repo"
    revision = make_sample(repository)
    found: dict[str, Any] = {}

    async def scenario() -> None:
        requester = g.view.requester()
        run_id = await asyncio.to_thread(submit, requester, str(repository), revision)

        def analysing() -> bool:
            history = requester.get(f"/factory/runs/{run_id}/events/history").json()
            return any((e["payload"].get("text") or "").startswith("analysed") for e in history)

        while not await asyncio.to_thread(analysing):
            await asyncio.sleep(0.2)
        cancelled_at = time.monotonic()
        answer = requester.post(
            f"/factory/runs/{run_id}/cancel",
            json={"reason": "not needed"},
            headers={"Idempotency-Key": f"cancel-{run_id}"},
        )
        assert answer.status_code in (200, 202), answer.text
        view = await asyncio.to_thread(
            lambda: g.view.wait_state(run_id, "Cancelled", "Completed", "Failed", timeout=30)
        )
        found.update(view=view, took=time.monotonic() - cancelled_at)

    serve_over_grpc(g, grpc_port, worker, scenario)
    view = found["view"]
    assert view["state"] == "Cancelled", view
    assert found["took"] < 5.0, found["took"]
    analyse = next(s for s in view["steps"] if s["name"] == "analyse")
    assert [a["state"] for a in analyse["attempts"]] == ["Cancelled"]
    assert view["result"] is None and view["resultHash"] is None
