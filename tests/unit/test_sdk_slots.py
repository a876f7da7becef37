"""Where the worker SDK offers its free slots (``runcontrol.sdk._slots``, pure)."""

from __future__ import annotations

import itertools

from runcontrol.sdk._slots import Move, SlotBook, SlotState


def book(hosts: int, slots: int) -> SlotBook:
    ids = (f"c{n}" for n in itertools.count())
    return SlotBook(hosts, [f"w/{k}" for k in range(slots)], ("a",), new_id=lambda: next(ids))


def offer_all(b: SlotBook) -> list[int]:
    return [offer.host for slot in b.slots if (offer := b.free(slot)) is not None]


def test_new_credits_spread_over_the_hosts() -> None:
    b = book(hosts=2, slots=4)
    assert sorted(offer_all(b)) == [0, 0, 1, 1]


def test_a_freed_slot_is_offered_where_its_last_attempt_came_from() -> None:
    b = book(hosts=2, slots=2)
    offer_all(b)
    slot = b.granted("c1", host=1)
    assert slot is not None and slot.state is SlotState.BUSY
    again = b.free(slot)
    assert again is not None and again.host == 1 and again.credit.claim_id == "c2"


def test_a_freed_slot_goes_to_a_host_with_a_backlog_and_no_slot_of_this_worker() -> None:
    """Every slot works on host 1 and host 0 has attempts waiting: no credit is idle, so none
    would move; the next slot to free goes to host 0 instead of back to host 1."""
    b = book(hosts=2, slots=3)
    offer_all(b)
    busy = [b.granted(slot.credit.claim_id, host=1) for slot in b.slots if slot.credit]
    b.observe(0, {"a": 5})
    b.observe(1, {"a": 5})
    first, second = busy[0], busy[1]
    assert first is not None and second is not None
    moved = b.free(first)
    assert moved is not None and moved.host == 0
    again = b.free(second)  # host 0 has a slot of this worker now: back to its last host
    assert again is not None and again.host == 1


def test_idle_credits_move_to_a_backlog_and_arrive_once_withdrawn() -> None:
    b = book(hosts=2, slots=2)
    offer_all(b)  # c0 -> host 0, c1 -> host 1
    b.observe(1, {"a": 2})
    assert b.rebalance() == [Move("c0", 0, 1)]
    assert b.rebalance() == []  # already on its way
    arrived = b.withdrawn("c0")
    assert arrived is not None and arrived.host == 1
    assert b.offered(1) == 2 and b.offered(0) == 0


def test_a_credit_granted_while_moving_is_busy_not_moved() -> None:
    b = book(hosts=2, slots=1)
    offer_all(b)
    b.observe(1, {"a": 1})
    (move,) = b.rebalance()
    assert b.granted(move.claim_id, host=0) is not None
    assert b.withdrawn(move.claim_id) is None


def test_a_backlog_of_other_agents_moves_nothing() -> None:
    b = book(hosts=2, slots=2)
    offer_all(b)
    b.observe(1, {"other": 5})
    assert b.rebalance() == []


def test_a_draining_hosts_credits_move_and_new_ones_avoid_it() -> None:
    b = book(hosts=2, slots=2)
    offer_all(b)
    b.observe(0, {}, draining=True)
    assert b.rebalance() == [Move("c0", 0, 1)]
    slot = b.granted("c1", host=1)
    assert slot is not None
    slot.last_host = 0
    offer = b.free(slot)
    assert offer is not None and offer.host == 1


def test_stopping_withdraws_every_idle_credit_and_offers_nothing_new() -> None:
    b = book(hosts=2, slots=3)
    offer_all(b)
    busy = b.granted("c2", host=0)
    assert busy is not None
    moves = b.stop()
    assert {m.claim_id for m in moves} == {"c0", "c1"}
    assert not b.settled()
    assert b.withdrawn("c0") is None and b.withdrawn("c1") is None
    assert b.settled()
    assert b.free(busy) is None and busy.state is SlotState.STOPPED


def test_a_late_grant_of_a_credit_given_up_is_worked_on_an_extra_slot() -> None:
    b = book(hosts=2, slots=1)
    offer_all(b)  # c0 -> host 0
    b.observe(1, {"a": 1})
    (move,) = b.rebalance()
    arrived = b.withdrawn(move.claim_id)
    assert arrived is not None and arrived.credit.claim_id == "c1"  # a new claim id
    extra = b.granted("c0", host=0)  # host 0 granted c0 after all
    assert extra is not None and extra.index < 0 and extra.holder == "w/0"
    assert b.granted("c0", host=0) is None  # once
    assert b.free(extra) is None  # an extra slot ends with its attempt
    assert b.granted("c1", host=1) is not None
    assert b.granted("nobody", host=1) is None
