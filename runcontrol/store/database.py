"""Engines and connections: tenant-scoped (row-level security) and the explicit system path."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url
from sqlalchemy.pool import ConnectionPoolEntry

from ..domain import errors, shards
from . import schema
from .schema import SchemaMismatch, SchemaVersion

APP_ROLE = "runcontrol_app"
SYSTEM_ROLE = "runcontrol_system"
MIGRATIONS = Path(__file__).resolve().parent / "migrations"

_SET_TENANT = text("SELECT set_config('runcontrol.tenant_id', :tenant, true)")
_SET_PROJECT = text("SELECT set_config('runcontrol.project_id', :project, true)")
MOVED = "RC421"  # a fence of a shard's move (runcontrol_check_fence): route again


__all__ = ["APP_ROLE", "SYSTEM_ROLE", "Database", "SchemaMismatch", "role_url"]


def _alembic_config(more_versions: Sequence[Path] = ()) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    if more_versions:
        cfg.set_main_option("path_separator", "os")
        locations = (MIGRATIONS / "versions", *more_versions)
        cfg.set_main_option("version_locations", os.pathsep.join(str(p) for p in locations))
    return cfg


def role_url(owner_url: str, role: str, password: str | None) -> str:
    url = make_url(owner_url).set(username=role, password=password)
    return url.render_as_string(hide_password=False)


def replace_older_after_a_loss(engine: Engine) -> None:
    """Once a pooled connection is found broken (and invalidated), the pool replaces every
    connection opened before it at checkout, rather than handing it out to fail: after a
    server restart each process loses one command, not one per pooled connection. A checkout
    then costs a dict read, where a pre-ping costs a round trip."""
    lost_at = 0.0

    @event.listens_for(engine, "connect")
    def opened(dbapi_connection: Any, record: ConnectionPoolEntry) -> None:
        record.info["opened_at"] = time.monotonic()

    @event.listens_for(engine, "invalidate")
    def lost(dbapi_connection: Any, record: ConnectionPoolEntry, exc: Any) -> None:
        nonlocal lost_at
        if not isinstance(exc, sa_exc.DisconnectionError):  # not one this hook replaced
            lost_at = time.monotonic()

    @event.listens_for(engine, "checkout")
    def checkout(dbapi_connection: Any, record: ConnectionPoolEntry, proxy: Any) -> None:
        if record.info.get("opened_at", 0.0) < lost_at:
            raise sa_exc.DisconnectionError("opened before a pooled connection was found broken")


@contextmanager
def refused_if_moved() -> Iterator[None]:
    """A write the fence of a shard's move refused (a configuration table's trigger,
    ``runcontrol_fenced_write``) raised as ``ShardMoved``: retryable, nothing was stored."""
    try:
        yield
    except sa_exc.DBAPIError as exc:
        if getattr(exc.orig, "sqlstate", None) != MOVED:
            raise
        raise errors.ShardMoved(str(exc.orig).splitlines()[0]) from exc


class Database:
    """Three connections to one database, each with its own privileges.

    * owner: runs migrations only.
    * app: every command; cannot bypass row-level security, so each transaction sees only the
      tenant it was opened for (``SET LOCAL`` through ``set_config(..., true)``).
    * system: reconcilers and the outbox relay sweeping all tenants; reads, marks published,
      and prunes, but changes run state only through grains.
    """

    def __init__(
        self,
        owner_url: str,
        *,
        app_url: str | None = None,
        system_url: str | None = None,
        role_password: str | None = None,
        pool_size: int = 10,
    ) -> None:
        self.owner_url = owner_url
        self.role_password = role_password
        self.app_url = app_url or role_url(owner_url, APP_ROLE, role_password)
        self.system_url = system_url or role_url(owner_url, SYSTEM_ROLE, role_password)
        self._pool_size = pool_size
        self._app: Engine | None = None
        self._system: Engine | None = None

    @property
    def app(self) -> Engine:
        if self._app is None:
            # No pre-ping: it costs a round trip on every command (docs/benchmarks.md). A
            # connection broken by a server restart fails one command (retryable Unavailable)
            # and is invalidated; the connections opened before it are then replaced at
            # checkout instead of each failing a command of its own.
            self._app = create_engine(
                self.app_url,
                pool_size=self._pool_size,
                max_overflow=self._pool_size,
                pool_recycle=1800,
            )
            replace_older_after_a_loss(self._app)
        return self._app

    @property
    def system(self) -> Engine:
        if self._system is None:
            self._system = create_engine(self.system_url, pool_size=4, pool_pre_ping=True)
        return self._system

    def migrate(self, revision: str = "head", *, more_versions: Sequence[Path] = ()) -> None:
        """Bring the schema, roles and policies to ``revision`` (idempotent), and record which
        code may still run on it (``store/schema.py``). On a schema newer than every revision
        this code knows (a newer release migrated it), nothing is migrated: it is checked to
        keep this release working, or ``SchemaMismatch``. ``more_versions``: directories of
        further migrations, after the shipped ones (a site's own; a test's)."""
        engine = create_engine(self.owner_url, poolclass=None)
        try:
            with engine.begin() as conn:
                # Serialise concurrent migrators (several processes starting at once).
                conn.execute(text("SELECT pg_advisory_xact_lock(72616001)"))
                cfg = _alembic_config(more_versions)
                scripts = ScriptDirectory.from_config(cfg)
                known = schema.chain(scripts)
                found = schema.read_version(conn)
                if found.revision is not None and found.revision not in known:
                    schema.check(known, found)
                    return
                cfg.attributes["connection"] = conn
                cfg.attributes["role_password"] = self.role_password
                command.upgrade(cfg, revision)
                schema.record(conn, scripts)
        finally:
            engine.dispose()

    def schema_version(self, engine: Engine | None = None) -> SchemaVersion:
        """The database's revision and compatibility marker, read as the system role (or on
        ``engine``: an API replica's app role)."""
        with (engine or self.system).connect() as conn:
            return schema.read_version(conn)

    def schema_revision(self) -> str | None:
        """The database's schema revision, read as the system role; None when there is no
        schema yet."""
        return self.schema_version().revision

    def require_compatible_schema(self, engine: Engine | None = None) -> None:
        """Refuse (``SchemaMismatch``, one line) to run on a schema older than this code's, or
        on a newer one whose marker says this code may not run on it: a document written for
        a newer ``runcontrol_apply`` would lose what an older one ignores, and an older
        release's would lose what a newer, incompatible schema requires. ``engine``: read
        on it (default: the system role's)."""
        schema.check(schema.shipped_revisions(str(MIGRATIONS)), self.schema_version(engine))

    def databases(self) -> tuple[Database, ...]:
        """Every database behind this one, the first first: what a sweep or a read of every
        tenant loops over (``system_tx`` is this one's; ``store/shards.RoutedDatabase`` is the
        first of several). With one database, itself."""
        return (self,)

    @property
    def app_urls(self) -> tuple[str, ...]:
        """The app role's URL of every database behind this one (a listener's: one connection
        each); with one database, its own."""
        return (self.app_url,)

    @property
    def system_urls(self) -> tuple[str, ...]:
        """The system role's URL of every database behind this one."""
        return (self.system_url,)

    def vshard_for(self, tenant_id: str) -> int:
        """The virtual shard a new run of ``tenant_id`` is minted in: with one database, the
        hash of its id (``store/shards.RoutedDatabase``: the directory's placement)."""
        return shards.hashed_vshard(tenant_id)

    def placement(self, tenant_id: str) -> int:
        """The virtual shard a new run of ``tenant_id`` is minted in, as the edge takes it
        (``ids.new_run_id``'s placement): with one database, ``vshard_for`` (no move; the
        routed database's raises ``ShardMoving`` while the tenant's shard moves)."""
        return self.vshard_for(tenant_id)

    @contextmanager
    def tenant(self, tenant_id: str, *, project_id: str | None = None) -> Iterator[Connection]:
        """A transaction that row-level security limits to ``tenant_id`` and, for reads of runs
        and events, to ``project_id`` when given (migration 0008); commits on success."""
        if not tenant_id:
            raise ValueError("a tenant-scoped transaction needs a tenant id")
        if project_id == "":
            raise ValueError("a project-scoped transaction needs a project id")
        with refused_if_moved(), self.app.begin() as conn:
            conn.execute(_SET_TENANT, {"tenant": tenant_id})
            if project_id is not None:
                conn.execute(_SET_PROJECT, {"project": project_id})
            yield conn

    @contextmanager
    def system_tx(self) -> Iterator[Connection]:
        with refused_if_moved(), self.system.begin() as conn:
            yield conn

    def dispose(self) -> None:
        for engine in (self._app, self._system):
            if engine is not None:
                engine.dispose()
        self._app = self._system = None
