"""Group commit: the grain commands a process commits at the same moment share one statement.

Each command's change is one JSON document for ``runcontrol_apply`` (migration 0002). When
several threads commit at once, the first becomes the leader: it sends every document queued
so far in one ``runcontrol_apply_many`` call on its own connection, so the group costs one
round trip and one commit (one WAL flush) instead of one each. Each document runs in its own
subtransaction there, so one command's lost race or refusal rolls back only that command; the
others commit together, each still with its outbox and journal rows (invariant 3). While a
group is being sent, new arrivals queue; the leader then hands leadership to the first of them.
A lone command is sent at once, as itself: nothing ever waits for company.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field

# What the database answered for one document: None (committed) or (SQLSTATE, message).
Answer = tuple[str, str] | None
Sender = Callable[[list[str]], list[Answer]]
MAX_GROUP = 64


@dataclass(eq=False)
class _Slot:
    doc: str
    send: Sender
    key: str  # the run: a group writes its runs in key order (no deadlock between groups)
    done: threading.Event = field(default_factory=threading.Event)
    answer: Answer | BaseException = None
    lead: bool = False


class GroupCommit:
    def __init__(self, max_group: int = MAX_GROUP) -> None:
        self._max = max_group
        self._lock = threading.Lock()
        self._queue: list[_Slot] = []
        self._busy = False
        self.groups = 0  # groups sent, and documents in them (for benchmarks and tests)
        self.documents = 0

    def apply(self, doc: str, send: Sender, key: str = "") -> Answer:
        """Commit ``doc`` alone or with whatever else is committing now; ``send`` sends a
        group on the caller's own connection if the caller ends up leading it. Raises what
        ``send`` raised when the whole group failed (a lost connection)."""
        slot = _Slot(doc, send, key)
        with self._lock:
            self._queue.append(slot)
            leads = not self._busy
            self._busy = True
        if not leads:
            slot.done.wait()
            if not slot.lead:
                return self._result(slot)
        self._lead(slot)
        return self._result(slot)

    def _lead(self, me: _Slot) -> None:
        with self._lock:
            group, self._queue = self._queue[: self._max], self._queue[self._max :]
        successor: _Slot | None = None
        try:
            # Two groups (two hosts, each with an activation of the same runs) lock their
            # run rows in the same order, so they queue behind each other instead of deadlocking.
            ordered = sorted(group, key=lambda s: s.key)
            try:
                answers: list[Answer] | None = me.send([s.doc for s in ordered])
                failure: BaseException | None = None
            except BaseException as exc:  # the whole group failed (e.g. the connection was lost)
                answers, failure = None, exc
            for i, slot in enumerate(ordered):
                slot.answer = failure if answers is None else answers[i]
        finally:
            # Whatever happened, nobody is left waiting and the committer stays usable.
            with self._lock:
                self.groups += 1
                self.documents += len(group)
                successor = self._queue[0] if self._queue else None
                if successor is None:
                    self._busy = False
            for slot in group:
                if slot is not me:
                    slot.done.set()
            if successor is not None:
                successor.lead = True
                successor.done.set()

    @staticmethod
    def _result(slot: _Slot) -> Answer:
        if isinstance(slot.answer, BaseException):
            raise slot.answer
        return slot.answer
