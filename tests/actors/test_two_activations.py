"""Two activations of one run at once: the same run's commands sent to BOTH host actors
(bypassing placement), as after a restart, a resharding or a dedicated + shared mix.

Each host keeps its own RunGrain for the run; only the ``UPDATE ... WHERE version = :v`` guard
orders them. Racing commands must leave a store a serial order would give, and every loser must
get a typed error, never a Ray error or a corrupted row.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import UUID

import pytest
from actor_harness import RayHarness, outcome_hash, run_async

from actors.placement import host_name
from actors.run_host import make_router
from runcontrol.commands import AcquireLease, Command, RenewLease, ReportOutcome, WakeRun
from runcontrol.domain import (
    Attempt,
    AttemptOutcome,
    FailureClass,
    LeaseGrant,
    errors,
)

LOSER_ERRORS = (
    errors.LeaseHeld,
    errors.ConcurrencyConflict,
    errors.StaleFencingToken,
    errors.LeaseNotHeld,
    errors.OutcomeAlreadyRecorded,
)


def split(results: list[Any]) -> tuple[list[Any], list[BaseException]]:
    ok = [r for r in results if not isinstance(r, BaseException)]
    failed = [r for r in results if isinstance(r, BaseException)]
    for exc in failed:
        assert type(exc) in LOSER_ERRORS, f"untyped or unexpected loser error: {exc!r}"
    return ok, failed


@pytest.mark.parametrize("round_", range(3))
def test_racing_commands_on_two_activations_keep_the_store_consistent(
    h: RayHarness, round_: int
) -> None:
    h.publish({"name": "one", "agentId": "a"}, {"name": "two", "agentId": "b"})
    router = make_router(h.rt.config)  # our own router: no cached activation affinity
    assert h.rt.settings.grains.host_count == 2

    async def main() -> None:
        run_id = (await h.submit()).run_id

        async def on(host: int, command: Command[Any]) -> Any:
            return await router.call_named(host_name(host), "command", command)

        def acquire(attempt_id: UUID, holder: str) -> AcquireLease:
            return AcquireLease(
                tenant_id=h.tenant, run_id=run_id, attempt_id=attempt_id, holder=holder
            )

        def renew(attempt_id: UUID, holder: str, token: int) -> RenewLease:
            return RenewLease(
                tenant_id=h.tenant,
                run_id=run_id,
                attempt_id=attempt_id,
                holder=holder,
                fencing_token=token,
            )

        def report(
            attempt_id: UUID, holder: str, token: int, outcome: AttemptOutcome, **kw: Any
        ) -> ReportOutcome:
            return ReportOutcome(
                tenant_id=h.tenant,
                run_id=run_id,
                attempt_id=attempt_id,
                holder=holder,
                fencing_token=token,
                outcome=outcome,
                **kw,
            )

        async def race(*calls: Any) -> list[Any]:
            return list(await asyncio.gather(*calls, return_exceptions=True))

        def open_attempt() -> UUID:
            (attempt,) = [a for a in h.attempts(run_id) if a.state == "Dispatched"]
            return UUID(str(attempt.attempt_id))

        # Warm both activations so each holds a cached copy of the same version.
        await asyncio.gather(
            on(0, WakeRun(tenant_id=h.tenant, run_id=run_id)),
            on(1, WakeRun(tenant_id=h.tenant, run_id=run_id)),
        )
        attempt_1 = open_attempt()
        v0 = h.run_row(run_id).version

        # --- four holders race for the lease through both activations: exactly one wins.
        holders = ["w-a", "w-b", "w-c", "w-d"]
        grants, lost = split(
            await race(*(on(i % 2, acquire(attempt_1, who)) for i, who in enumerate(holders)))
        )
        assert len(grants) == 1 and isinstance(grants[0], LeaseGrant)
        grant: LeaseGrant = grants[0]
        assert {type(e) for e in lost} <= {errors.LeaseHeld, errors.ConcurrencyConflict}
        loser = next(w for w in holders if w != grant.holder)

        # --- renewals by the holder on both activations, racing refused renewals.
        results = await race(
            *(on(i % 2, renew(attempt_1, grant.holder, grant.fencing_token)) for i in range(8)),
            on(0, renew(attempt_1, loser, grant.fencing_token)),
            on(1, renew(attempt_1, grant.holder, grant.fencing_token + 100)),
        )
        renewed, _ = split(results[:8])
        assert all(isinstance(r, LeaseGrant) for r in renewed)
        assert len(renewed) >= 1
        # Refusals are decided on fresh rows (never answered ConcurrencyConflict) and audited.
        assert type(results[8]) is errors.LeaseNotHeld
        assert type(results[9]) is errors.StaleFencingToken

        # --- the same outcome reported through both activations, plus refused reports.
        same = (attempt_1, grant.holder, grant.fencing_token, AttemptOutcome.SUCCEEDED)
        results = await race(
            on(0, report(*same, outcome_hash=outcome_hash(1))),
            on(1, report(*same, outcome_hash=outcome_hash(1))),
            on(0, report(*same, outcome_hash=outcome_hash(1))),
            on(1, report(*same, outcome_hash=outcome_hash(1))),
            on(1, report(attempt_1, loser, grant.fencing_token, AttemptOutcome.SUCCEEDED)),
        )
        reported, _ = split(results[:4])
        assert len(reported) >= 1
        assert all(isinstance(r, Attempt) and str(r.state) == "Succeeded" for r in reported)
        # Refused as a non-holder before the outcome commits, as stale after it.
        assert type(results[4]) in (errors.LeaseNotHeld, errors.StaleFencingToken)

        # Every successful command is exactly one committed version: one grant, each renewal,
        # one outcome (the repeats were no-ops and the refusals committed only audits).
        assert h.run_row(run_id).version == v0 + 1 + len(renewed) + 1
        h.assert_consistent(run_id)

        # --- step 2: the holder races two DIFFERENT outcomes through the two activations.
        attempt_2 = open_attempt()
        grant_2 = await on(1, acquire(attempt_2, "w-two"))
        assert grant_2.fencing_token == grant.fencing_token + 1
        token = (attempt_2, "w-two", grant_2.fencing_token)
        results = await race(
            on(0, report(*token, AttemptOutcome.SUCCEEDED, outcome_hash=outcome_hash(2))),
            on(1, report(*token, AttemptOutcome.FAILED, failure_class=FailureClass.PERMANENT)),
        )
        won, lost = split(results)
        assert len(won) == 1, results
        assert {type(e) for e in lost} <= {
            errors.OutcomeAlreadyRecorded,
            errors.ConcurrencyConflict,
        }, results
        final = h.run_row(run_id)
        assert final.state == (
            "Completed" if won[0].outcome is AttemptOutcome.SUCCEEDED else "Failed"
        )
        h.assert_consistent(run_id)

        outcomes = [e for e in h.outbox_events(run_id) if e["type"] == "AttemptOutcomeRecorded"]
        assert [e["attemptId"] for e in outcomes] == [attempt_1, attempt_2]
        granted = [e for e in h.outbox_events(run_id) if e["type"] == "LeaseGranted"]
        assert [e["payload"]["holder"] for e in granted] == [grant.holder, "w-two"]
        # Refusals were audited even though they lost a race.
        assert h.audits(run_id, "stale-fencing-token")

        # Both activations read the same committed run afterwards.
        views = await asyncio.gather(
            *(router.call_named(host_name(k), "get_run", h.tenant, run_id) for k in (0, 1))
        )
        assert views[0]["version"] == views[1]["version"] == final.version
        assert views[0]["state"] == views[1]["state"] == final.state

    run_async(main(), timeout=60)
