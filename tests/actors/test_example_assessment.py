"""The example ``examples/repository_assessment`` in the cluster (the SDK over actor-handle
sessions, real run hosts, Postgres, git and ruff): a run plans, analyses, waits for the
reviewer's approval of the patch's hash, commits it on a branch and returns the summary as the
run's result; a worker process killed during ``analyse`` and restarted completes the run with
one outcome per attempt."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from actor_harness import RayHarness, run_async
from test_sdk import ONE_SLOT, killed_mid_run, outcomes_per_attempt, serving, worker_process

from examples.repository_assessment import agents
from examples.repository_assessment.repository import SAMPLE, branch_head, content_at, make_sample
from runcontrol.domain import WorkflowDefinition, canonical_hash
from runcontrol.store import queries as q

TOTALS = {
    "files": len(SAMPLE),
    "lines": sum(len(text.splitlines()) for text in SAMPLE.values()),
    "todos": sum(text.count("TODO") for text in SAMPLE.values()),
}


def publish(h: RayHarness, agent: Callable[[str], str]) -> None:
    definition = WorkflowDefinition.from_dict(agents.workflow(agent))
    h.rt.container.releases.publish(
        h.tenant, definition, "publisher", datetime.now(UTC), ("latest",)
    )


def request(h: RayHarness, repository: Path, revision: str) -> Any:
    return h.request(
        input={"repository": str(repository), "revision": revision},
        workflow_id=agents.WORKFLOW_ID,
    )


async def approve_the_patch(h: RayHarness, run_id: UUID) -> dict[str, Any]:
    """As the reviewer: the patch shown in the progress is the one whose hash is approved."""
    requested = await h.wait_type(run_id, "ApprovalRequested", timeout=90)
    shown = [
        e["payload"]["payload"]["proposal"]
        for e in h.outbox_events(run_id)
        if e["type"] == "ProgressReported" and (e["payload"]["payload"] or {}).get("proposal")
    ]
    approval = requested["payload"]
    assert canonical_hash(shown[-1]) == approval["proposalHash"]
    await h.approve_requested(approval)
    return dict(shown[-1])


def check_result(h: RayHarness, run_id: UUID, repository: Path, revision: str) -> None:
    (completed,) = [e for e in h.outbox_events(run_id) if e["type"] == "RunCompleted"]
    with h.db.tenant(h.tenant) as conn:
        view = q.get_run(conn, run_id)
    assert view is not None
    result = view["result"]
    assert completed["payload"]["resultHash"] == canonical_hash(result)
    assert {k: result["totals"][k] for k in TOTALS} == TOTALS
    assert result["totals"]["ruff"] >= 2  # the sample's unused imports, at least
    assert branch_head(str(repository), result["branch"]) == result["commit"]
    report = content_at(str(repository), result["commit"], agents.REPORT_FILE)
    assert "app/main.py" in report and revision[:7] in report
    assert set(outcomes_per_attempt(h, run_id).values()) == {1}


def test_the_example_assesses_a_repository_in_the_cluster(h: RayHarness, tmp_path: Path) -> None:
    publish(h, h.agent)
    repository = tmp_path / "repo"
    revision = make_sample(repository)
    worker = agents.assessment_worker(h.agent, wait_s=2.0)
    state: dict[str, Any] = {}

    async def scenario() -> None:
        run_id = (await h.submit(request(h, repository, revision))).run_id
        state["run_id"] = run_id
        proposal = await approve_the_patch(h, run_id)
        assert proposal["base"] == revision and "ASSESSMENT.md" in proposal["patch"]
        await h.wait_type(run_id, "RunCompleted", timeout=90)

    run_async(serving(h, worker, scenario)(), timeout=180)
    check_result(h, state["run_id"], repository, revision)


def start_worker(h: RayHarness, marks: Path, holder: str) -> subprocess.Popen[bytes]:
    """``runcontrol worker --app examples.repository_assessment.agents:worker`` for this
    tenant only (its agent ids are the app's own), ``analyse`` pausing 1 s per file."""
    app = "examples.repository_assessment.agents:worker"
    return worker_process(
        h, marks, holder, app, f"--tenant={h.tenant}", ONE_SLOT, REPOSITORY_ASSESSMENT_PAUSE_S="1"
    )


def test_a_worker_killed_during_analyse_and_restarted_completes_the_run(
    h: RayHarness, tmp_path: Path
) -> None:
    publish(h, lambda name: name)
    repository = tmp_path / "repo"
    revision = make_sample(repository)

    def analysing(run_id: UUID) -> Callable[[], bool]:
        def seen() -> bool:
            return any(
                e["type"] == "ProgressReported"
                and (e["payload"]["text"] or "").startswith("analysed")
                for e in h.outbox_events(run_id)
            )

        return seen

    async def submit() -> UUID:
        return (await h.submit(request(h, repository, revision))).run_id

    run_id, _, _ = killed_mid_run(
        h,
        (
            lambda: start_worker(h, tmp_path, "assess-kill-1"),
            lambda: start_worker(h, tmp_path, "assess-kill-2"),
        ),
        submit,
        analysing,
        "analyse to start",
        lambda run_id: approve_the_patch(h, run_id),
    )
    h.assert_consistent(run_id)
    check_result(h, run_id, repository, revision)
    # plan, the killed analyse (expired), its retry (a retry granted to the dead worker's
    # session, still offered on its host, expires too: DESIGN 10), apply, report
    recorded = [e for e in h.outbox_events(run_id) if e["type"] == "AttemptOutcomeRecorded"]
    assert recorded[0]["payload"]["outcome"] == "Succeeded"  # plan
    assert len(outcomes_per_attempt(h, run_id)) >= 5
