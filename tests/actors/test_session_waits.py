"""A worker session's waiting exchange is answered at once when a newer one supersedes it, however
close behind the newer one follows (the real hosts; ``HostSessions.exchange`` / ``_wait``).

Before each waiting exchange had its own event, the newer exchange's own wait cleared the
session's one event after setting it: an exchange superseded before its wait had begun sat out
its whole ``wait_s``. Seen as `runcontrol up`'s Ctrl-C taking 4-22 s in an idle drain (the
demo workers' closing exchanges), and here in one try in two."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter

from actor_harness import RayHarness, poll, run_async

from actors.run_host import make_router
from runcontrol.client import RunControlClient
from runcontrol.sdk import Step, Worker
from runcontrol.workers.protocol import SessionDown, SessionUp

TRIES = 20


def test_a_long_poll_superseded_right_behind_is_answered_at_once(h: RayHarness) -> None:
    """A 20 s long poll and a newer exchange sent right behind it (the same loop turn): both
    answered within a second, every try."""
    t = make_router(h.rt.config)

    async def main() -> list[float]:
        took = []
        for _ in range(TRIES):
            sid = f"s-{uuid.uuid4().hex[:8]}"
            await t.exchange(1, SessionUp(sid, wait_s=0, seq=1))
            began = time.monotonic()
            await asyncio.gather(
                t.exchange(1, SessionUp(sid, wait_s=20, seq=2)),
                t.exchange(1, SessionUp(sid, wait_s=0, seq=3)),
            )
            took.append(time.monotonic() - began)
        return took

    took = run_async(main(), timeout=TRIES * 25)
    assert max(took) < 1.0, [round(s, 3) for s in took]


class LongPolls:
    """The real client, counting the long polls (exchanges that offer credits and may wait)
    each session has in flight."""

    def __init__(self, client: RunControlClient) -> None:
        self.client = client
        self.in_flight: Counter[str] = Counter()

    async def hosts(self) -> int:
        return await self.client.hosts()

    async def exchange(self, host: int, up: SessionUp) -> SessionDown:
        polling = up.wait_s > 0 and bool(up.credits)
        self.in_flight[up.session_id] += polling
        try:
            return await self.client.exchange(host, up)
        finally:
            self.in_flight[up.session_id] -= polling


def test_idle_sdk_workers_stop_at_once(h: RayHarness) -> None:
    """Two SDK workers (their default 20 s long polls) offering slots, stopped while each has
    a long poll waiting: they have returned within two seconds, every try."""
    h.publish({"name": "only", "agentId": "idle-stop"})
    agent = h.agent("idle-stop")
    client = LongPolls(RunControlClient(make_router(h.rt.config)))

    async def main() -> list[float]:
        took = []
        for n in range(4):
            workers = [Worker(f"idle-{n}-{k}") for k in range(2)]
            for worker in workers:

                @worker.agent(agent)
                async def noop(step: Step) -> None:
                    return None

            tasks = [
                asyncio.create_task(worker.run(client, f"idle-{n}-{k}", concurrency=2))
                for k, worker in enumerate(workers)
            ]
            await poll(
                lambda: sum(n > 0 for n in client.in_flight.values()) >= 2,
                "a long poll of each worker in flight",
            )
            began = time.monotonic()
            for worker in workers:
                worker.stop()
            await asyncio.wait_for(asyncio.gather(*tasks), 40)
            took.append(time.monotonic() - began)
        return took

    took = run_async(main(), timeout=240)
    assert max(took) < 2.0, [round(s, 3) for s in took]
