"""The shard databases a process serves, and how a command finds its own (issue 41;
docs/sharding.md).

``Shards`` holds one ``Database`` (synchronous: reads, sweeps, migrations) and one ``Store``
(the grains' asynchronous loads and commits) per database listed in
``RUNCONTROL_SHARDS__DATABASES`` (a database is its position in that list), and the
``Directory`` read from the first. It routes without a query:

* ``for_run(run_id)``: the database of the virtual shard the id carries (a run's rows and
  every entity of it); a legacy id's: its tenant's, learned when the run is loaded (a move
  carries a tenant's legacy runs along), else the first;
* ``for_tenant(tenant_id)``: the database of the tenant's virtual shard (its placement, else
  the hash of its id): the tenant's own rows (policies, releases, schedules, webhooks) and a
  new run's;
* ``all()``: every shard, for the system path (sweeps, the relay, reads that fan out).

Two facades keep the callers as they were: ``db`` (a ``Database``) routes ``tenant()`` by the
tenant and migrates, checks and disposes every database; its ``system_tx`` and engines are
the first database's, so a sweep over every shard loops over ``all()``. ``store`` (a
``Store``) routes a load or read by its run id or tenant; a commit names its shard
(``for_run(...).send``, per database group commit: ``GroupCommits``).

With one database (``RUNCONTROL_DATABASE_URL`` alone), ``db`` and ``store`` are that
database's own ``Database`` and ``Store`` and no directory is read: everything is as before
shards."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Engine, text

from ..domain import RunAggregate, errors, shards
from . import directory
from .commit import Answer, Store
from .database import Database
from .directory import CHANNEL, Directory
from .notify import Listener

log = logging.getLogger(__name__)

# How often a process reloads the directory without a notification (a lost one, a listener
# reconnecting): at most this stale.
DIRECTORY_REFRESH_S = 10.0


@dataclass(frozen=True, slots=True)
class Shard:
    """One shard database: its position in the configured list, its engines, its store."""

    index: int
    db: Database
    store: Store


class Shards:
    """Every shard database this process serves (``databases``, in the configured order)."""

    def __init__(
        self,
        databases: Sequence[Database],
        *,
        pool_size: int = 8,
        stores: Sequence[Store] | None = None,
    ) -> None:
        if not databases:
            raise ValueError("a process serves at least one database")
        made = stores or [Store(d.app_url, size=pool_size) for d in databases]
        self._shards = tuple(
            Shard(i, d, s) for i, (d, s) in enumerate(zip(databases, made, strict=True))
        )
        self._directory: Directory | None = None
        # legacy (pre-shard) run id -> its tenant, learned as the run is loaded
        self._legacy: dict[UUID, str] = {}
        self.db: Database = databases[0] if len(databases) == 1 else RoutedDatabase(self)
        self.store: Store = self._shards[0].store if len(databases) == 1 else RoutedStore(self)

    def __len__(self) -> int:
        return len(self._shards)

    @property
    def first(self) -> Shard:
        """The first database: the directory's, and every row stored before shards."""
        return self._shards[0]

    def all(self) -> tuple[Shard, ...]:
        return self._shards

    @property
    def directory(self) -> Directory:
        """The directory, loaded from the first database on first use."""
        if self._directory is None:
            self._directory = Directory(self.first.db.system)
        return self._directory

    def vshard_for(self, tenant_id: str) -> int:
        """The virtual shard a new run of ``tenant_id`` is minted in (``ids.new_run_id``'s
        placement): the directory's placement; with one database, the hash (no directory)."""
        if len(self._shards) == 1:
            return shards.hashed_vshard(tenant_id)
        return self.directory.vshard_for(tenant_id)

    def spread(self) -> bool:
        """A new deployment's virtual shards spread over its databases (``directory.spread``:
        only while nothing is stored); whether they were."""
        if len(self._shards) == 1:
            return False
        for shard in self._shards[1:]:  # the others hold nothing either
            with shard.db.system_tx() as conn:
                if conn.execute(text("SELECT EXISTS (SELECT 1 FROM runs)")).scalar_one():
                    return False
        spread = directory.spread(self.first.db.system, len(self._shards))
        self.directory.refresh()
        return spread

    def for_vshard(self, vshard: int) -> Shard:
        if len(self._shards) == 1:
            return self._shards[0]
        index = self.directory.database_for(vshard)
        if index >= len(self._shards):
            raise RuntimeError(
                f"virtual shard {vshard} is on database {index}, and this process lists "
                f"{len(self._shards)} (RUNCONTROL_SHARDS__DATABASES only grows)"
            )
        return self._shards[index]

    def for_run(self, run_id: UUID) -> Shard:
        """The shard of the run (or of an entity of the run) ``run_id``, from the id alone;
        a legacy run's (``learn``): its tenant's, else the first."""
        vshard = shards.vshard_of(run_id)
        if vshard == shards.LEGACY and run_id in self._legacy:
            return self.for_tenant(self._legacy[run_id])
        return self.for_vshard(vshard)

    def learn(self, tenant_id: str, run_id: UUID) -> None:
        """Route the run ``run_id`` of ``tenant_id``, if legacy, by its tenant's placement.

        A legacy id (version 4, or 5 for a legacy parent's child) says nothing of its shard;
        every such row was written in the first database while every virtual shard was there
        (shards are spread only while nothing is stored), and a move carries a tenant's legacy
        runs with its other rows: so a legacy run is where its tenant is. Every command loads
        its run (with its tenant) before it commits, so the run is learned before it is
        routed to commit."""
        if len(self._shards) > 1 and shards.vshard_of(run_id) == shards.LEGACY:
            self._legacy[run_id] = tenant_id

    def for_tenant(self, tenant_id: str) -> Shard:
        return self.for_vshard(self.vshard_for(tenant_id))

    def placement(self, tenant_id: str) -> int:
        """The virtual shard a new run of ``tenant_id`` is minted in, as the edge takes it for
        a submission: ``vshard_for``, but ``ShardMoving`` while that shard moves (503 with
        ``Retry-After``: nothing stored, send it again). Reads take ``vshard_for``: they go on
        during a move."""
        if len(self._shards) == 1:
            return shards.hashed_vshard(tenant_id)
        return self.directory.placement(tenant_id)

    @contextmanager
    def tenant(self, tenant_id: str, *, project_id: str | None = None) -> Iterator[Connection]:
        """``Database.tenant`` in the tenant's shard."""
        with self.for_tenant(tenant_id).db.tenant(tenant_id, project_id=project_id) as conn:
            yield conn

    def migrate(self, revision: str = "head", *, more_versions: Sequence[Path] = ()) -> None:
        """Every database, the first (the directory's) first."""
        for shard in self._shards:
            shard.db.migrate(revision, more_versions=more_versions)

    def require_compatible_schema(self, *, app_role: bool = False) -> None:
        """``Database.require_compatible_schema`` on every database this process serves
        (``app_role``: read as the app role, an API replica's)."""
        for shard in self._shards:
            shard.db.require_compatible_schema(shard.db.app if app_role else None)

    def dispose(self) -> None:
        for shard in self._shards:
            shard.db.dispose()

    async def close(self) -> None:
        for shard in self._shards:
            await shard.store.close()

    async def follow_directory(self, interval_s: float = DIRECTORY_REFRESH_S) -> None:
        """Reload the directory when it changes (a ``runcontrol_directory`` notification, or
        at the latest every ``interval_s``), for ever; nothing to follow with one database."""
        if len(self._shards) == 1:
            return
        listener = Listener(
            self.first.db.system_url, (CHANNEL,), application_name="runcontrol-directory"
        )
        try:
            while True:
                mark = listener.generation(CHANNEL, ())
                try:
                    if await asyncio.to_thread(self.directory.refresh):
                        log.info("directory reloaded: version %d", self.directory.version)
                except Exception:  # noqa: BLE001 - the cache stays; tried again at the next turn
                    log.warning("the directory could not be reloaded", exc_info=True)
                await listener.wait(CHANNEL, (), mark, interval_s)
        finally:
            await listener.close()


class RoutedDatabase(Database):
    """The first database, whose tenant-scoped transactions go to the tenant's shard: what a
    caller that reads or writes a tenant's rows needs, unchanged. ``system_tx``, ``app``
    and ``system`` are the first database's (the directory's): a sweep over every shard loops
    over ``Shards.all()``. Migrating, checking and disposing cover every database."""

    def __init__(self, routed: Shards) -> None:
        first = routed.first.db
        # The first database's own engines (no second pool on it): see ``app``/``system``.
        super().__init__(
            first.owner_url,
            app_url=first.app_url,
            system_url=first.system_url,
            role_password=first.role_password,
        )
        self.shards = routed

    @property
    def app(self) -> Engine:
        return self.shards.first.db.app

    @property
    def system(self) -> Engine:
        return self.shards.first.db.system

    def databases(self) -> tuple[Database, ...]:
        return tuple(s.db for s in self.shards.all())

    @property
    def app_urls(self) -> tuple[str, ...]:
        return tuple(s.db.app_url for s in self.shards.all())

    @property
    def system_urls(self) -> tuple[str, ...]:
        return tuple(s.db.system_url for s in self.shards.all())

    def vshard_for(self, tenant_id: str) -> int:
        return self.shards.vshard_for(tenant_id)

    def placement(self, tenant_id: str) -> int:
        return self.shards.placement(tenant_id)

    @contextmanager
    def tenant(self, tenant_id: str, *, project_id: str | None = None) -> Iterator[Connection]:
        with self.shards.tenant(tenant_id, project_id=project_id) as conn:
            yield conn

    def migrate(self, revision: str = "head", *, more_versions: Sequence[Path] = ()) -> None:
        self.shards.migrate(revision, more_versions=more_versions)
        if revision == "head":
            self.shards.directory.refresh()  # loaded at start, not by a first command

    def require_compatible_schema(self, engine: Engine | None = None) -> None:
        self.shards.require_compatible_schema(app_role=engine is not None)
        if engine is None:  # a process starting (not a replica's readiness, as the app role)
            self.shards.directory.refresh()

    def dispose(self) -> None:
        self.shards.dispose()


class RoutedStore(Store):
    """The grains' store over every shard: a run's load and reads by its id, a tenant's reads
    by its placement. A statement that changes something names its shard (``for_run``,
    ``for_tenant``): ``call`` and ``send`` on the routed store itself are refused. Its counters
    stay 0: each shard's store counts its own."""

    def __init__(self, routed: Shards) -> None:
        # An unopened pool of its own that never opens: every statement goes to a shard's.
        super().__init__(routed.first.db.app_url, size=1)
        self.shards = routed

    def for_run(self, run_id: UUID) -> Store:
        return self.shards.for_run(run_id).store

    def for_tenant(self, tenant_id: str) -> Store:
        return self.shards.for_tenant(tenant_id).store

    async def rerouted(self, run_id: UUID, refused_by: Store) -> bool:
        """The directory read again (one small read; loaded anew if it changed): whether it
        now routes ``run_id`` to another shard than ``refused_by``, whose fence refused the
        run's commit (``ShardMoved``: the run's virtual shard moved)."""
        await asyncio.to_thread(self.shards.directory.refresh)
        return self.for_run(run_id) is not refused_by

    async def open(self) -> None:
        for shard in self.shards.all():
            await shard.store.open()

    async def close(self) -> None:
        await self.shards.close()

    async def read(
        self, tenant_id: str, queries: Sequence[tuple[str, Sequence[Any]]]
    ) -> list[list[dict[str, Any]]]:
        return await self.for_tenant(tenant_id).read(tenant_id, queries)

    async def load(
        self, tenant_id: str, run_id: UUID, answered_since: datetime
    ) -> tuple[RunAggregate, set[str]]:
        self.shards.learn(tenant_id, run_id)
        routed = self.for_run(run_id)
        try:
            return await routed.load(tenant_id, run_id, answered_since)
        except errors.RunNotFound:
            # A stale directory's database, which a move of the run's shard has cleaned:
            # route it again by a fresh directory.
            if not await self.rerouted(run_id, routed):
                raise
            return await self.for_run(run_id).load(tenant_id, run_id, answered_since)

    async def stored_answer(
        self, tenant_id: str, run_id: UUID, command_id: str, since: datetime
    ) -> tuple[Any, str | None] | None:
        self.shards.learn(tenant_id, run_id)
        return await self.for_run(run_id).stored_answer(tenant_id, run_id, command_id, since)

    async def run_version(self, tenant_id: str, run_id: UUID) -> int | None:
        self.shards.learn(tenant_id, run_id)
        return await self.for_run(run_id).run_version(tenant_id, run_id)

    async def run_id_for_key(self, tenant_id: str, project_id: str, key: str) -> UUID | None:
        return await self.for_tenant(tenant_id).run_id_for_key(tenant_id, project_id, key)

    async def call(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        raise TypeError("a statement names its shard: store.for_run(...) or for_tenant(...)")

    async def send(self, docs: list[str]) -> list[Answer]:
        raise TypeError("a commit names its shard: store.for_run(run_id).send(...)")


def follow_directory(db: Database) -> asyncio.Task[None] | None:
    """Keep the directory behind ``db`` current (``Shards.follow_directory``) in a task on
    the running loop, for as long as the process lives; None with one database (no
    directory)."""
    if not isinstance(db, RoutedDatabase):
        return None
    return asyncio.get_running_loop().create_task(db.shards.follow_directory())
