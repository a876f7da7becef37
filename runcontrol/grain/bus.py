"""The grain's registry: the handler of each command type (``HANDLERS``), and the one notice a
commit publishes (``Committed``) with the parts of the activation that subscribe to it.

A handler decides and commits; it never calls what must follow a commit (the exactly-once
memo, the host's observers, the fused grants' sessions, the runs a ``cancel-oldest`` limit
displaces, the rate reservations spent, a command's effect outside its statement): each of
those subscribes (``subscribe``) and is told by ``publish``, in the order it subscribed
(cosmicpython's message bus). ``grain.handlers`` fills ``HANDLERS``; importing
``runcontrol.grain`` registers everything.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..commands import Command
from ..domain import Changes, RunAggregate
from ..store.commit import StoredAnswer

# (the run's grain, the command) -> the answer
Handler = Callable[[Any, Any], Awaitable[Any]]
HANDLERS: dict[type[Command[Any]], Handler] = {}


@dataclass(frozen=True, slots=True)
class Committed:
    """A command's statement is in: the command, the run as committed, what the statement
    wrote (events, held steps, runs to displace) and the answer stored with it. A turn's
    statement (several commands of the run, ``grain.turn``) is one notice: its last command
    and answer, ``earlier`` the others' (``each``: all of them, in the order decided)."""

    command: Command[Any]
    run: RunAggregate
    changes: Changes
    answer: StoredAnswer
    earlier: tuple[tuple[Command[Any], StoredAnswer], ...] = ()

    @property
    def each(self) -> tuple[tuple[Command[Any], StoredAnswer], ...]:
        return (*self.earlier, (self.command, self.answer))


# (the run's grain, the notice) -> nothing, or an awaitable (an effect that does I/O)
Subscriber = Callable[[Any, Committed], Awaitable[None] | None]
SUBSCRIBERS: list[Subscriber] = []
S = TypeVar("S", bound=Subscriber)


def subscribe(subscriber: S) -> S:
    """Tell ``subscriber`` of every commit from now on (after those before it)."""
    SUBSCRIBERS.append(subscriber)
    return subscriber


async def publish(grain: Any, notice: Committed) -> None:
    """The commit is in: tell every subscriber, in order (a subscriber's error is the
    caller's: the committed command stands, its answer stored)."""
    for subscriber in SUBSCRIBERS:
        told = subscriber(grain, notice)
        if inspect.isawaitable(told):
            await told
