"""Group commit: every document committed on one event loop at the same moment goes in one
statement (``Store.send``: ``runcontrol_apply_many``; the output writer's too), each in a
subtransaction of its own. ``docs/write-path.md`` describes the path end to end."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable
from dataclasses import dataclass
from typing import Generic, TypeVar

# A group is one transaction with a subtransaction per document and one around them all
# (runcontrol_apply_many): at most 64, the subtransaction ids PostgreSQL caches per backend;
# past them every other backend's snapshot reads pg_subtrans to tell what is visible.
MAX_GROUP = 63

A = TypeVar("A")  # what the statement answers per document (``Answer`` for runcontrol_apply)
K = TypeVar("K", bound=Hashable)  # a shard database (its store)
Sender = Callable[[list[str]], Awaitable[list[A]]]


@dataclass(eq=False, slots=True)
class _Slot(Generic[A]):
    key: str
    doc: str
    answer: asyncio.Future[A]


class GroupCommit(Generic[A]):
    """Every document committed on one event loop at the same moment, in one statement.

    ``commit(doc, key)`` queues the document; the queue leaves on the next turn of the loop
    (so the commands a batch runs together share a statement) as long as fewer than
    ``max_in_flight`` statements are unanswered, else as soon as one is answered. A lone
    command is never delayed beyond one loop turn. Each group writes its runs in key (run id)
    order, so two groups on two hosts queue behind each other rather than deadlock. Each
    document runs in its own subtransaction: one lost race or refusal rolls back only its own
    command. A whole group that failed (a lost connection) fails each of its callers with the
    sender's error."""

    def __init__(
        self, send: Sender[A], *, max_group: int = MAX_GROUP, max_in_flight: int = 2
    ) -> None:
        self._send = send
        self._max_group = max_group
        self._max_in_flight = max_in_flight
        self._queue: list[_Slot[A]] = []
        self._in_flight = 0
        self._scheduled = False

    async def commit(self, doc: str, key: str) -> A:
        slot: _Slot[A] = _Slot(key, doc, asyncio.get_running_loop().create_future())
        self._queue.append(slot)
        self._kick()
        return await slot.answer

    def _kick(self) -> None:
        if self._queue and not self._scheduled and self._in_flight < self._max_in_flight:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._scheduled = False
        loop = asyncio.get_running_loop()
        while self._queue and self._in_flight < self._max_in_flight:
            group = self._queue[: self._max_group]
            del self._queue[: self._max_group]
            self._in_flight += 1
            loop.create_task(self._commit(group))

    async def _commit(self, group: list[_Slot[A]]) -> None:
        group.sort(key=lambda s: s.key)
        try:
            found = await self._send([s.doc for s in group])
        except BaseException as exc:  # noqa: BLE001 - the whole group failed: each caller hears
            for slot in group:
                if not slot.answer.done():
                    slot.answer.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
        else:
            for slot, answer in zip(group, found, strict=True):
                if not slot.answer.done():
                    slot.answer.set_result(answer)
        finally:
            self._in_flight -= 1
            self._kick()


class GroupCommits(Generic[K, A]):
    """A ``GroupCommit`` per shard database: ``commit(doc, key)`` goes into the group of the
    database ``route(key)`` names (``key`` is the run's id), whose statement is
    ``sender(database)``; so each database's documents share its statements and no statement
    spans two databases. With one database, one group: as ``GroupCommit``."""

    def __init__(self, route: Callable[[str], K], sender: Callable[[K], Sender[A]]) -> None:
        self._route = route
        self._sender = sender
        self._groups: dict[K, GroupCommit[A]] = {}

    async def commit(self, doc: str, key: str) -> A:
        database = self._route(key)
        group = self._groups.get(database)
        if group is None:
            group = self._groups[database] = GroupCommit(self._sender(database))
        return await group.commit(doc, key)
