"""Host actor faults: a killed RunHost restarts under its name and its runs carry on from
Postgres; outcomes are recorded exactly once; stale lease holders are fenced and audited."""

from __future__ import annotations

import ray
from actor_harness import RayHarness, outcome_hash, poll, proposal_hash, run_async

from actors.placement import NAMESPACE, host_name
from runcontrol.commands import RenewLease, ReportOutcome, RequestApproval
from runcontrol.domain import AttemptOutcome, FailureClass, errors


async def restart_host(h: RayHarness, index: int) -> None:
    """Kill host ``index`` (restart allowed) and wait until the same name answers again."""
    handle = h.rt.hosts[index]
    before = await handle.stats.remote()
    ray.kill(handle, no_restart=False)

    async def restarted() -> bool:
        try:
            fresh = ray.get_actor(host_name(index), namespace=NAMESPACE)
            stats = await fresh.stats.remote()
        except Exception:  # restarting: not answering yet
            return False
        return bool(stats["pid"] != before["pid"])

    await poll(restarted, f"{host_name(index)} to restart", timeout=30, interval=0.1)


def test_killed_host_between_lease_and_outcome_records_the_outcome_once(h: RayHarness) -> None:
    # Step 1 is gated, so its lease is suspended while the approval is pending: the host can be
    # killed and restarted between the lease grant and the outcome report without the lease
    # running out (a restart takes ~2 s here, as long as the test lease itself).
    h.publish(
        {"name": "apply", "agentId": "apply", "gate": "approval"},
        {"name": "verify", "agentId": "verify"},
    )

    async def main() -> None:
        submitted = await h.submit()
        run_id = submitted.run_id
        claim = await h.claim("apply", holder="w-apply")
        approval = await h.client.send(
            RequestApproval(**claim.fenced(), proposal_hash=proposal_hash())
        )
        assert approval is not None

        await restart_host(h, h.host_of(run_id))  # between the lease grant and the outcome

        decided = await h.approve(approval)
        assert str(decided.state) == "Approved"
        # The request parked the attempt; the decision resumed it: the worker claims it again.
        parked = claim
        claim = await h.claim("apply", holder="w-apply")
        assert claim.grant.fencing_token > parked.grant.fencing_token
        first = await h.client.send(
            ReportOutcome(
                **claim.fenced(),
                outcome=AttemptOutcome.SUCCEEDED,
                outcome_hash=outcome_hash("apply"),
            )
        )
        assert str(first.state) == "Succeeded"
        events_after_report = h.run_row(run_id).event_seq

        # The same report again, to a host restarted once more (nothing of the run in memory):
        # a no-op that answers with the recorded attempt.
        await restart_host(h, h.host_of(run_id))
        again = await h.client.send(
            ReportOutcome(
                **claim.fenced(),
                outcome=AttemptOutcome.SUCCEEDED,
                outcome_hash=outcome_hash("apply"),
            )
        )
        assert again.attempt_id == first.attempt_id and again.state == first.state
        assert h.run_row(run_id).event_seq == events_after_report
        # A different outcome from the same lease is refused, not recorded.
        try:
            await h.client.send(
                ReportOutcome(
                    **claim.fenced(),
                    outcome=AttemptOutcome.FAILED,
                    failure_class=FailureClass.PERMANENT,
                )
            )
        except errors.OutcomeAlreadyRecorded:
            pass
        else:
            raise AssertionError("a second, different outcome was accepted")

        # The run continues: step 2 is dispatched from Postgres and completes.
        verify = await h.claim("verify", holder="w-verify")
        await h.client.send(
            ReportOutcome(
                **verify.fenced(),
                outcome=AttemptOutcome.SUCCEEDED,
                outcome_hash=outcome_hash("verify"),
            )
        )
        history = await h.history(run_id)
        assert history[-1]["type"] == "RunCompleted"
        assert [e["seq"] for e in history] == list(range(1, len(history) + 1))

        recorded = [
            e
            for e in h.outbox_events(run_id)
            if e["type"] == "AttemptOutcomeRecorded" and e["attemptId"] == claim.attempt_id
        ]
        assert len(recorded) == 1
        assert recorded[0]["payload"]["outcome"] == "Succeeded"
        assert h.audits(run_id, "duplicate-outcome")
        h.assert_consistent(run_id)

    run_async(main(), timeout=90)


def test_stale_lease_after_expiry_and_redispatch_is_fenced_and_audited(h: RayHarness) -> None:
    h.publish({"name": "only", "agentId": "a", "maxAttempts": 3})

    async def main() -> None:
        run_id = (await h.submit()).run_id
        stale = await h.claim("a", holder="w-slow")
        # The worker stalls (no renewal): the scheduler expires the lease and re-dispatches.
        expired = await h.wait_type(run_id, "LeaseExpired")
        assert expired["payload"]["fencingToken"] == stale.fencing_token
        await h.wait_event(
            run_id,
            lambda e: e["type"] == "AttemptDispatched" and e["payload"]["attemptNumber"] == 2,
            "re-dispatch",
            after=expired["seq"],
        )
        fresh = await h.claim("a", holder="w-fast")
        assert fresh.attempt_id != stale.attempt_id
        assert fresh.fencing_token > stale.fencing_token

        for call in (
            lambda: h.client.send(
                ReportOutcome(
                    **stale.fenced(), outcome=AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash()
                )
            ),
            lambda: h.client.send(RenewLease(**stale.fenced())),
        ):
            try:
                await call()
            except errors.StaleFencingToken as exc:
                assert type(exc) is errors.StaleFencingToken
                assert exc.code == "stale-fencing-token"
            else:
                raise AssertionError("a stale lease holder was not fenced")

        audits = [
            a
            for a in h.audits(run_id)
            if a.detail.get("attempt_id") == str(stale.attempt_id)
            and a.detail.get("holder") == "w-slow"
        ]
        assert {a.kind for a in audits} >= {"stale-fencing-token", "lease-rejected"}
        assert all(a.detail["fencing_token"] == stale.fencing_token for a in audits)

        # The current holder is unaffected.
        await h.client.send(
            ReportOutcome(
                **fresh.fenced(), outcome=AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash()
            )
        )
        history = await h.history(run_id)
        assert history[-1]["type"] == "RunCompleted"
        h.assert_consistent(run_id)

    run_async(main(), timeout=60)
