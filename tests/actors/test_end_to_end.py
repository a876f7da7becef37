"""End to end in Python (no HTTP): two workers claiming in parallel, a gated step decided by a
Reviewer, a transient failure retried; the run completes and its event stream agrees with the
recovery journal."""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

from actor_harness import RayHarness, outcome_hash, proposal_hash, run_async

from runcontrol.client import Claim
from runcontrol.commands import ReportOutcome, RequestApproval
from runcontrol.domain import AttemptOutcome, Decision, FailureClass

# Which transitions each event type stands for, as (entity, id field, to_state) per entry; the
# Step and Attempt rows a settle moves are derived from the outcome below.
STATIC: dict[str, list[tuple[str, str, str]]] = {
    "RunAccepted": [("Run", "runId", "Accepted")],
    "AttemptDispatched": [("Step", "stepId", "Running"), ("Attempt", "attemptId", "Dispatched")],
    "LeaseGranted": [("Attempt", "attemptId", "Leased")],
    "ApprovalRequested": [("ApprovalRequest", "approvalId", "Pending")],
    "AttemptParked": [("Attempt", "attemptId", "Parked")],
    "AttemptResumed": [("Attempt", "attemptId", "Dispatched")],
    "StepRetryScheduled": [("Step", "stepId", "Pending")],
}


def transitions_from_events(events: list[dict[str, Any]]) -> dict[tuple[str, str], list[str]]:
    """Per entity, the sequence of states the event stream says it went through."""
    seen: dict[tuple[str, str], list[str]] = {}

    def add(entity: str, entity_id: str, state: str) -> None:
        seen.setdefault((entity, entity_id), []).append(state)

    for e in events:
        p = e["payload"]
        for entity, field, state in STATIC.get(e["type"], []):
            add(entity, p[field], state)
        if e["type"] == "RunStateChanged":
            add("Run", p["runId"], p["toState"])
        elif e["type"] == "ApprovalDecided":
            add("ApprovalRequest", p["approvalId"], p["state"])
        elif e["type"] == "AttemptOutcomeRecorded":
            add("Attempt", p["attemptId"], p["outcome"])
            if p["outcome"] == "Succeeded":
                add("Step", p["stepId"], "Succeeded")
    return seen


def test_three_step_run_with_approval_and_retry_completes_end_to_end(h: RayHarness) -> None:
    h.publish(
        {"name": "plan", "agentId": "plan"},
        {"name": "apply", "agentId": "apply", "gate": "approval", "sideEffectClass": "local-write"},
        {"name": "verify", "agentId": "verify", "maxAttempts": 3},
    )
    agents = ["plan", "apply", "verify"]
    plan, apply, verify = (h.agent(a) for a in agents)

    async def main() -> None:
        run_id = (await h.submit(h.request(input={"repo": "x", "task": "e2e"}))).run_id
        done = asyncio.Event()
        claims: list[tuple[str, Claim]] = []
        decided: list[Any] = []

        async def worker(holder: str) -> None:
            while not done.is_set():
                claim = await h.client.claim([h.agent(a) for a in agents], holder, 1.0)
                if claim is None:
                    continue
                claims.append((holder, claim))
                assert claim.input == {"repo": "x", "task": "e2e"}
                agent = claim.grant.agent_id
                if agent == apply:
                    approval = await h.client.send(
                        RequestApproval(**claim.fenced(), proposal_hash=proposal_hash("apply"))
                    )
                    assert approval is not None
                    if str(approval.state) == "Pending":
                        continue  # parked: the decision puts it back for any worker to claim
                    # Resumed after the approval: the grant names the approved proposal.
                    assert claim.grant.approved_proposal_hash == proposal_hash("apply")
                if agent == verify and claim.grant.attempt_number == 1:
                    await h.client.send(
                        ReportOutcome(
                            **claim.fenced(),
                            outcome=AttemptOutcome.FAILED,
                            failure_class=FailureClass.TRANSIENT,
                        )
                    )
                    continue
                await h.client.send(
                    ReportOutcome(
                        **claim.fenced(),
                        outcome=AttemptOutcome.SUCCEEDED,
                        outcome_hash=outcome_hash(agent),
                    )
                )

        async def reviewer() -> None:
            requested = await h.wait_type(run_id, "ApprovalRequested", timeout=30)
            (pending,) = (await h.client.get(h.tenant, run_id))["pendingApprovals"]
            assert pending["approvalId"] == requested["payload"]["approvalId"]
            assert pending["requestedBy"] != "rita"  # the reviewer is not the requester
            decided.append(
                await h.decide(
                    h.reviewer("rita"),
                    UUID(pending["approvalId"]),
                    Decision.APPROVE,
                    pending["version"],
                    pending["proposalHash"],
                )
            )

        async def watcher() -> list[dict[str, Any]]:
            try:
                return await h.history(run_id, timeout=45)
            finally:
                done.set()

        events, *_ = await asyncio.gather(watcher(), worker("w1"), worker("w2"), reviewer())

        # The run completed, through exactly the work expected.
        view = await h.client.get(h.tenant, run_id)
        assert view["state"] == "Completed"
        assert events[-1]["type"] == "RunCompleted"
        by_agent = [(c.grant.agent_id, c.grant.attempt_number) for _, c in claims]
        # The apply attempt was claimed twice: before its approval parked it, and after.
        assert sorted(by_agent) == sorted(
            [(plan, 1), (apply, 1), (apply, 1), (verify, 1), (verify, 2)]
        )
        assert decided and str(decided[0].state) == "Approved"
        assert decided[0].decided_by == "rita"

        # The per-run event sequence is gap-free 1..N and ends where the run row says.
        seqs = [e["seq"] for e in events]
        assert seqs == list(range(1, len(events) + 1))
        assert view["lastEventSeq"] == len(events)
        types = [e["type"] for e in events]
        for expected in (
            "RunAccepted",
            "ApprovalRequested",
            "ApprovalDecided",
            "StepRetryScheduled",
        ):
            assert types.count(expected) == 1, (expected, types)
        assert types.count("AttemptOutcomeRecorded") == 4
        assert types.count("LeaseGranted") == 5
        assert types.count("AttemptParked") == types.count("AttemptResumed") == 1

        # The transitions the events show are the recovery journal's, entity by entity.
        journal = h.journal(run_id)
        assert [j.sequence for j in journal] == list(range(1, len(journal) + 1))
        from_journal: dict[tuple[str, str], list[str]] = {}
        for j in journal:
            key = (j.entity, str(j.entity_id))
            chain = from_journal.setdefault(key, [])
            # Steps are created Pending with the run (RunAccepted), unjournaled on their own.
            first = "Pending" if j.entity == "Step" else None
            assert j.from_state == (chain[-1] if chain else first), (key, j.from_state, chain)
            chain.append(j.to_state)
        assert transitions_from_events(events) == from_journal
        run_changes = [
            (e["payload"]["fromState"], e["payload"]["toState"])
            for e in events
            if e["type"] == "RunStateChanged"
        ]
        journal_run = [
            (j.from_state, j.to_state) for j in journal if j.entity == "Run" and j.from_state
        ]
        assert run_changes == journal_run
        assert [to for _, to in run_changes] == [
            "Running",
            "WaitingForApproval",
            "Running",
            "Completed",
        ]
        h.assert_consistent(run_id)

    run_async(main(), timeout=90)
