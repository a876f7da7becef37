"""The SDK's batching of streamed output (``runcontrol.sdk._output``, docs/streaming.md) over
an in-memory store that keeps the store's rules (chunks numbered per lease, a resend's chunks
dropped): chunks leave in few writes, in order, once; a lost answer is resent as it was; a
flush stores what is queued; a refusal for good stops the stream and the attempt."""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from runcontrol.clock import SystemClock
from runcontrol.commands import AppendOutput, Command
from runcontrol.domain import LeaseGrant, SideEffectClass, errors
from runcontrol.domain.output import (
    OUTPUT_CHUNK_MAX_BYTES,
    OUTPUT_WRITE_MAX_BYTES,
    OutputAck,
    check_write,
)
from runcontrol.sdk import Backoff
from runcontrol.sdk._step import AttemptContext, LeaseLost
from runcontrol.workers.protocol import Grant


class Store:
    """What ``runcontrol_append_output`` keeps, in memory: the lease's chunks by number."""

    def __init__(self, *, lose_answers: int = 0, refuse: errors.RunControlError | None = None):
        self.chunks: list[Any] = []
        self.writes: list[AppendOutput] = []
        self.lose_answers = lose_answers
        self.refuse = refuse

    async def send_once(self, command: Command[Any]) -> OutputAck:
        assert isinstance(command, AppendOutput)
        await asyncio.sleep(0.005)  # a round trip
        check_write(command.chunks)
        self.writes.append(command)
        if self.refuse is not None:
            raise self.refuse
        acked = len(self.chunks)
        new = [c for c in command.chunks if c.seq > acked]
        assert not new or new[0].seq == acked + 1, "a gap"
        self.chunks.extend(c.text if c.text is not None else c.data for c in new)
        if self.lose_answers:
            self.lose_answers -= 1
            raise errors.Unavailable("the answer was lost")
        return OutputAck(
            command.attempt_id, len(self.chunks), len(new), len(command.chunks) - len(new)
        )


def attempt(store: Store) -> AttemptContext:
    run_id, attempt_id = uuid.uuid4(), uuid.uuid4()
    lease = LeaseGrant(
        run_id=run_id,
        step_id=uuid.uuid4(),
        attempt_id=attempt_id,
        lease_id=uuid.uuid4(),
        fencing_token=1,
        holder="w/1",
        expires_at=datetime.now(UTC) + timedelta(seconds=60),
        agent_id="a",
        skill_id=None,
        attempt_number=1,
        side_effect_class=SideEffectClass.READ,
        gate="none",
    )
    return AttemptContext(
        Grant("claim", "t", lease, None),
        store.send_once,
        clock=SystemClock(),
        backoff=Backoff(base_s=0.01, cap_s=0.02),
        lease_grace=timedelta(seconds=5),
        loop=asyncio.get_running_loop(),
    )


def test_a_token_stream_costs_a_few_writes_a_second_in_order_once() -> None:
    async def main() -> tuple[Store, float]:
        store = Store()
        ctx = attempt(store)
        started = time.monotonic()
        for i in range(100):  # 100 tokens a second for a second
            await ctx.output.add(f"tok{i}")
            await asyncio.sleep(0.01)
        await ctx.output.flush()
        return store, time.monotonic() - started

    store, took = asyncio.run(main())
    assert store.chunks == [f"tok{i}" for i in range(100)]
    # one write per linger (0.2 s) at most, plus the flush: 1 s of tokens in about 6 writes
    assert len(store.writes) <= took / 0.2 + 2, (len(store.writes), took)


def test_a_burst_leaves_at_once_in_writes_of_at_most_the_batch_size() -> None:
    async def main() -> Store:
        store = Store()
        ctx = attempt(store)
        for i in range(450):
            await ctx.output.add({"i": i})
        await ctx.output.flush()
        return store

    store = asyncio.run(main())
    assert store.chunks == [{"i": i} for i in range(450)]
    assert [len(w.chunks) for w in store.writes] == [200, 200, 50]


def test_a_write_whose_answer_was_lost_is_resent_as_it_was() -> None:
    async def main() -> Store:
        store = Store(lose_answers=2)
        ctx = attempt(store)
        for i in range(10):
            await ctx.output.add(f"c{i}")
        await ctx.output.flush()
        return store

    store = asyncio.run(main())
    assert store.chunks == [f"c{i}" for i in range(10)]
    first, *resends = store.writes
    assert resends and all(w == first for w in resends)  # the same command, same id


def test_a_refusal_for_good_stops_the_stream_and_the_attempt() -> None:
    async def main() -> None:
        store = Store(refuse=errors.StaleFencingToken("not the current lease"))
        ctx = attempt(store)
        await ctx.output.add("x")
        with pytest.raises(LeaseLost):
            await ctx.output.flush()
        assert ctx.stop.is_set()
        with pytest.raises(LeaseLost):
            await ctx.output.add("y")

    asyncio.run(main())


def test_the_bounds_are_typed_errors_before_anything_is_sent() -> None:
    async def main() -> Store:
        store = Store()
        ctx = attempt(store)
        with pytest.raises(errors.OutputChunkTooLarge):
            await ctx.output.add("x" * (OUTPUT_CHUNK_MAX_BYTES + 1))
        with pytest.raises(errors.ValidationFailed):
            await ctx.output.add(None)
        big = "y" * OUTPUT_CHUNK_MAX_BYTES
        for _ in range(40):  # 2.5 MiB: writes under the write's byte cap
            await ctx.output.add(big)
        await ctx.output.flush()
        return store

    store = asyncio.run(main())
    assert len(store.chunks) == 40
    assert all(sum(len(c.body) for c in w.chunks) <= OUTPUT_WRITE_MAX_BYTES for w in store.writes)
