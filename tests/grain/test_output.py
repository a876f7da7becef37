"""Streamed output through the grain (issue 30, docs/streaming.md), against real Postgres:
the lease holder's fenced insert, its numbering, resends, gaps, bounds and the run's positions.
What the store holds is read back as the tenant (row-level security applies)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from grain_harness import SHARED, Harness
from sqlalchemy import create_engine, select, text
from support import WORKER, acquire, decide, drive, fenced, race_async, request_approval

from runcontrol import reconcilers
from runcontrol.commands import AppendOutput
from runcontrol.domain import LeaseGrant, StepSpec, errors
from runcontrol.domain.output import OUTPUT_CHUNK_MAX_BYTES, OutputAck, OutputChunk
from runcontrol.store.output import output_after
from runcontrol.store.tables import output_heads


def write(h: Harness, grant: LeaseGrant, *seqs: int, **overrides: Any) -> AppendOutput:
    chunks = tuple(
        OutputChunk(s, text=f"t{s}") if s % 2 else OutputChunk(s, data={"n": s}) for s in seqs
    )
    return AppendOutput(**fenced(grant, h.tenant, **overrides), chunks=chunks)


def stored(h: Harness, run_id: uuid.UUID) -> list[dict[str, Any]]:
    with h.db.tenant(h.tenant) as conn:
        return output_after(conn, run_id, 0, 10_000)


def test_chunks_are_stored_in_order_once_whatever_the_resends(h: Harness):
    grain, grant = h.start_run()

    assert grain.execute(write(h, grant, 1, 2, 3)) == OutputAck(grant.attempt_id, 3, 3, 0)
    # a resend of the same write, and one overlapping it: only the new chunks are stored
    assert grain.execute(write(h, grant, 1, 2, 3)) == OutputAck(grant.attempt_id, 3, 0, 3)
    assert grain.execute(write(h, grant, 2, 3, 4, 5)) == OutputAck(grant.attempt_id, 5, 2, 2)
    with pytest.raises(errors.OutputGap) as gap:
        grain.execute(write(h, grant, 7, 8))  # 6 was never sent
    assert gap.value.details["acked_seq"] == 5

    found = stored(h, grain.run_id)
    assert [c["position"] for c in found] == [1, 2, 3, 4, 5]
    assert [c["seq"] for c in found] == [1, 2, 3, 4, 5]
    assert found[0]["text"] == "t1" and found[1]["data"] == {"n": 2}
    assert {c["attemptId"] for c in found} == {str(grant.attempt_id)}


def test_a_stale_or_foreign_holder_is_refused_and_audited(h: Harness):
    grain, grant = h.start_run()
    grain.execute(write(h, grant, 1))

    with pytest.raises(errors.StaleFencingToken):
        grain.execute(write(h, grant, 2, fencing_token=grant.fencing_token + 1))
    with pytest.raises(errors.StaleFencingToken):
        grain.execute(write(h, grant, 2, lease_id=uuid.uuid4()))
    with pytest.raises(errors.LeaseNotHeld):
        grain.execute(write(h, grant, 2, holder="intruder"))
    h.succeed(grain, grant)  # the lease ends with the outcome
    with pytest.raises(errors.StaleFencingToken):
        grain.execute(write(h, grant, 2))

    assert [c["seq"] for c in stored(h, grain.run_id)] == [1]
    kinds = [a.kind for a in h.audits(grain.run_id) if a.detail.get("command") == "AppendOutput"]
    assert kinds == ["stale-fencing-token", "stale-fencing-token", "lease-not-held"] + [
        "stale-fencing-token"
    ]


def test_another_tenants_run_is_out_of_reach(h: Harness, make_harness):
    grain, grant = h.start_run()
    other = make_harness(tenant_id=f"{h.tenant}-other")
    with pytest.raises(errors.StaleFencingToken):  # its lease is not visible to that tenant
        drive(other.env.output.append(write(other, grant, 1, run_id=grain.run_id)))
    assert stored(h, grain.run_id) == []


def test_the_bounds_refuse_with_typed_errors(h: Harness):
    grain, grant = h.start_run()
    too_big = AppendOutput(
        **fenced(grant, h.tenant), chunks=(OutputChunk(1, text="x" * (OUTPUT_CHUNK_MAX_BYTES + 1)),)
    )
    with pytest.raises(errors.OutputChunkTooLarge):
        grain.execute(too_big)
    with pytest.raises(errors.ValidationFailed):  # not numbered in sequence
        grain.execute(write(h, grant, 1, 3))

    h.env.output.attempt_max = 10  # what one attempt may write in all, in bytes
    with pytest.raises(errors.OutputLimitExceeded) as limit:
        grain.execute(write(h, grant, 1, 2, 3))  # "t1" and {"n":2} are 9 bytes: "t3" is over
    assert limit.value.details == {"attempt_id": str(grant.attempt_id), "acked_seq": 2, "limit": 10}
    assert [c["seq"] for c in stored(h, grain.run_id)] == [1, 2]
    with pytest.raises(errors.OutputLimitExceeded):  # and nothing more of the attempt
        grain.execute(write(h, grant, 3))


def test_parallel_attempts_of_one_run_share_one_gap_free_sequence(h: Harness, make_harness):
    h.publish(StepSpec("a", "agent-a", depends_on=()), StepSpec("b", "agent-a", depends_on=()))
    grain, _ = h.submit()
    grants = [acquire(grain, a.attempt_id, WORKER) for a in h.open_attempts(grain.run_id)]
    assert len(grants) == 2

    # two hosts' writers (two pools): each round's two writes contend in the database
    writers = [h.env.output, make_harness().env.output]

    async def one(i: int, first: int) -> OutputAck:
        return await writers[i].append(write(h, grants[i], *range(first, first + 5)))

    for first in range(1, 51, 5):  # ten rounds, both attempts at once
        results = race_async(one(0, first), one(1, first))
        assert all(kind == "ok" for kind, _ in results), results

    found = stored(h, grain.run_id)
    assert [c["position"] for c in found] == list(range(1, 101))
    for grant in grants:
        mine = [c["seq"] for c in found if c["attemptId"] == str(grant.attempt_id)]
        assert mine == list(range(1, 51))


def test_output_goes_with_the_event_history_retention(h: Harness, owner_url: str):
    grain, grant = h.start_run()
    grain.execute(write(h, grant, 1, 2))
    young, young_grant = h.start_run()
    young.execute(write(h, young_grant, 1))  # written now: retention keeps it
    long_ago = datetime(2001, 1, 1, tzinfo=UTC)  # no other test writes at this time
    owner = create_engine(owner_url)
    try:
        with owner.begin() as conn:  # the rows grow old (the owner: a superuser in tests)
            for table, column in (("output_chunks", "written_at"), ("output_heads", "updated_at")):
                conn.execute(
                    text(f"UPDATE {table} SET {column} = :at WHERE run_id = :run"),
                    {"at": long_ago, "run": grain.run_id},
                )
    finally:
        owner.dispose()
    reconcilers.retention(h.db, long_ago + timedelta(days=91), journal_days=365, outbox_days=90)
    assert stored(h, grain.run_id) == []
    assert [c["seq"] for c in stored(h, young.run_id)] == [1]
    with h.db.tenant(h.tenant) as conn:
        heads = conn.execute(select(output_heads).where(output_heads.c.run_id == grain.run_id))
        assert heads.all() == []


def test_a_resumed_attempt_numbers_from_1_and_its_chunks_follow_the_first_leases(h: Harness):
    """Parked for an approval and leased again (a new fencing token), the re-entered function
    streams from 1 again: its chunks are new ones, after the first lease's, and the holder
    before the park is refused."""
    grain, grant = h.start_run(StepSpec("write", "agent-a", side_effect_class=SHARED))
    grain.execute(write(h, grant, 1, 2, 3))
    approval = request_approval(grain, grant)
    assert approval is not None
    decide(grain, approval, h.reviewer())
    resumed = h.lease(grain, "worker-2")
    assert resumed.attempt_id == grant.attempt_id

    assert grain.execute(write(h, resumed, 1, 2)) == OutputAck(grant.attempt_id, 2, 2, 0)
    assert grain.execute(write(h, resumed, 1, 2, 3)) == OutputAck(grant.attempt_id, 3, 1, 2)
    with pytest.raises(errors.StaleFencingToken):
        grain.execute(write(h, grant, 4))
    found = stored(h, grain.run_id)
    assert [(c["position"], c["seq"]) for c in found] == [(n, n) for n in range(1, 7)]
    assert [c.get("text") or c["data"] for c in found] == [
        "t1",
        {"n": 2},
        "t3",
        "t1",
        {"n": 2},
        "t3",
    ]
