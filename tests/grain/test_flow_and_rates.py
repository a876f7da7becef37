"""A step under both a concurrency key and a rate limit (issue 21): the key is decided first, so
a step the key holds takes no units meanwhile, and a reservation made before the key refused
it is kept by the key's hold and spent by the dispatch once the step is promoted (never twice).
Real PostgreSQL (the slots' and the buckets' SQL), a manual clock."""

from __future__ import annotations

from typing import Any

from grain_harness import Harness
from sqlalchemy import text
from test_flow_control import APPLY, finish, held, publish, submit, waiters
from test_rate_limits import limit_policy

from runcontrol.domain import RunState, StepState
from runcontrol.domain.rates import RATE_LIMIT


def tat(h: Harness) -> Any:
    with h.db.system_tx() as conn:
        return conn.execute(text("SELECT tat FROM rate_buckets WHERE bucket = 'tenant'")).scalar()


def test_a_step_held_by_its_key_keeps_its_units_and_spends_them_once(h: Harness) -> None:
    limit_policy(h, {"tenant": {"perSecond": 1, "burst": 5}})
    publish(h, APPLY)
    first = submit(h, "repo-x")
    second = submit(h, "repo-x")  # reserved a unit, then the key refused it
    assert h.load(first.run_id).attempts
    hold = held(h, second)
    assert hold is not None and hold["kind"] == "concurrency"
    assert hold["reservation"]["kind"] == RATE_LIMIT and hold["reservation"]["attempt"] == 1
    after_two = tat(h)

    for _ in range(3):  # reminders of a held step take nothing
        h.wake(second)
    assert tat(h) == after_two and held(h, second)["kind"] == "concurrency"

    h.clock.advance(2)
    finish(h, first)  # frees the slot, promotes the waiter
    (w,) = waiters(h)
    assert w.run_id == second.run_id and w.promoted
    h.wake(second)
    agg = h.load(second.run_id)
    (step,) = agg.steps
    assert step.state is StepState.RUNNING and step.held is None
    assert agg.run.state is RunState.RUNNING
    assert tat(h) == after_two  # its kept reservation: no second unit taken
