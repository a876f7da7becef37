"""Release registry (BC-04): workflow definitions published as immutable releases."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import Connection, select
from sqlalchemy.dialects.postgresql import insert

from ..domain import Release, WorkflowDefinition, canonical_hash, errors, limits
from ..store.commit import Store
from ..store.database import Database
from ..store.notify import Listener
from ..store.tables import release_aliases, releases
from .cache import Immutable, TenantConfig


class ReleaseRegistry(Protocol):
    def publish(
        self,
        tenant_id: str,
        definition: WorkflowDefinition,
        published_by: str,
        now: datetime,
        aliases: Iterable[str] = ("latest",),
    ) -> Release: ...

    async def resolve(
        self, tenant_id: str, workflow_id: str, *, alias: str | None, release_id: str | None
    ) -> Release: ...


def _release(row: Any) -> Release:
    m = row if isinstance(row, dict) else row._mapping
    return Release(
        release_id=m["release_id"],
        workflow_id=m["workflow_id"],
        content_hash=m["content_hash"],
        definition=WorkflowDefinition.from_dict(m["definition"]),
    )


_ALIAS = "SELECT release_id FROM release_aliases WHERE workflow_id = %s AND alias = %s"
_BY_ID = (
    "SELECT release_id, workflow_id, content_hash, definition FROM releases"
    " WHERE release_id = %s AND workflow_id = %s"
)


def release_id_for(tenant_id: str, definition: WorkflowDefinition) -> str:
    """Release ids are the table's primary key across all tenants, so the id is derived from
    the tenant as well as the content: two tenants publishing the same definition must each get
    their own release (with the content hash alone the second tenant's insert hit the first
    tenant's row, invisible to it under row-level security)."""
    scoped = canonical_hash({"tenantId": tenant_id, "contentHash": definition.content_hash})
    return f"{definition.workflow_id}@{scoped.removeprefix('sha256:')[:16]}"


def publish_release(
    db: Database,
    tenant_id: str,
    definition: WorkflowDefinition,
    published_by: str,
    now: datetime,
    aliases: Iterable[str] = ("latest",),
) -> Release:
    """Publish ``definition`` (already validated: ``WorkflowDefinition.from_dict``) as an
    immutable release, idempotently (same content, same release), and move ``aliases`` to it,
    in one transaction. The CLI and ``POST /factory/releases`` both come here; every process's
    alias cache hears of the move by NOTIFY (migration 0007)."""
    aliases = [limits.name(a, "aliases[]", segment=True) for a in aliases]
    content_hash = definition.content_hash
    release_id = release_id_for(tenant_id, definition)
    with db.tenant(tenant_id) as conn:
        conn.execute(
            insert(releases)
            .values(
                release_id=release_id,
                tenant_id=tenant_id,
                workflow_id=definition.workflow_id,
                content_hash=content_hash,
                definition=definition.to_dict(),
                published_by=published_by,
                published_at=now,
            )
            .on_conflict_do_nothing()
        )
        row = conn.execute(select(releases).where(releases.c.release_id == release_id)).one()
        if row.content_hash != content_hash:
            raise errors.Conflict("release id collision with different content")
        for alias in aliases:
            _point(conn, tenant_id, definition.workflow_id, alias, release_id, now)
    return _release(row)


def move_alias(
    db: Database, tenant_id: str, workflow_id: str, alias: str, release_id: str, now: datetime
) -> Release:
    """Point ``alias`` of ``workflow_id`` at one of its published releases: submissions from
    now on pin that release; runs already accepted keep theirs (invariant 2)."""
    limits.name(alias, "alias", segment=True)
    with db.tenant(tenant_id) as conn:
        row = conn.execute(
            select(releases).where(
                releases.c.release_id == release_id, releases.c.workflow_id == workflow_id
            )
        ).first()
        if row is None:
            raise errors.ReleaseNotFound(
                f"release {release_id!r} of workflow {workflow_id!r} not found",
                release_id=release_id,
            )
        _point(conn, tenant_id, workflow_id, alias, release_id, now)
    return _release(row)


def _point(
    conn: Connection, tenant_id: str, workflow_id: str, alias: str, release_id: str, now: datetime
) -> None:
    stmt = insert(release_aliases).values(
        tenant_id=tenant_id,
        workflow_id=workflow_id,
        alias=alias,
        release_id=release_id,
        moved_at=now,
    )
    conn.execute(
        stmt.on_conflict_do_update(
            index_elements=["tenant_id", "workflow_id", "alias"],
            set_={"release_id": release_id, "moved_at": now},
        )
    )


class EmbeddedReleaseRegistry:
    """Releases in Postgres. ``publish`` is the (synchronous) admin path; ``resolve`` is a
    submission's, awaited on the grains' store: a release by id is cached for good (releases
    are immutable), an alias while the listener proves it has not moved (``cache.py``)."""

    def __init__(self, db: Database, store: Store, listener: Listener | None = None) -> None:
        self._db = db
        self._store = store
        self._by_id: Immutable[Release] = Immutable()
        self._by_alias: TenantConfig[str] = TenantConfig(listener)

    def publish(
        self,
        tenant_id: str,
        definition: WorkflowDefinition,
        published_by: str,
        now: datetime,
        aliases: Iterable[str] = ("latest",),
    ) -> Release:
        """Publish (idempotently: same content, same release) and move the aliases to it."""
        release = publish_release(self._db, tenant_id, definition, published_by, now, aliases)
        self._by_alias.forget(tenant_id)  # other processes hear it (NOTIFY, migration 0007)
        return release

    async def resolve(
        self, tenant_id: str, workflow_id: str, *, alias: str | None, release_id: str | None
    ) -> Release:
        if release_id is None:
            name = alias or "latest"

            async def aliased() -> str:
                found = await self._store.rows(tenant_id, _ALIAS, (workflow_id, name))
                if not found:
                    raise errors.WorkflowNotFound(
                        f"workflow {workflow_id!r} has no release aliased {name!r}",
                        workflow_id=workflow_id,
                    )
                return str(found[0]["release_id"])

            release_id = await self._by_alias.get(tenant_id, (workflow_id, name), aliased)
        wanted = release_id

        async def by_id() -> Release:
            found = await self._store.rows(tenant_id, _BY_ID, (wanted, workflow_id))
            if not found:
                raise errors.ReleaseNotFound(
                    f"release {wanted!r} of workflow {workflow_id!r} not found",
                    release_id=wanted,
                )
            return _release(found[0])

        # Ids are derived from the tenant (``publish``), so a key of (tenant, id) is exact.
        return await self._by_id.get((tenant_id, workflow_id, release_id), by_id)
