"""A run host's book of credits and offers (``runcontrol.workers.book``): matching credits
to the attempts a host dispatched, grants kept until acked, cancels to the holders' sessions.
Pure: no Ray, no I/O."""

from __future__ import annotations

from datetime import timedelta
from uuid import uuid4

from domain_harness import READ_STEP, T0, TENANT, Harness

from runcontrol.workers.book import CreditBook, Offer, RunView, view
from runcontrol.workers.grants import grant
from runcontrol.workers.protocol import Credit


def credit(*agents: str, tenant: str | None = None, claim: str | None = None) -> Credit:
    return Credit(claim or str(uuid4()), "w-1", agents, tenant)


def offer(agent: str, tenant: str = "t-1", seconds: float = 0.0) -> Offer:
    return Offer(tenant, uuid4(), uuid4(), agent, T0 + timedelta(seconds=seconds))


def waiting(*offers: Offer) -> RunView:
    (run_id,) = {o.run_id for o in offers}
    return RunView(run_id, offers, {}, {}, False)


def test_a_dispatched_attempt_goes_to_the_oldest_waiting_credit_that_accepts_it() -> None:
    book = CreditBook()
    book.offer("s1", [credit("a")], now=0)
    book.offer("s2", [credit("a"), credit("b")], now=0)
    b = offer("b")
    (match,), _ = book.observe(waiting(b))
    assert match.session_id == "s2" and match.offer == b
    a = offer("a")
    (match,), _ = book.observe(waiting(a))
    assert match.session_id == "s1"


def test_a_tenant_bound_credit_takes_only_its_tenants_attempts() -> None:
    book = CreditBook()
    other, mine = offer("a", "t-other"), offer("a", "t-mine", seconds=1)
    assert book.observe(waiting(other)) == ([], set())
    book.observe(waiting(mine))
    (match,), _ = book.offer("s", [credit("a", tenant="t-mine")], now=0)
    assert match.offer == mine  # not the older attempt of another tenant
    assert book.backlog() == {"a": 1}
    (match,), _ = book.offer("s2", [credit("a")], now=0)  # unbound: any tenant
    assert match.offer == other and book.backlog() == {}


def test_a_credit_takes_the_oldest_attempt_of_its_agents() -> None:
    book = CreditBook()
    later, older, oldest_b = offer("a", seconds=5), offer("a", seconds=2), offer("b", seconds=1)
    for o in (later, older, oldest_b):
        book.observe(waiting(o))
    assert book.backlog() == {"a": 2, "b": 1}
    taken = [book.offer("s", [credit("a", "b")], now=0)[0][0].offer for _ in range(3)]
    assert taken == [oldest_b, older, later]


def test_credits_replace_the_sessions_last_set() -> None:
    book = CreditBook()
    first, second = credit("a"), credit("a")
    book.offer("s", [first], now=0)
    book.offer("s", [second], now=0)  # the first is withdrawn (offered to another host)
    (match,), _ = book.observe(waiting(offer("a")))
    assert match.credit == second
    assert book.credits("s") == {}


def test_an_attempt_that_leaves_the_leasable_set_leaves_the_book() -> None:
    book = CreditBook()
    o = offer("a")
    book.observe(waiting(o))
    book.observe(RunView(o.run_id, (), {}, {}, False))  # suspended, cancelled, leased elsewhere
    assert book.backlog() == {}
    assert book.offer("s", [credit("a")], now=0) == ([], [])


def test_a_grant_is_delivered_only_for_a_lease_this_hosts_commit_made() -> None:
    run = Harness((READ_STEP,))
    attempt = run.dispatch()
    book = CreditBook()
    c = credit("reader")
    book.offer("s", [c], now=0)
    (match,), _ = book.observe(view(run.agg, run.batches[-1].events))
    assert match.offer.tenant_id == TENANT
    lease = run.lease(attempt, "w-1")
    book.observe(view(run.agg, run.batches[-1].events))
    made = grant(c.claim_id, run.agg, lease, run.options)
    delivered, again, woken = book.granted(match, made)
    assert delivered and woken == {"s"} and not again
    assert book.grants("s") == [made]  # sent again until acked
    book.ack("s", [c.claim_id])
    assert book.grants("s") == []


def test_a_lease_answered_again_without_a_commit_is_not_a_second_grant() -> None:
    """A second credit of the same holder, matched to an attempt already leased (a stale
    sweep row, another host's grant), is answered the same lease: the credit waits again."""
    run = Harness((READ_STEP,))
    attempt = run.dispatch()
    lease = run.lease(attempt, "w-1")
    book = CreditBook()
    c = credit("reader")
    book.offer("s", [c], now=0)
    stale = Offer(TENANT, attempt.run_id, attempt.attempt_id, "reader", T0)
    (match,), _ = book.found([stale])
    made = grant(c.claim_id, run.agg, lease, run.options)
    delivered, again, _ = book.granted(match, made)  # no commit was observed
    assert not delivered and not again
    assert book.grants("s") == [] and c.claim_id in book.credits("s")


def test_a_refused_grant_gives_the_credit_back_to_the_next_attempt() -> None:
    book = CreditBook()
    c = credit("a")
    book.offer("s", [c], now=0)
    (match,), _ = book.observe(waiting(offer("a")))
    assert book.refused(match) == ([], set())
    (again,), _ = book.observe(waiting(offer("a")))
    assert again.credit == c


def test_a_credit_withdrawn_while_its_lease_is_being_made_is_answered_not_offered_twice() -> None:
    book = CreditBook()
    c = credit("a")
    book.offer("s", [c], now=0)
    (match,), _ = book.observe(waiting(offer("a")))
    matches, withdrawn = book.offer("s", [], now=1)
    assert matches == [] and withdrawn == [match]
    assert book.knows("s", c.claim_id)


def test_the_holder_of_a_cancelled_runs_attempt_is_told_once() -> None:
    run = Harness((READ_STEP,))
    attempt = run.dispatch()
    book = CreditBook()
    book.offer("s", [credit("reader")], now=0)
    (match,), _ = book.observe(view(run.agg, run.batches[-1].events))
    lease = run.lease(attempt, "w-1")
    book.observe(view(run.agg, run.batches[-1].events))
    book.granted(match, grant(match.credit.claim_id, run.agg, lease, run.options))
    run.cancel()
    _, woken = book.observe(view(run.agg, run.batches[-1].events))
    assert woken == {"s"}
    assert book.take_cancels("s") == [attempt.attempt_id]
    _, woken = book.observe(view(run.agg, run.batches[-1].events))
    assert woken == set() and book.take_cancels("s") == []


def test_a_gone_session_is_forgotten() -> None:
    book = CreditBook()
    book.offer("s", [credit("a")], now=0)
    assert book.expire(before=10) == ["s"]
    assert book.end("s") == []  # no grant it never acknowledged
    assert book.waiting_credits() == 0
    assert book.observe(waiting(offer("a")))[0] == []


def test_view_offers_only_leasable_attempts() -> None:
    run = Harness((READ_STEP,))
    attempt = run.dispatch()
    (o,) = view(run.agg).offers
    assert (o.attempt_id, o.agent_id) == (attempt.attempt_id, "reader")
    run.lease(attempt)
    v = view(run.agg, run.batches[-1].events)
    assert v.offers == ()
    assert v.leased == v.new_leases == {attempt.attempt_id: attempt.lease_id}


def test_an_agents_backlog_beginning_wakes_every_session_once() -> None:
    """The first attempt of an agent that no credit here takes: every session's exchange
    answers with the backlog (a worker moves an idle credit here from another host); further
    attempts of that backlog wake nobody."""
    book = CreditBook()
    book.offer("elsewhere", [], now=0)  # a session whose credits are on another host
    book.offer("other-agent", [credit("b")], now=0)
    _, woken = book.observe(waiting(offer("a")))
    assert woken == {"elsewhere", "other-agent"}
    assert book.has_news("elsewhere") and book.backlog() == {"a": 1}
    book.take_backlog_news("elsewhere")
    assert not book.has_news("elsewhere")
    _, woken = book.observe(waiting(offer("a", seconds=1)))
    assert woken == set() and not book.has_news("elsewhere")
    assert book.backlog() == {"a": 2}
    (match,), _ = book.offer("elsewhere", [credit("a")], now=0)  # the moved credit
    assert book.backlog() == {"a": 1}
