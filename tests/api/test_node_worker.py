"""docs/workers.md's Node client (``examples/node_worker/worker.mjs``) against the real gRPC
ingress: one attempt through Exchange, progress, a tool call, an approval (the attempt parks,
a reviewer approves over HTTP, it comes back) and an outcome with a result, which the server
hashes and stores as the run's result. Needs ``node`` and the client's npm packages: set
``RUNCONTROL_NODE_MODULES`` to a ``node_modules`` with @grpc/grpc-js and @grpc/proto-loader
(``npm install`` in examples/node_worker); skipped otherwise."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
from grpc_harness import GrpcTenant

from runcontrol.domain import SideEffectClass, StepSpec, WorkflowDefinition, canonical_hash

ROOT = Path(__file__).resolve().parents[2]
MODULES = os.environ.get("RUNCONTROL_NODE_MODULES")

pytestmark = pytest.mark.skipif(
    not (MODULES and shutil.which("node")), reason="set RUNCONTROL_NODE_MODULES (npm install)"
)


def test_the_node_client_works_one_attempt(g: GrpcTenant, grpc_port: int, tmp_path: Path):
    assert MODULES is not None
    agent = f"{g.view.agent}-node"
    definition = WorkflowDefinition(
        g.view.workflow,
        (
            StepSpec(
                "count", agent, gate="approval", side_effect_class=SideEffectClass.SHARED_WRITE
            ),
        ),
    )
    g.view.runtime.container.releases.publish(
        g.tenant, definition, "publisher", datetime.now(UTC), ("latest",)
    )
    shutil.copy(ROOT / "examples/node_worker/worker.mjs", tmp_path / "worker.mjs")
    (tmp_path / "node_modules").symlink_to(MODULES)
    env = dict(
        os.environ,
        RC_ROOT=str(ROOT),
        RC_GRPC=f"127.0.0.1:{grpc_port}",
        WORKER_TOKEN=g.worker_token(),
        AGENT=agent,
    )
    node = subprocess.Popen(
        ["node", "worker.mjs"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        run_id = g.view.submit()
        view = g.view.wait_state(run_id, "WaitingForApproval", timeout=60)
        (approval,) = view["pendingApprovals"]
        decided = g.view.reviewer().post(
            f"/factory/approvals/{approval['approvalId']}/decision",
            json={
                "decision": "approve",
                "version": approval["version"],
                "proposalHash": approval["proposalHash"],
                "reason": "fine",
            },
        )
        assert decided.status_code == 200, decided.text
        out, _ = node.communicate(timeout=60)
    finally:
        if node.poll() is None:
            node.kill()
    assert node.returncode == 0, out
    view = g.view.wait_state(run_id, "Completed", timeout=30)
    assert view["result"]["by"] == "node"
    assert view["resultHash"] == canonical_hash(view["result"])
    assert f"ours {view['resultHash']}" in out
    history = g.view.requester().get(f"/factory/runs/{run_id}/events/history").json()
    types = [e["type"] for e in history]
    assert "ProgressReported" in types and "ToolCallCompleted" in types
