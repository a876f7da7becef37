"""Which run host each free slot is offered to (pure: no I/O, no clock).

A free slot is one *credit* (a claim id) offered to exactly one host at a time, so no slot is
ever granted twice (``runcontrol.workers.protocol``). A new credit goes where work waits: the host
the slot's last attempt came from (whose commit of that attempt's outcome may grant the next step to
it at once) unless another host has attempts waiting and no slot of this worker at all, else the
host whose backlog most exceeds the credits offered there, else the host with the fewest. Idle
credits move towards hosts whose ``backlog`` says they dispatched attempts that no credit has taken:
a move is a withdrawal from one host, and an offer to the other once the first certainly did not
grant it, under a new claim id.

Exchanges are not delivered in order, but an older one that still carries a withdrawn credit
offers nothing: its ``seq`` is older than the newest its host saw (``runcontrol.workers.protocol``).
A host can still grant a credit after the worker took it back in one case: the exchange that
withdrew it found the credit's lease being made and the lease took longer to commit than that
exchange waits for it (``RunHost.exchange_packed``, a stalled store); the grant then comes down in a
later answer. Such a late grant is never dropped: its lease would expire unworked and settle
a side-effecting attempt Uncertain. It is worked on an extra slot, beyond the concurrency for
as long as it runs; the claim ids a slot gave up are kept for that.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum

from ..commands import new_command_id
from ..workers.protocol import Credit


class SlotState(Enum):
    OFFERED = "offered"
    MOVING = "moving"  # withdrawn from ``host``, offered to ``target`` once confirmed
    BUSY = "busy"
    STOPPED = "stopped"


EXTRA = -1  # the index of a slot made for a late grant


@dataclass
class Slot:
    index: int
    holder: str
    state: SlotState = SlotState.STOPPED
    credit: Credit | None = None
    host: int | None = None
    target: int | None = None
    last_host: int | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    host: int
    credit: Credit


@dataclass(frozen=True, slots=True)
class Move:
    claim_id: str
    source: int
    target: int


@dataclass
class SlotBook:
    hosts: int
    holders: Sequence[str]
    agent_ids: tuple[str, ...]
    tenant_id: str | None = None
    new_id: Callable[[], str] = new_command_id
    slots: list[Slot] = field(init=False)
    backlog: list[int] = field(init=False)
    draining: set[int] = field(default_factory=set)
    stopping: bool = False
    # claim ids given up (withdrawn, or replaced by a move) -> the slot that offered them
    retired: dict[str, Slot] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.slots = [Slot(k, h) for k, h in enumerate(self.holders)]
        self.backlog = [0] * self.hosts

    # ------------------------------------------------------------------ queries

    def offered(self, host: int) -> int:
        return sum(1 for s in self.slots if s.state is SlotState.OFFERED and s.host == host)

    def idle(self) -> int:
        return sum(1 for s in self.slots if s.state in (SlotState.OFFERED, SlotState.MOVING))

    def busy(self) -> int:
        return sum(1 for s in self.slots if s.state is SlotState.BUSY)

    def by_claim(self, claim_id: str) -> Slot | None:
        for slot in self.slots:
            if slot.credit is not None and slot.credit.claim_id == claim_id:
                return slot
        return None

    def settled(self) -> bool:
        """Stopping, and no credit is offered or on its way anywhere."""
        return all(s.state in (SlotState.BUSY, SlotState.STOPPED) for s in self.slots)

    # ------------------------------------------------------------------ changes

    def grow(self, hosts: int) -> None:
        if hosts > self.hosts:
            self.backlog += [0] * (hosts - self.hosts)
            self.hosts = hosts

    def free(self, slot: Slot) -> Placement | None:
        """The slot is free: its new credit and the host to offer it to (None: stopping, or
        an extra slot, which ends with its attempt)."""
        if self.stopping or slot.index == EXTRA:
            slot.state, slot.credit, slot.host = SlotState.STOPPED, None, None
            return None
        host = self._best_host(slot.last_host)
        slot.credit = self._credit(slot)
        slot.state, slot.host, slot.target = SlotState.OFFERED, host, None
        return Placement(host, slot.credit)

    def granted(self, claim_id: str, host: int) -> Slot | None:
        """The slot that works this grant: the one offering the credit, or an extra one for
        a late grant of a credit given up. None: not a credit of this worker."""
        slot = self.by_claim(claim_id)
        if slot is not None and slot.state in (SlotState.OFFERED, SlotState.MOVING):
            slot.state, slot.host, slot.target, slot.last_host = SlotState.BUSY, host, None, host
            return slot
        origin = self.retired.pop(claim_id, None)
        if origin is None:
            return None
        return Slot(EXTRA, origin.holder, SlotState.BUSY, host=host, last_host=host)

    def withdrawn(self, claim_id: str) -> Placement | None:
        """A withdrawal is confirmed: offer the slot where it was moving, under a new claim
        id (or stop it)."""
        slot = self.by_claim(claim_id)
        if slot is None or slot.state is not SlotState.MOVING or slot.credit is None:
            return None
        self.retired[claim_id] = slot
        if self.stopping or slot.target is None:
            slot.state, slot.credit, slot.host = SlotState.STOPPED, None, None
            return None
        slot.credit = self._credit(slot)
        slot.state, slot.host, slot.target = SlotState.OFFERED, slot.target, None
        return Placement(slot.host, slot.credit)

    def _credit(self, slot: Slot) -> Credit:
        return Credit(
            claim_id=self.new_id(),
            holder=slot.holder,
            agent_ids=self.agent_ids,
            tenant_id=self.tenant_id,
        )

    def observe(self, host: int, backlog: Mapping[str, int], draining: bool = False) -> None:
        self.backlog[host] = sum(backlog.get(a, 0) for a in self.agent_ids)
        if draining:
            self.draining.add(host)
        else:
            self.draining.discard(host)

    def rebalance(self) -> list[Move]:
        """Moves of idle credits from hosts with more credits than backlog to hosts with
        backlog beyond their credits."""
        if self.stopping:
            return []
        moves = self._off_draining()
        # A host's backlog already counts only what the credits waiting there did not take.
        deficit = {h: self.backlog[h] - self._moving_to(h) for h in range(self.hosts)}
        for target in sorted(self._open(), key=lambda h: -deficit[h]):
            while deficit[target] > 0:
                source = self._spare(exclude=target)
                if source is None:
                    return moves
                slot = next(
                    s for s in self.slots if s.state is SlotState.OFFERED and s.host == source
                )
                assert slot.credit is not None
                slot.state, slot.target = SlotState.MOVING, target
                moves.append(Move(slot.credit.claim_id, source, target))
                deficit[target] -= 1
        return moves

    def stop(self) -> list[Move]:
        """Stop offering: every idle credit is withdrawn (target None)."""
        self.stopping = True
        moves = []
        for slot in self.slots:
            if slot.state is SlotState.OFFERED and slot.credit is not None:
                assert slot.host is not None
                slot.state, slot.target = SlotState.MOVING, None
                moves.append(Move(slot.credit.claim_id, slot.host, -1))
            elif slot.state is SlotState.MOVING:
                slot.target = None
        return moves

    # ------------------------------------------------------------------ placement

    def _incoming(self, host: int) -> int:
        return sum(
            1
            for s in self.slots
            if (s.state is SlotState.OFFERED and s.host == host)
            or (s.state is SlotState.MOVING and s.target == host)
        )

    def _open(self) -> list[int]:
        """The hosts that take credits: those not draining (all of them if every one is)."""
        open_hosts = [h for h in range(self.hosts) if h not in self.draining]
        return open_hosts or list(range(self.hosts))

    def _off_draining(self) -> list[Move]:
        """A draining host takes no credit: move every credit offered there elsewhere."""
        moves = []
        for slot in self.slots:
            if slot.state is SlotState.OFFERED and slot.host in self.draining:
                target = self._best_host(None)
                if target in self.draining or slot.credit is None:
                    continue
                slot.state, slot.target = SlotState.MOVING, target
                moves.append(Move(slot.credit.claim_id, slot.host, target))
        return moves

    def _starved(self, exclude: int) -> int | None:
        """An open host with attempts waiting and no slot of this worker there (offered,
        working there, or on its way). Slots keep to the host of their last attempt, and only
        idle credits move: without this, a host whose credits all left while both hosts had
        a backlog got none until the other's drained (measured: 17.7 s without a grant, a
        tenant's one run waiting all that time; ``bench.fairness``)."""
        for host in self._open():
            if host != exclude and self.backlog[host] > 0 and not self._serving(host):
                return host
        return None

    def _serving(self, host: int) -> bool:
        return any(
            (s.state in (SlotState.OFFERED, SlotState.BUSY) and s.host == host)
            or (s.state is SlotState.MOVING and s.target == host)
            for s in self.slots
        )

    def _moving_to(self, host: int) -> int:
        return sum(1 for s in self.slots if s.state is SlotState.MOVING and s.target == host)

    def _spare(self, exclude: int) -> int | None:
        """A host with idle credits and nothing waiting for them (the most idle first)."""
        spare = {
            h: self.offered(h)
            for h in range(self.hosts)
            if h != exclude and self.offered(h) > 0 and self.backlog[h] == 0
        }
        return max(spare, key=lambda h: (spare[h], -h)) if spare else None

    def _best_host(self, last: int | None) -> int:
        if last is not None and last < self.hosts and last not in self.draining:
            starved = self._starved(exclude=last)
            return last if starved is None else starved
        return max(
            self._open(),
            key=lambda h: (self.backlog[h] - self._incoming(h), -self._incoming(h), -h),
        )
