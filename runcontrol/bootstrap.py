"""The one place that wires settings, database, clock, ports and grains together."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy.exc import OperationalError

from . import embedded
from .clock import Clock, SystemClock
from .config import Settings
from .grain import GrainEnv
from .ports import Budget, Capacity, EmbeddedPolicyStore, EmbeddedReleaseRegistry
from .store import Database, Store
from .store.notify import Listener
from .store.shards import RoutedDatabase, Shards

log = logging.getLogger(__name__)

# How long a run host or the scheduler, started while its database is unreachable, waits for it
# (``build_database``'s ``wait_s``). Ray restarts an actor that dies, but never one whose
# constructor raised: a host or scheduler restarted during a database outage and giving up at
# once stayed dead, and with the scheduler the outbox was never relayed again (the chaos run).
DATABASE_WAIT_S = 300.0
_WAIT_LOG_EVERY_S = 10.0


def database_url(settings: Settings) -> str:
    """The configured owner URL, or the embedded server's (started on demand)."""
    if settings.database_url:
        return settings.database_url
    data_dir = settings.data_dir or str(embedded.default_data_dir())
    return embedded.start(data_dir)


def build_database(
    settings: Settings,
    *,
    owner_url: str | None = None,
    migrate: bool = True,
    require_compatible_schema: bool = False,
    wait_s: float = 0.0,
) -> Database:
    """The database, migrated to head, or (``require_compatible_schema``, for processes that
    write but do not migrate: run hosts, the scheduler) checked to be at head already, or at a
    newer revision that keeps this release working (``store/schema.py``): a rolling upgrade
    migrates first and replaces these processes after. ``wait_s``: while the server cannot be
    reached, try again for up to this long (an incompatible schema is refused at once).

    With more than one shard database (``RUNCONTROL_SHARDS__DATABASES``), every one of them,
    behind one ``Database`` that routes a tenant's transactions to its shard
    (``store/shards.RoutedDatabase``; ``shards_of`` gives them all)."""
    first = Database(
        owner_url or database_url(settings),
        app_url=settings.app_database_url,
        system_url=settings.system_database_url,
        role_password=settings.app_role_password,
        pool_size=settings.pool_size,
    )
    more = [
        Database(url, role_password=settings.app_role_password, pool_size=settings.pool_size)
        for url in settings.shard_databases()[1:]
    ]
    db = Shards([first, *more], pool_size=settings.pool_size).db
    if migrate:
        db.migrate()
    elif require_compatible_schema:
        try:
            wait_for_database(db.require_compatible_schema, wait_s)
        except BaseException:
            db.dispose()
            raise
    return db


def shards_of(db: Database, pool_size: int) -> Shards:
    """The shard databases behind ``db``: its own (``build_database``'s with several), else
    ``db`` alone (a store of ``pool_size`` connections)."""
    return db.shards if isinstance(db, RoutedDatabase) else Shards([db], pool_size=pool_size)


def wait_for_database(check: Callable[[], None], wait_s: float) -> None:
    """Run ``check`` until it returns, again after each connection failure (backing off to 2 s)
    while ``wait_s`` lasts; its other errors, and the last connection failure, are raised."""
    began = time.monotonic()
    delay, logged = 0.1, -_WAIT_LOG_EVERY_S
    while True:
        try:
            check()
            return
        except OperationalError as exc:
            waited = time.monotonic() - began
            if waited >= wait_s:
                raise
            if waited - logged >= _WAIT_LOG_EVERY_S:
                logged = waited
                reason = str(exc.orig or exc).splitlines()[0]
                log.warning(
                    "the database cannot be reached (%s): waiting for it, %.0f s so far",
                    reason,
                    waited,
                )
            time.sleep(min(delay, wait_s - waited))
            delay = min(delay * 2, 2.0)


@dataclass
class Container:
    settings: Settings
    db: Database  # synchronous: migrations, reads, admin writes (publishing); routed by tenant
    store: Store  # asynchronous: the grains' loads and commits, on one event loop; routed
    shards: Shards  # every shard database (one: ``db`` and ``store`` are its own)
    env: GrainEnv
    releases: EmbeddedReleaseRegistry
    policies: EmbeddedPolicyStore


def build(
    settings: Settings | None = None,
    *,
    db: Database | None = None,
    clock: Clock | None = None,
    migrate: bool = True,
    listener: Listener | None = None,
) -> Container:
    """Wire everything. ``listener``: the process's LISTEN connection; with it (a run host's,
    listening on ``runcontrol_config``), a tenant's current policy and release aliases are
    cached until a change is notified. The grains' store opens lazily on the event loop that
    first uses it."""
    settings = settings or Settings()
    db = db or build_database(settings, migrate=migrate)
    shards = shards_of(db, settings.pool_size)
    store = shards.store
    releases = EmbeddedReleaseRegistry(db, store, listener)
    policies = EmbeddedPolicyStore(db, store, listener)
    env = GrainEnv(
        store=store,
        clock=clock or SystemClock(),
        options=settings.options(),
        releases=releases,
        policies=policies,
        budget=Budget(settings.budget.tenant_limit_usd),
        capacity=Capacity(settings.capacity.max_open_attempts_per_tenant),
    )
    return Container(settings, db, store, shards, env, releases, policies)
