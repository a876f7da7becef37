"""What a grain needs from the outside (``GrainEnv``), and what a command decides (``Plan``)."""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial
from typing import Any, Generic, TypeVar
from uuid import UUID, uuid4

from .. import ids
from ..clock import Clock
from ..commands import Command
from ..domain import CommandContext, Event, Options, RunAggregate
from ..ports import Budget, Capacity, PolicyStore, ReleaseRegistry
from ..store.commit import Answer, Store, StoredAnswer
from ..store.group import GroupCommits
from ..store.output import OutputWriter
from ..workers.grants import Credits

log = logging.getLogger("runcontrol.grain")
T = TypeVar("T")
Observer = Callable[[RunAggregate, Sequence[Event]], None]


@dataclass
class GrainEnv:
    """Everything a grain needs from the outside, built once by ``runcontrol.bootstrap``. Used
    from one event loop (a host's): ``commits`` groups the commits made on it."""

    store: Store
    clock: Clock
    options: Options
    releases: ReleaseRegistry
    policies: PolicyStore
    budget: Budget
    capacity: Capacity
    # A new id for an entity of a run, in the run's virtual shard (``runcontrol.ids``).
    new_id: Callable[[UUID, datetime], UUID] = ids.beside
    rng: random.Random = field(default_factory=random.Random)
    # Told of every commit's events, with the run as committed (a host's metrics).
    observers: list[Observer] = field(default_factory=list)
    # Credits a dispatch may lease its attempt to in the same commit (a run host's sessions).
    credits: Credits | None = None
    # Told, after a commit, of the runs a ``cancel-oldest`` limit wants cancelled (tenant, run,
    # reason, the run asking): a run host sends each a CancelRun through its router.
    cancel_runs: Callable[[str, UUID, str, UUID], None] | None = None
    # Sends a command to another run's grain (a run host's router): a parent's to its child
    # runs, a child's end to its parent (issue 32). None: no other run is reachable.
    send: Callable[[Command[Any]], Awaitable[Any]] | None = None
    commits: GroupCommits[Store, Answer] = field(init=False)
    # Streamed output's fenced inserts, grouped as the commits are (``store.output``).
    output: OutputWriter = field(init=False)

    def __post_init__(self) -> None:
        # a group per shard database: the run's, from its id (the commit's key)
        self.commits = GroupCommits(self._store_of, lambda store: store.send)
        self.output = OutputWriter(self.store)

    def _store_of(self, run_id: str) -> Store:
        return self.store.for_run(UUID(run_id))

    def context(
        self, actor: str, command_id: str | None = None, run_id: UUID | None = None
    ) -> CommandContext:
        """The context of a command on the run ``run_id``: the ids it mints are in the run's
        virtual shard (without a run: version-4 ids, as before shards)."""
        now = self.clock.now()
        return CommandContext(
            now=now,
            actor=actor,
            command_id=command_id,
            new_id=uuid4 if run_id is None else partial(self.new_id, run_id, now),
            uniform=self.rng.uniform,
        )


@dataclass(frozen=True, slots=True)
class Plan(Generic[T]):
    """What a command decides on the run, and who asks."""

    decide: Callable[[RunAggregate, CommandContext], T]
    actor: str


@dataclass(slots=True)
class Turn:
    """Several commands of one run decided in one hold of its mailbox (``turn.turn``): each
    on the run as the one before left it, all committed as one document with every answer.
    ``broken``: one could not be decided in the turn (a refusal, a lost race): every command
    of it is decided again alone, as if the turn had not been tried (nothing of it committed)."""

    decided: list[tuple[Command[Any], StoredAnswer]] = field(default_factory=list)
    last: CommandContext | None = None  # the last decision's (the budget's release time)
    broken: bool = False
