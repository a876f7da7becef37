"""Priority (issue 21) where attempts wait for workers: a run host's credit book gives a
tenant's waiting attempts to credits highest run priority first, then in dispatch order; the
run's priority travels in its offers (``view``). Pure: no Ray, no I/O."""

from __future__ import annotations

from datetime import timedelta
from uuid import uuid4

from domain_harness import T0

from runcontrol.workers.book import CreditBook, Offer
from runcontrol.workers.protocol import Credit


def offer(seconds: float, priority: int = 3) -> Offer:
    return Offer("t-1", uuid4(), uuid4(), "a", T0 + timedelta(seconds=seconds), priority)


def test_a_tenants_higher_priority_attempt_is_granted_before_its_older_backlog() -> None:
    book = CreditBook()
    backlog = [offer(i) for i in range(3)]
    low = offer(-10, priority=1)
    urgent = offer(10, priority=5)
    assert book.found([low, *backlog, urgent]) == ([], set())  # no credit yet: all wait
    granted = []
    for i in range(5):
        (match,), _ = book.offer(f"s{i}", [Credit(str(uuid4()), f"w{i}", ("a",), None)], now=0)
        granted.append(match.offer)
    assert granted == [urgent, *backlog, low]
