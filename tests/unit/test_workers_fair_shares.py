"""Weighted fair shares across tenants (``runcontrol.workers.fair_shares``) and the host's
book's use of them: a credit that serves every tenant takes the tenant whose turn it is. Pure."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta
from uuid import uuid4

import pytest
from domain_harness import T0
from hypothesis import given, settings
from hypothesis import strategies as st

from runcontrol.workers.book import CreditBook, Offer, RunView
from runcontrol.workers.fair_shares import FairShare
from runcontrol.workers.protocol import Credit


def credit(tenant: str | None = None) -> Credit:
    return Credit(str(uuid4()), "w", ("a",), tenant)


class Backlog:
    """A book with attempts of agent ``a`` waiting, per tenant, and a worker offering one
    credit at a time, each taken at once (as a slot freed by a report would be)."""

    def __init__(self, weights: dict[str, float] | None = None) -> None:
        self.book = CreditBook(FairShare(weights))
        self.clock = 0.0

    def dispatch(self, tenant: str, n: int = 1) -> list[Offer]:
        offers = []
        for _ in range(n):
            self.clock += 1.0
            o = Offer(tenant, uuid4(), uuid4(), "a", T0 + timedelta(seconds=self.clock))
            self.book.observe(RunView(o.run_id, (o,), {}, {}, False))
            offers.append(o)
        return offers

    def grant(self, n: int, tenant: str | None = None) -> list[str]:
        taken = []
        for _ in range(n):
            matches, _ = self.book.offer("s", [credit(tenant)], now=0)
            if not matches:
                break
            (match,) = matches
            taken.append(match.offer.tenant_id)  # (its lease is never made: not needed here)
        return taken


def test_two_backlogged_tenants_of_weights_2_and_1_are_granted_2_to_1() -> None:
    b = Backlog({"big": 2.0})
    b.dispatch("big", 400)
    b.dispatch("small", 400)  # dispatched after all of big's: FIFO would serve none of them
    counts = Counter(b.grant(300))
    assert abs(counts["big"] - 200) <= 1 and abs(counts["small"] - 100) <= 1, counts


def test_equal_tags_go_to_the_oldest_head() -> None:
    b = Backlog()
    (older,) = b.dispatch("x")
    b.dispatch("y")
    matches, _ = b.book.offer("s", [credit()], now=0)
    assert matches[0].offer == older


def test_one_interactive_run_is_granted_next_behind_a_deep_backlog() -> None:
    b = Backlog()
    b.dispatch("batch", 5000)
    assert b.grant(10) == ["batch"] * 10
    b.dispatch("interactive")
    assert b.grant(2).count("interactive") == 1  # its turn comes at once: one grant at most


def test_an_idle_tenant_that_returns_gets_its_share_not_a_burst() -> None:
    b = Backlog()
    b.dispatch("a", 3000)
    b.dispatch("b", 10)
    b.grant(20)  # both active: b's 10 go in turn
    assert b.book.backlog() == {"a": 2990}
    assert b.grant(1000) == ["a"] * 1000  # b idle: a alone, its tag runs far ahead
    b.dispatch("b", 100)
    window = b.grant(20)
    # b starts at the virtual time now, not where it stopped: alternate, no run of b's
    assert abs(window.count("b") - 10) <= 1, window
    assert "bbb" not in "".join(t[0] for t in window)


def test_a_credit_bound_to_a_tenant_is_not_charged_to_its_share() -> None:
    b = Backlog()
    b.dispatch("own", 50)
    b.dispatch("other", 50)
    assert b.grant(20, tenant="own") == ["own"] * 20  # its own worker's slots
    shared = b.grant(10)
    assert shared.count("own") == 5, shared  # still an equal turn of the shared slots


def test_a_fused_grant_is_charged_to_its_tenants_share() -> None:
    fair = FairShare()
    book = CreditBook(fair)
    book.offer("s", [credit()], now=0)
    o = Offer("x", uuid4(), uuid4(), "a", T0)
    match = book.reserve(o)
    assert match is not None and fair.tag("x") == 1.0 and fair.tag("y") == 0.0


def test_weights_must_be_positive() -> None:
    with pytest.raises(ValueError):
        FairShare({"t": 0.0})


@settings(max_examples=200, deadline=None)
@given(
    weights=st.lists(st.integers(1, 5), min_size=2, max_size=5),
    grants=st.integers(1, 400),
)
def test_backlogged_tenants_share_in_proportion_to_their_weights(
    weights: list[int], grants: int
) -> None:
    """SFQ's bound: for any two tenants backlogged throughout, grants_i / w_i and
    grants_j / w_j differ by at most 1 / w_i + 1 / w_j."""
    fair = FairShare({f"t{k}": float(w) for k, w in enumerate(weights)})
    tenants = [f"t{k}" for k in range(len(weights))]
    counts = Counter[str]()
    for _ in range(grants):
        chosen = min(tenants, key=lambda t: (fair.tag(t), tenants.index(t)))
        fair.charge(chosen)
        counts[chosen] += 1
    for i, ti in enumerate(tenants):
        for j, tj in enumerate(tenants):
            bound = 1 / weights[i] + 1 / weights[j]
            assert abs(counts[ti] / weights[i] - counts[tj] / weights[j]) <= bound + 1e-9


@settings(max_examples=120, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 40)), min_size=1, max_size=30))
def test_a_tenant_coming_and_going_never_gets_more_than_its_turn(
    steps: list[tuple[int, int]],
) -> None:
    """Tenant q's attempts arrive and drain in any pattern beside p's deep backlog (equal
    weights): in no window of grants does q get more than half (and one), however long it was
    idle before."""
    b = Backlog()
    b.dispatch("p", 30 * 40 + 1)  # more than every grant the steps can take: p never runs dry
    for arrive, take in steps:
        b.dispatch("q", arrive)
        window = b.grant(take)
        assert window.count("q") <= take // 2 + 1, (window, steps)


def test_weights_come_from_the_settings_and_must_be_positive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from pydantic import ValidationError

    from runcontrol.config import Settings

    monkeypatch.setenv("RUNCONTROL_FLOW__TENANT_WEIGHTS", '{"acme": 2}')
    flow = Settings().flow
    fair = FairShare(flow.tenant_weights, flow.default_tenant_weight)
    assert fair.weight("acme") == 2.0 and fair.weight("other") == 1.0
    monkeypatch.setenv("RUNCONTROL_FLOW__TENANT_WEIGHTS", '{"acme": 0}')
    with pytest.raises(ValidationError):
        Settings()
