"""The one place that wires settings, database, clock, ports and grains together."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from . import embedded
from .clock import Clock, SystemClock
from .config import Settings
from .grain import GrainEnv
from .ports import Budget, Capacity, EmbeddedPolicyStore, EmbeddedReleaseRegistry
from .store import Database, Store
from .store.notify import Listener

log = logging.getLogger(__name__)


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
    require_current_schema: bool = False,
) -> Database:
    """The database, migrated to head, or (``require_current_schema``, for processes that write
    but do not migrate: run hosts, the scheduler) checked to be at head already."""
    db = Database(
        owner_url or database_url(settings),
        app_url=settings.app_database_url,
        system_url=settings.system_database_url,
        role_password=settings.app_role_password,
        pool_size=settings.pool_size,
    )
    if migrate:
        db.migrate()
    elif require_current_schema:
        try:
            db.require_current_schema()
        except BaseException:
            db.dispose()
            raise
    return db


@dataclass
class Container:
    settings: Settings
    db: Database  # synchronous: migrations, reads, admin writes (publishing)
    store: Store  # asynchronous: the grains' loads and commits, on one event loop
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
    store = Store(db.app_url, size=settings.pool_size)
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
    return Container(settings, db, store, env, releases, policies)
