"""A command whose host died after its commit and before its answer: the router resends it
(same ``command_id``) to the restarted host, which answers with the stored answer. One effect.

The host is made to die at exactly that point, for real: the test holds a lock that the
command's statement, and no other, waits on (the run's next outbox row, inserted uncommitted:
``hold_next_event``), waits until that statement waits, freezes the host process (SIGSTOP),
releases the lock so the statement commits inside PostgreSQL, waits until the answer row is
visible, then kills the frozen process (SIGKILL). Ray restarts the host under its name; the
caller's ``send`` sees the actor die and resends the batch.
"""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from typing import Any

import ray
from actor_harness import (
    RayHarness,
    hold_next_event,
    poll,
    proposal_hash,
    run_async,
    waiting_on,
)
from sqlalchemy import create_engine, text
from sqlalchemy.pool import NullPool

from actors.placement import NAMESPACE, host_name
from runcontrol.commands import (
    CancelRun,
    Command,
    DecideApproval,
    ReportOutcome,
    RequestApproval,
    SubmitRun,
)
from runcontrol.domain import AttemptOutcome, Decision
from runcontrol.store.tables import approval_decisions, cancellation_intents, runs


async def send_through_a_host_death(h: RayHarness, command: Command[Any]) -> Any:
    """Send ``command``; its host commits it, then dies before answering."""
    owner = create_engine(h.rt.owner_url, poolclass=NullPool)
    index = h.host_of(command.run_id)
    handle = ray.get_actor(host_name(index), namespace=NAMESPACE)
    pid = (await handle.stats.remote())["pid"]
    try:
        with owner.connect() as lock:
            # Every command writes an outbox row: this one's next, held here, makes it wait.
            holder = hold_next_event(lock, h.tenant, command.run_id)
            sending = asyncio.ensure_future(h.client.send(command))
            await poll(
                lambda: waiting_on(owner, holder), "the command's statement to wait", timeout=20
            )
            os.kill(pid, signal.SIGSTOP)  # the host can no longer answer
            lock.rollback()  # the statement goes on and commits inside PostgreSQL
        await poll(lambda: _answered(owner, command), "the command to commit", timeout=20)
        assert not sending.done()
        os.kill(pid, signal.SIGKILL)
        answer = await asyncio.wait_for(sending, 60)
        fresh = ray.get_actor(host_name(index), namespace=NAMESPACE)
        assert (await fresh.stats.remote())["pid"] != pid, "the answer came from a new host"
        return answer
    finally:
        owner.dispose()


def _answered(owner: Any, command: Command[Any]) -> bool:
    with owner.connect() as conn:
        return bool(
            conn.execute(
                text("SELECT count(*) FROM command_answers WHERE command_id = :id"),
                {"id": command.command_id},
            ).scalar_one()
        )


def test_decide_report_cancel_and_submit_resent_after_their_host_died(h: RayHarness) -> None:
    h.publish({"name": "apply", "agentId": "apply", "gate": "approval"})
    h.publish({"name": "plain", "agentId": "plain"}, workflow_id="plain")

    async def main() -> None:
        # submit
        principal = h.principal()
        submit = SubmitRun(
            tenant_id=h.tenant,
            run_id=uuid.uuid4(),
            principal=principal,
            request=h.request("resent-submit"),
        )
        submitted = await send_through_a_host_death(h, submit)
        assert submitted.created and submitted.run_id == submit.run_id
        assert await h.client.send(submit) == submitted
        assert len(h.rows(runs, submit.run_id)) == 1

        # decide
        claim = await h.claim("apply", holder="w-1")
        assert claim.run_id == submit.run_id
        approval = await h.client.send(
            RequestApproval(**claim.fenced(), proposal_hash=proposal_hash())
        )
        assert approval is not None
        decide = DecideApproval(
            tenant_id=h.tenant,
            run_id=claim.run_id,
            approval_id=approval.approval_id,
            principal=h.reviewer(),
            decision=Decision.APPROVE,
            version=approval.version,
            proposal_hash=approval.proposal_hash,
        )
        decided = await send_through_a_host_death(h, decide)
        assert str(decided.state) == "Approved"
        assert len(h.rows(approval_decisions, claim.run_id)) == 1

        # report_outcome, on a fresh lease (test leases are short; a host restart is not)
        plain = await h.submit(h.request(workflow_id="plain"))
        leased = await h.claim("plain", holder="w-2")
        assert leased.run_id == plain.run_id
        report = ReportOutcome(
            **leased.fenced(), outcome=AttemptOutcome.SUCCEEDED, outcome_hash=proposal_hash(2)
        )
        reported = await send_through_a_host_death(h, report)
        assert str(reported.state) == "Succeeded"
        assert await h.client.send(report) == reported
        types = [e.event_type for e in h.outbox(plain.run_id)]
        assert types.count("AttemptOutcomeRecorded") == 1
        assert types[-1] == "RunCompleted"

        # cancel (a second run, still running)
        other = await h.submit()
        cancel = CancelRun(
            tenant_id=h.tenant, run_id=other.run_id, requested_by="ops", reason="resent"
        )
        state = await send_through_a_host_death(h, cancel)
        assert state in ("Cancelling", "Cancelled")
        assert await h.client.send(cancel) == state
        assert len(h.rows(cancellation_intents, other.run_id)) == 1

    run_async(main(), timeout=240)
