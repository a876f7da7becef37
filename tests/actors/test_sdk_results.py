"""Results in the cluster (the SDK over actor-handle sessions, real run hosts and Postgres): an
agent's return value reaches the next step's function byte-identical, and the final step's is
the run's result; a run host restarted between the steps still grants the dependency's result
(the session sweep's grant reads it from the activation, not from the offer)."""

from __future__ import annotations

from typing import Any

from actor_harness import RayHarness, run_async
from test_host_faults import restart_host
from test_sdk import sdk_worker, serving

from runcontrol.domain import canonical_hash, canonical_json
from runcontrol.sdk import Step, SyncStep
from runcontrol.store import queries as q

# Numbers jsonb would rewrite, a NUL escape, non-ASCII, a big int, nesting.
PLAN = {"files": ["a.py", "b.py"], "big": 10**20, "f": 1e300, "x": 0.1, "s": "\u0000 é"}


def test_step_two_receives_step_ones_result_byte_identical_in_the_cluster(
    h: RayHarness,
) -> None:
    h.publish(
        {"name": "plan", "agentId": "plan"},
        {"name": "apply", "agentId": "apply"},
        {"name": "report", "agentId": "report"},
    )
    worker = sdk_worker(concurrency=2)
    received: list[tuple[str, bytes]] = []

    @worker.agent(h.agent("plan"))
    async def plan(step: Step) -> dict[str, Any]:
        assert dict(step.results) == {}
        return PLAN

    @worker.agent(h.agent("apply"))
    def apply(step: SyncStep) -> list[Any]:  # a sync function gets them alike
        received.append(("apply", canonical_json(step.results["plan"])))
        return [len(step.results["plan"]["files"]), "applied"]

    @worker.agent(h.agent("report"))
    async def report(step: Step) -> dict[str, Any]:
        assert set(step.results) == {"apply"}  # the step before it only
        received.append(("report", canonical_json(step.results["apply"])))
        return {"summary": step.results["apply"][1]}

    state: dict[str, Any] = {}

    async def scenario() -> None:
        state["run_id"] = (await h.submit()).run_id
        await h.wait_type(state["run_id"], "RunCompleted", timeout=60)

    run_async(serving(h, worker, scenario)(), timeout=120)
    assert received == [("apply", canonical_json(PLAN)), ("report", b'[2,"applied"]')]
    run_id = state["run_id"]
    with h.db.tenant(h.tenant) as conn:
        view = q.get_run(conn, run_id)
    assert view is not None
    assert view["result"] == {"summary": "applied"}
    assert view["resultHash"] == canonical_hash({"summary": "applied"})
    (completed,) = [e for e in h.outbox_events(run_id) if e["type"] == "RunCompleted"]
    assert completed["payload"]["resultHash"] == view["resultHash"]


def test_a_restarted_host_grants_the_dependency_result(h: RayHarness) -> None:
    """The second step's attempt is dispatched, then its run's host restarts before any credit
    takes it: the sweep finds it in the store and the grant still carries the result."""
    h.publish({"name": "plan", "agentId": "plan"}, {"name": "apply", "agentId": "apply"})
    first = sdk_worker(concurrency=1)
    second = sdk_worker(concurrency=1)
    received: list[bytes] = []

    @first.agent(h.agent("plan"))
    async def plan(step: Step) -> dict[str, Any]:
        return PLAN

    @second.agent(h.agent("apply"))
    async def apply(step: Step) -> str:
        received.append(canonical_json(step.results["plan"]))
        return "ok"

    state: dict[str, Any] = {}

    async def plan_only() -> None:
        state["run_id"] = (await h.submit()).run_id
        # the outcome's commit dispatches the next step (one transaction)
        await h.wait_type(state["run_id"], "AttemptOutcomeRecorded", timeout=60)

    run_async(serving(h, first, plan_only)(), timeout=120)
    run_id = state["run_id"]
    run_async(restart_host(h, h.host_of(run_id)), timeout=60)

    async def apply_after_restart() -> None:
        await h.wait_type(run_id, "RunCompleted", timeout=90)

    run_async(serving(h, second, apply_after_restart, holder="sdk-w2")(), timeout=150)
    assert received == [canonical_json(PLAN)]


def test_a_result_over_the_inline_cap_fails_the_attempt_at_once(h: RayHarness) -> None:
    """The server refuses a result over ``results.max_inline_bytes`` (256 KiB) and stores
    nothing: the SDK reports the attempt Failed (validation, not retried) at once, with no
    wait for its lease's expiry and no retry that would be refused alike."""
    h.publish({"name": "plan", "agentId": "plan"}, {"name": "apply", "agentId": "apply"})
    worker = sdk_worker(concurrency=1)
    calls: list[str] = []

    @worker.agent(h.agent("plan"))
    async def plan(step: Step) -> dict[str, Any]:
        calls.append("plan")
        return {"blob": "x" * (300 * 1024)}

    @worker.agent(h.agent("apply"))
    async def apply(step: Step) -> str:
        calls.append("apply")
        return "never"

    state: dict[str, Any] = {}

    async def scenario() -> None:
        state["run_id"] = (await h.submit()).run_id
        await h.wait_type(state["run_id"], "RunFailed", timeout=60)

    run_async(serving(h, worker, scenario)(), timeout=120)
    run_id = state["run_id"]
    assert calls == ["plan"]  # one attempt, and the next step never ran
    (attempt,) = h.attempts(run_id)
    assert (attempt.state, attempt.outcome, attempt.failure_class) == (
        "Failed",
        "Failed",
        "validation",
    ), attempt
    types = [e["type"] for e in h.outbox_events(run_id)]
    assert "LeaseExpired" not in types, types
    with h.db.tenant(h.tenant) as conn:
        view = q.get_run(conn, run_id)
    assert view is not None and view["state"] == "Failed" and view["result"] is None


def test_a_unary_claim_in_the_cluster_carries_the_dependency_results(h: RayHarness) -> None:
    """The claim path without a session (``RunControlClient.claim``): whichever host serves
    the claim, the lease comes with the results of the steps it depends on, asked of the
    run's own host."""
    from runcontrol.commands import ReportOutcome
    from runcontrol.domain import AttemptOutcome

    h.publish({"name": "plan", "agentId": "plan"}, {"name": "apply", "agentId": "apply"})

    async def scenario() -> None:
        run_id = (await h.submit()).run_id
        first = await h.claim("plan")
        assert first.run_id == run_id and dict(first.results) == {}
        await h.client.send(
            ReportOutcome(**first.fenced(), outcome=AttemptOutcome.SUCCEEDED, result=PLAN)
        )
        second = await h.claim("apply", holder="worker-2")
        assert second.run_id == run_id
        assert canonical_json(dict(second.results)) == canonical_json({"plan": PLAN})

    run_async(scenario(), timeout=60)
