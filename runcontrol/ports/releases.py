"""Release registry (BC-04): workflow definitions published as immutable releases."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Protocol

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert

from ..domain import Release, WorkflowDefinition, canonical_hash, errors
from ..store.database import Database
from ..store.tables import release_aliases, releases


class ReleaseRegistry(Protocol):
    def publish(
        self,
        tenant_id: str,
        definition: WorkflowDefinition,
        published_by: str,
        now: datetime,
        aliases: Iterable[str] = ("latest",),
    ) -> Release: ...

    def resolve(
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


_BY_ALIAS = (
    "SELECT r.release_id, r.workflow_id, r.content_hash, r.definition"
    " FROM release_aliases a JOIN releases r ON r.release_id = a.release_id"
    " WHERE a.workflow_id = %s AND a.alias = %s"
)
_BY_ID = (
    "SELECT release_id, workflow_id, content_hash, definition FROM releases"
    " WHERE release_id = %s AND workflow_id = %s"
)
_CACHE_SIZE = 1024


class EmbeddedReleaseRegistry:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._cache: dict[tuple[str, str], Release] = {}
        self._cache_lock = threading.Lock()

    def publish(
        self,
        tenant_id: str,
        definition: WorkflowDefinition,
        published_by: str,
        now: datetime,
        aliases: Iterable[str] = ("latest",),
    ) -> Release:
        """Publish (idempotently: same content, same release) and move the aliases to it."""
        content_hash = definition.content_hash
        # Release ids are the table's primary key across all tenants, so the id is derived from
        # the tenant as well as the content: two tenants publishing the same definition must
        # each get their own release (with the content hash alone the second tenant's insert
        # hit the first tenant's row, invisible to it under row-level security).
        scoped = canonical_hash({"tenantId": tenant_id, "contentHash": content_hash})
        release_id = f"{definition.workflow_id}@{scoped.removeprefix('sha256:')[:16]}"
        with self._db.tenant(tenant_id) as conn:
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
                stmt = insert(release_aliases).values(
                    tenant_id=tenant_id,
                    workflow_id=definition.workflow_id,
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
        return _release(row)

    def resolve(
        self, tenant_id: str, workflow_id: str, *, alias: str | None, release_id: str | None
    ) -> Release:
        if release_id is None:
            found = self._db.tenant_rows(tenant_id, _BY_ALIAS, (workflow_id, alias or "latest"))
            if not found:
                raise errors.WorkflowNotFound(
                    f"workflow {workflow_id!r} has no release aliased {alias or 'latest'!r}",
                    workflow_id=workflow_id,
                )
        else:
            found = self._db.tenant_rows(tenant_id, _BY_ID, (release_id, workflow_id))
            if not found:
                raise errors.ReleaseNotFound(
                    f"release {release_id!r} of workflow {workflow_id!r} not found",
                    release_id=release_id,
                )
        return self._parsed(found[0])

    def _parsed(self, row: dict[str, Any]) -> Release:
        """Releases are immutable, so a parsed definition is kept by release id and content."""
        key = (row["release_id"], row["content_hash"])
        release = self._cache.get(key)
        if release is None:
            release = _release(row)
            with self._cache_lock:  # grains call this from many threads
                if len(self._cache) >= _CACHE_SIZE:
                    self._cache.pop(next(iter(self._cache)))
                self._cache[key] = release
        return release
