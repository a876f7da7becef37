"""Child runs on the real hosts (issue 32): a parent's run step starts a child of another
workflow, which may live on another host; killing the parent's host and the child's host
mid-run (the child's right after its last step, racing its report to the parent) changes
nothing: the parent gets the child's result, once, from one child."""

from __future__ import annotations

from uuid import UUID

from actor_harness import RayHarness, poll, run_async
from sqlalchemy import select
from test_host_faults import restart_host

from runcontrol.commands import SendSignal
from runcontrol.store.tables import runs, steps


def child_of(h: RayHarness, parent: UUID) -> UUID | None:
    (row,) = h.rows(steps, parent)
    return None if row.child is None else UUID(row.child["runId"])


def children(h: RayHarness, parent: UUID) -> list[UUID]:
    with h.db.tenant(h.tenant) as conn:
        return [r.run_id for r in conn.execute(select(runs).where(runs.c.parent_run_id == parent))]


def state(h: RayHarness, run_id: UUID) -> str | None:
    found = h.rows(runs, run_id)
    return found[0].state if found else None


def test_killing_the_hosts_of_parent_and_child_mid_run_changes_nothing(h: RayHarness) -> None:
    h.publish({"name": "go", "kind": "signal", "agentId": "none"}, workflow_id="child")
    h.publish(
        {"name": "delegate", "kind": "run", "workflowId": "child", "agentId": "none"},
        workflow_id="parent",
    )

    async def main() -> None:
        parent = (await h.submit(h.request(workflow_id="parent"))).run_id
        child = await poll(
            lambda: child_of(h, parent), "the child's id on the parent's step", timeout=30
        )
        await poll(lambda: state(h, child) == "Running", "the child to run", timeout=30)
        await restart_host(h, h.host_of(parent))
        if h.host_of(child) != h.host_of(parent):
            await restart_host(h, h.host_of(child))
        signal = SendSignal(
            tenant_id=h.tenant, run_id=child, name="go", body={"answer": 42}, sent_by="bob"
        )
        await h.client.send(signal)
        await restart_host(h, h.host_of(child))  # races the child's report to its parent
        await poll(lambda: state(h, parent) in ("Completed", "Failed"), "the parent", timeout=40)
        assert h.run_row(parent).state == "Completed"
        assert h.run_row(child).state == "Completed"
        assert children(h, parent) == [child]  # one child, submitted once
        types = [e["type"] for e in h.outbox_events(parent)]
        assert types.count("ChildRunStarted") == 1 and types.count("ChildRunEnded") == 1
        child_types = [e["type"] for e in h.outbox_events(child)]
        assert child_types.count("RunAccepted") == 1
        (step,) = h.rows(steps, parent)
        assert step.state == "Succeeded" and step.result_json == '{"answer":42}'
        assert step.child == {"runId": str(child), "number": 1}
        assert h.run_row(parent).result_hash is not None

    run_async(main(), timeout=120)
