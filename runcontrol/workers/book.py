"""A run host's book of the credits offered to it and the attempts (offers) waiting for one
(docs/sessions.md; the messages: ``runcontrol.workers.protocol``).

Pure: no Ray, no I/O, no clock of its own (times are passed in). A run host keeps one book and
tells it what its own commits did to each run (``observe``, from the grain's observers); the
book keeps

- the credits each session offers this host (a tenant-bound credit matches only its tenant),
- the attempts dispatched on this host that no credit has taken yet, per agent and tenant,
  oldest first; a credit that serves every tenant takes the tenant whose turn it is by
  weighted fair shares (``runcontrol.workers.fair_shares``),
- the matches made (a credit and an attempt, while the host leases it through the run's
  mailbox), then the grants, kept until their session acks them,
- which session holds which attempt, so that the host can push the cancels of those attempts,
- the sessions to wake (a long poll waiting for a grant or a cancel).

Every operation returns the sessions it woke; the host owns the waiting (``asyncio``).

A grant is delivered only when the lease it carries was created by this host's own commit
(``leased``): an attempt leased meanwhile by another host (a sweep there found it) or another
credit of the same holder answers the same lease again, which must not become a second slot
working one attempt.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from ..domain import Attempt, AttemptState, Event, RunAggregate, RunState
from .fair_shares import FairShare
from .protocol import Credit, Grant


@dataclass(frozen=True, slots=True)
class Offer:
    """An attempt waiting for a credit: dispatched, unleased, its run leasable."""

    tenant_id: str
    run_id: UUID
    attempt_id: UUID
    agent_id: str
    dispatched_at: datetime
    priority: int = 3  # the run's (issue 21): a tenant's waiting attempts, highest first

    @classmethod
    def of(cls, agg: RunAggregate, attempt: Attempt, agent_id: str) -> Offer:
        """A dispatched attempt of the run ``agg`` (its step's agent ``agent_id``)."""
        run = agg.run
        return cls(
            run.tenant_id,
            run.run_id,
            attempt.attempt_id,
            agent_id,
            attempt.dispatched_at,
            run.priority,
        )


# A waiting attempt in its (agent, tenant) heap: priority first (highest), then dispatch order.
Entry = tuple[int, datetime, int, UUID]


@dataclass(frozen=True, slots=True)
class Match:
    """A credit given an attempt: the host now leases it (``AcquireLease`` by claim id)."""

    session_id: str
    credit: Credit
    offer: Offer


@dataclass(frozen=True, slots=True)
class RunView:
    """What a committed run says to the book (``view``)."""

    run_id: UUID
    offers: tuple[Offer, ...]
    # attempt -> the current lease of each open, leased attempt
    leased: Mapping[UUID, UUID]
    # attempt -> the lease this commit granted (its LeaseGranted event)
    new_leases: Mapping[UUID, UUID]
    # True while a leased attempt's holder must stop (the run is being cancelled)
    cancelling: bool


def view(agg: RunAggregate, events: Sequence[Event] = ()) -> RunView:
    """The run as the book needs it, just after a commit whose ``events`` are given: its
    leasable attempts (Dispatched, run Running and not suspended: what ``acquire_lease``
    accepts), its current leases, the leases the commit granted, whether it is cancelling."""
    run = agg.run
    leasable = run.state is RunState.RUNNING and run.suspended_at is None
    offers: list[Offer] = []
    leased: dict[UUID, UUID] = {}
    for attempt in agg.attempts.values():
        if attempt.state is AttemptState.DISPATCHED and leasable:
            offers.append(Offer.of(agg, attempt, agg.step(attempt.step_id).agent_id))
        elif attempt.state is AttemptState.LEASED and attempt.lease_id is not None:
            leased[attempt.attempt_id] = attempt.lease_id
    new_leases = {
        e.attempt_id: leased[e.attempt_id]
        for e in events
        if e.event_type == "LeaseGranted" and e.attempt_id in leased
    }
    cancelling = run.state is RunState.CANCELLING
    return RunView(run.run_id, tuple(offers), leased, new_leases, cancelling)


@dataclass(frozen=True, slots=True)
class _Held:
    session_id: str
    run_id: UUID
    lease_id: UUID


class CreditBook:
    """A run host's book of credits and offers. ``fair``: the host's fair shares across
    tenants (``runcontrol.workers.fair_shares``): a credit that serves every tenant takes the
    attempt of the tenant whose turn it is, each tenant's own attempts oldest first."""

    def __init__(self, fair: FairShare | None = None) -> None:
        self._fair = fair if fair is not None else FairShare()
        # session -> claim id -> credit (the session's whole current offer, unmatched)
        self._credits: dict[str, dict[str, Credit]] = {}
        # agent -> (session, claim id) waiting, oldest offer first (dicts keep insertion order)
        self._credits_by_agent: dict[str, dict[tuple[str, str], Credit]] = {}
        # attempts waiting: id -> offer; per agent and tenant a heap of
        # (-priority, dispatched, n, id)
        self._offers: dict[UUID, Offer] = {}
        self._heaps: dict[str, dict[str, list[Entry]]] = {}
        self._order = itertools.count()
        self._by_run: dict[UUID, set[UUID]] = {}  # run -> its attempts waiting
        self._waiting: dict[str, int] = {}  # agent -> its attempts waiting (the backlog)
        # Sessions not yet told that an agent's backlog began here (see ``_add_offer``).
        self._backlog_news: set[str] = set()
        self._news_woken: set[str] = set()  # ... of whom not yet woken
        # attempt -> the match leasing it; the lease ids this host's commits created for them
        self._matching: dict[UUID, Match] = {}
        self._fresh: dict[UUID, UUID] = {}
        # session -> claim id -> grant, until acked
        self._grants: dict[str, dict[str, Grant]] = {}
        self._held: dict[UUID, _Held] = {}  # attempt -> who holds its lease
        self._held_by_run: dict[UUID, set[UUID]] = {}
        self._cancels: dict[str, set[UUID]] = {}  # session -> attempts to stop
        self._cancelled: set[UUID] = set()  # attempts whose cancel was queued once
        self._seen: dict[str, float] = {}  # session -> when it last exchanged

    # ------------------------------------------------------------------ sessions

    def offer(
        self, session_id: str, credits: Sequence[Credit], now: float
    ) -> tuple[list[Match], list[Match]]:
        """Replace the session's credits with ``credits``. Answers the new matches, and the
        matches still leasing a credit the session left out (its grant is on its way: the
        host waits for it before answering, so the credit is never offered twice)."""
        self._seen[session_id] = now
        wanted = {c.claim_id: c for c in credits}
        current = self._credits.get(session_id, {})
        for claim_id in [k for k in current if k not in wanted]:
            self._withdraw(session_id, claim_id)
        granted = self._grants.get(session_id, {})
        in_flight = {
            m.credit.claim_id: m for m in self._matching.values() if m.session_id == session_id
        }
        matches: list[Match] = []
        for claim_id, credit in wanted.items():
            if claim_id in current or claim_id in granted or claim_id in in_flight:
                continue
            match = self._take(session_id, credit)
            if match is not None:
                matches.append(match)
            else:
                self._add_credit(session_id, credit)
        withdrawn = [m for k, m in in_flight.items() if k not in wanted]
        return matches, withdrawn

    def credits(self, session_id: str) -> dict[str, Credit]:
        return dict(self._credits.get(session_id, {}))

    def waiting_credits(self) -> int:
        return sum(len(c) for c in self._credits.values())

    def knows(self, session_id: str, claim_id: str) -> bool:
        """Whether the credit ``claim_id`` of the session waits, is being leased or granted."""
        return (
            claim_id in self._credits.get(session_id, {})
            or claim_id in self._grants.get(session_id, {})
            or any(
                m.session_id == session_id and m.credit.claim_id == claim_id
                for m in self._matching.values()
            )
        )

    def expire(self, before: float) -> list[str]:
        """The sessions that have not exchanged since ``before`` (a worker gone)."""
        return [sid for sid, seen in self._seen.items() if seen < before]

    def end(self, session_id: str) -> list[Grant]:
        """Forget the session (its worker is gone): its credits are withdrawn at once, so
        nothing more is granted to its slots. Answers its grants it never acknowledged (their
        leases are held by nobody who works them: the host hands them back)."""
        for claim_id in list(self._credits.get(session_id, {})):
            self._withdraw(session_id, claim_id)
        self._credits.pop(session_id, None)
        unacked = list(self._grants.pop(session_id, {}).values())
        self._cancels.pop(session_id, None)
        self._backlog_news.discard(session_id)
        self._seen.pop(session_id, None)
        return unacked

    # ------------------------------------------------------------------ attempts

    def observe(self, run: RunView) -> tuple[list[Match], set[str]]:
        """Reconcile the book with a run as just committed: its leasable attempts wait (or are
        matched at once), the others leave; holders of its attempts whose lease ended, or whose
        run is cancelling, are told to stop. Answers the matches and the sessions woken."""
        woken: set[str] = set()
        offers = {o.attempt_id: o for o in run.offers}
        for attempt_id in list(self._by_run.get(run.run_id, ())):
            if attempt_id not in offers:
                self._drop_offer(attempt_id)
        for attempt_id, lease_id in run.new_leases.items():
            if attempt_id in self._matching:
                self._fresh[attempt_id] = lease_id
        for attempt_id in list(self._held_by_run.get(run.run_id, ())):
            held = self._held[attempt_id]
            current = run.leased.get(attempt_id)
            if current != held.lease_id:
                # Settled by someone else than its holder, expired or revoked: if its holder
                # reported the outcome, the cancel is an attempt it no longer runs (ignored).
                self._release(attempt_id)
            elif run.cancelling and attempt_id not in self._cancelled:
                self._cancelled.add(attempt_id)
                self._cancels.setdefault(held.session_id, set()).add(attempt_id)
                woken.add(held.session_id)
        matches = [m for m in map(self._add_offer, offers.values()) if m is not None]
        return matches, woken | self._take_news_woken()

    def found(self, offers: Iterable[Offer]) -> tuple[list[Match], set[str]]:
        """Attempts a sweep found in the store (dispatched before this host started, or on a
        host that no longer serves them): those the book does not know already wait.
        Answers the matches and the sessions woken (an agent's backlog began)."""
        matches: list[Match] = []
        for offer in offers:
            if offer.attempt_id in self._matching or offer.attempt_id in self._held:
                continue
            match = self._add_offer(offer)
            if match is not None:
                matches.append(match)
        return matches, self._take_news_woken()

    def reserve(self, offer: Offer) -> Match | None:
        """The oldest waiting credit that accepts ``offer``, taken for it (or None): the
        attempt is being dispatched and leased in one commit (a fused grant). Then
        ``granted`` once the commit is observed, or ``refused`` if it failed.

        No other tenant's turn is skipped: a credit waits only while no attempt it accepts
        does (``offer`` and ``_credit_back`` match it first), so the grant is charged to the
        tenant's share and nothing else is to choose."""
        for (session_id, claim_id), credit in self._credits_by_agent.get(
            offer.agent_id, {}
        ).items():
            if credit.tenant_id is None or credit.tenant_id == offer.tenant_id:
                self._withdraw(session_id, claim_id)
                if credit.tenant_id is None:
                    self._fair.charge(offer.tenant_id)
                match = Match(session_id, credit, offer)
                self._matching[offer.attempt_id] = match
                return match
        return None

    def backlog(self) -> dict[str, int]:
        """Agent -> attempts waiting here (kept as they come and go: an answer costs no pass
        over a deep backlog)."""
        return dict(self._waiting)

    def take_backlog_news(self, session_id: str) -> None:
        """The session is being answered (with the backlog): it has heard the news."""
        self._backlog_news.discard(session_id)

    # ------------------------------------------------------------------ grants

    def granted(self, match: Match, grant: Grant) -> tuple[bool, list[Match], set[str]]:
        """The match's ``AcquireLease`` answered ``grant.lease`` (``runcontrol.workers.grants``).
        Delivered (True) only if this host's commit created that lease; otherwise the credit
        waits again. Answers also the matches the returned credit made and the sessions woken."""
        lease = grant.lease
        fresh = self._fresh.pop(match.offer.attempt_id, None)
        self._matching.pop(match.offer.attempt_id, None)
        if fresh is None or fresh != lease.lease_id or lease.attempt_id in self._held:
            return False, *self._credit_back(match)
        self._deliver(match.session_id, grant)
        return True, [], {match.session_id}

    def refused(self, match: Match) -> tuple[list[Match], set[str]]:
        """The match's lease was refused (taken elsewhere, the run moved on) or failed: the
        attempt leaves the book (a sweep finds it again if it still waits), the credit waits."""
        self._fresh.pop(match.offer.attempt_id, None)
        self._matching.pop(match.offer.attempt_id, None)
        return self._credit_back(match)

    def recovered(self, session_id: str, grant: Grant) -> set[str]:
        """A resent credit's lease found again by its claim id (the store's answer)."""
        self._deliver(session_id, grant)
        return {session_id}

    def grants(self, session_id: str) -> list[Grant]:
        return list(self._grants.get(session_id, {}).values())

    def has_grant(self, session_id: str, claim_id: str) -> bool:
        return claim_id in self._grants.get(session_id, {})

    def ack(self, session_id: str, claim_ids: Iterable[str]) -> None:
        grants = self._grants.get(session_id)
        if grants:
            for claim_id in claim_ids:
                grants.pop(claim_id, None)

    def take_cancels(self, session_id: str) -> list[UUID]:
        """The cancels to send down (once each; the renewal's ``cancel_requested`` is the
        fallback for an answer lost on the way)."""
        return sorted(self._cancels.pop(session_id, set()))

    def has_news(self, session_id: str) -> bool:
        return (
            bool(self._grants.get(session_id))
            or bool(self._cancels.get(session_id))
            or session_id in self._backlog_news
        )

    # ------------------------------------------------------------------ internals

    def _deliver(self, session_id: str, grant: Grant) -> None:
        lease = grant.lease
        self._grants.setdefault(session_id, {})[grant.claim_id] = grant
        self._held[lease.attempt_id] = _Held(session_id, lease.run_id, lease.lease_id)
        self._held_by_run.setdefault(lease.run_id, set()).add(lease.attempt_id)

    def _release(self, attempt_id: UUID) -> None:
        held = self._held.pop(attempt_id, None)
        self._cancelled.discard(attempt_id)
        if held is None:
            return
        attempts = self._held_by_run.get(held.run_id)
        if attempts is not None:
            attempts.discard(attempt_id)
            if not attempts:
                del self._held_by_run[held.run_id]

    def _credit_back(self, match: Match) -> tuple[list[Match], set[str]]:
        if match.session_id not in self._seen:
            return [], set()
        again = self._take(match.session_id, match.credit)
        if again is not None:
            return [again], set()
        self._add_credit(match.session_id, match.credit)
        return [], set()

    def _add_credit(self, session_id: str, credit: Credit) -> None:
        self._credits.setdefault(session_id, {})[credit.claim_id] = credit
        for agent_id in credit.agent_ids:
            self._credits_by_agent.setdefault(agent_id, {})[(session_id, credit.claim_id)] = credit

    def _withdraw(self, session_id: str, claim_id: str) -> None:
        credit = self._credits.get(session_id, {}).pop(claim_id, None)
        if credit is None:
            return
        for agent_id in credit.agent_ids:
            waiting = self._credits_by_agent.get(agent_id)
            if waiting is not None:
                waiting.pop((session_id, claim_id), None)
                if not waiting:
                    del self._credits_by_agent[agent_id]

    def _take(self, session_id: str, credit: Credit) -> Match | None:
        """The attempt ``credit`` accepts of the tenant whose turn it is (the least fair-share
        tag, then the oldest head: ``runcontrol.workers.fair_shares``), matched to it (or None). A
        credit bound to a tenant takes that tenant's oldest. O(agents x tenants waiting)."""
        fair = self._fair
        best: tuple[float, Entry] | None = None
        for agent_id in credit.agent_ids:
            by_tenant = self._heaps.get(agent_id)
            if not by_tenant:
                continue
            if credit.tenant_id is not None:
                heap = by_tenant.get(credit.tenant_id)
                head = self._head(heap) if heap is not None else None
                if head is not None and (best is None or head < best[1]):
                    best = (0.0, head)
                continue
            for tenant_id, heap in by_tenant.items():
                head = self._head(heap)
                if head is not None:
                    key = (fair.tag(tenant_id), head)
                    if best is None or key < best:
                        best = key
        if best is None:
            return None
        offer = self._offers[best[1][3]]
        self._drop_offer(offer.attempt_id)
        if credit.tenant_id is None:
            fair.charge(offer.tenant_id)
        match = Match(session_id, credit, offer)
        self._matching[offer.attempt_id] = match
        return match

    def _head(self, heap: list[Entry]) -> Entry | None:
        while heap and heap[0][3] not in self._offers:
            heapq.heappop(heap)  # left the book (lazy deletion)
        return heap[0] if heap else None

    def _take_news_woken(self) -> set[str]:
        woken, self._news_woken = self._news_woken, set()
        return woken

    def _add_offer(self, offer: Offer) -> Match | None:
        if offer.attempt_id in self._offers or offer.attempt_id in self._matching:
            return None
        if offer.attempt_id in self._held:
            return None
        match = self.reserve(offer)
        if match is not None:
            return match
        self._offers[offer.attempt_id] = offer
        waiting = self._waiting.get(offer.agent_id, 0)
        self._waiting[offer.agent_id] = waiting + 1
        if not waiting:
            # The agent's first attempt waiting here, and no credit here takes it: every
            # session hears of it now (its exchange answers), not when its long poll ends, so
            # a worker with idle credits on another host moves one here (``sdk._slots``).
            # Once per backlog, not per attempt: a deep backlog costs no wake-ups.
            self._backlog_news.update(self._seen)
            self._news_woken.update(self._seen)
        heap = self._heaps.setdefault(offer.agent_id, {}).setdefault(offer.tenant_id, [])
        entry = (-offer.priority, offer.dispatched_at, next(self._order), offer.attempt_id)
        heapq.heappush(heap, entry)
        self._by_run.setdefault(offer.run_id, set()).add(offer.attempt_id)
        return None

    def _drop_offer(self, attempt_id: UUID) -> None:
        offer = self._offers.pop(attempt_id, None)
        if offer is None:
            return
        left = self._waiting[offer.agent_id] - 1
        if left:
            self._waiting[offer.agent_id] = left
        else:
            del self._waiting[offer.agent_id]
        waiting = self._by_run.get(offer.run_id)
        if waiting is not None:
            waiting.discard(attempt_id)
            if not waiting:
                del self._by_run[offer.run_id]
        by_tenant = self._heaps.get(offer.agent_id)
        if by_tenant is not None:
            heap = by_tenant.get(offer.tenant_id)
            if heap is not None and self._head(heap) is None:
                del by_tenant[offer.tenant_id]
                if not by_tenant:
                    del self._heaps[offer.agent_id]
