"""Rate limits across run hosts (issue 21 item 2), on the real hosts, scheduler and Postgres:
a tenant limit of R/s holds within 10% over 30 s (15 s in ``make test``, 30 in ``make
test-long``) while both hosts dispatch and an SDK worker completes the attempts, and every host
is killed mid-test (the buckets and the held steps' instants are in the database); a worker's
reported consumption delays the next dispatch by units / rate. Admission times are read back
from the stored attempts (``dispatched_at``)."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import datetime
from typing import Any

import pytest
from actor_harness import RayHarness, poll, run_async
from sqlalchemy import select
from test_host_faults import restart_host
from test_sdk import sdk_worker, serving

from runcontrol.ports.policy import DEFAULT_POLICY_ID, document_from_dict
from runcontrol.sdk import Step
from runcontrol.store.tables import attempts, rate_buckets


def limit_policy(h: RayHarness, rate_limits: dict[str, Any]) -> None:
    doc = document_from_dict(DEFAULT_POLICY_ID, "", {"rateLimits": rate_limits})
    h.rt.container.policies.publish(h.tenant, doc, h.rt.container.env.clock.now())


def dispatch_times(h: RayHarness) -> list[datetime]:
    with h.db.tenant(h.tenant) as conn:
        rows = conn.execute(attempts.select().order_by(attempts.c.dispatched_at))
        return [r.dispatched_at for r in rows]


def most_in_any_window(times: list[datetime], seconds: float) -> int:
    best, lo = 0, 0
    for hi, t in enumerate(times):
        while (t - times[lo]).total_seconds() >= seconds:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


RATE = 10.0  # per second: 300 dispatches in a window of 30 s
BURST = 2.0


@pytest.mark.slow
@pytest.mark.alone  # a second of CPU starved while the hosts restart is 10 % of the window
@pytest.mark.parametrize("window_s", [15, pytest.param(30, marks=pytest.mark.long)])
def test_a_tenant_rate_holds_within_10_percent_over_its_window_across_hosts_and_restarts(
    h: RayHarness, window_s: int
) -> None:
    runs = int(RATE * window_s * 1.2)  # a backlog longer than the window measured
    limit_policy(h, {"tenant": {"perSecond": RATE, "burst": BURST}})
    h.publish({"name": "only", "agentId": "echo"})
    worker = sdk_worker(concurrency=4)

    @worker.agent(h.agent("echo"))
    async def echo(step: Step) -> dict[str, Any]:
        return {"echo": step.input}

    async def scenario() -> None:
        submitted = await asyncio.gather(
            *(h.submit(h.request(input={"n": i})) for i in range(runs))
        )
        hosts = {h.host_of(s.run_id) for s in submitted}
        assert hosts == {0, 1}  # both hosts hold (and dispatch) runs of the limited tenant
        await poll(
            lambda: len(dispatch_times(h)) >= runs / 3, "a third of them", timeout=60, interval=0.5
        )
        for index in range(len(h.rt.hosts)):  # every host, mid-test
            await restart_host(h, index)
        await poll(
            lambda: len(dispatch_times(h)) >= runs, "every run dispatched", timeout=90, interval=1
        )

    run_async(serving(h, worker, scenario)(), timeout=240)
    times = dispatch_times(h)
    first = times[0]
    in_window = [t for t in times if (t - first).total_seconds() < window_s]
    expected = RATE * window_s + BURST  # the burst goes at once, then R/s
    per_second = Counter(int((t - first).total_seconds()) for t in times)
    with h.db.tenant(h.tenant) as conn:
        (tat,) = conn.execute(select(rate_buckets.c.tat)).scalars()
    print(
        f"dispatches in the first {window_s} s: {len(in_window)} (expected {expected:g}); "
        f"{len(times)} in all; the bucket's tat at +{(tat - first).total_seconds():.2f} s; "
        f"per second: {[per_second[k] for k in range(max(per_second) + 1)]}"
    )
    assert abs(len(in_window) - expected) <= 0.1 * expected, len(in_window)
    # The limit bounds admissions; a dispatch trails its admission by the sweep (0.5 s here)
    # or a host's restart, so a window after an outage may catch up: over the window it holds.
    assert most_in_any_window(times, window_s) <= 1.1 * expected
    # Every dispatch took exactly one token, the restarts included (none lost, none twice):
    # the bucket is len(times) / R past the first.
    assert abs((tat - first).total_seconds() - len(times) / RATE) <= 0.5


def test_a_reported_consumption_delays_the_next_dispatch_by_units_over_rate(
    h: RayHarness,
) -> None:
    limit_policy(h, {"named": {"model-tokens": {"perSecond": 100, "burst": 1}}})
    h.publish({"name": "gen", "agentId": "gen", "rateLimits": [{"name": "model-tokens"}]})
    worker = sdk_worker()

    @worker.agent(h.agent("gen"))
    async def gen(step: Step) -> dict[str, Any]:
        if step.input == {"n": 0}:
            await step.consume("model-tokens", 300)  # 3 s of the limit
        return {"ok": True}

    async def scenario() -> None:
        first = await h.submit(h.request(input={"n": 0}))
        await h.wait_type(first.run_id, "RunCompleted", timeout=60)
        second = await h.submit(h.request(input={"n": 1}))
        await h.wait_type(second.run_id, "RunCompleted", timeout=60)
        consumed = [r for r in h.outbox(first.run_id) if r.event_type == "RateLimitConsumed"]
        assert [r.payload["units"] for r in consumed] == [300.0]
        with h.db.tenant(h.tenant) as conn:
            (dispatched,) = conn.execute(
                attempts.select().where(attempts.c.run_id == second.run_id)
            )
        delay = (dispatched.dispatched_at - consumed[0].occurred_at).total_seconds()
        assert 3.0 - 0.05 <= delay <= 3.0 + 2.0, delay  # units / rate, plus a sweep's wait

    run_async(serving(h, worker, scenario)(), timeout=120)
