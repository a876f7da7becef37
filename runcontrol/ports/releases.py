"""Release registry (BC-04): workflow definitions published as immutable releases."""

from __future__ import annotations

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
    m = row._mapping
    return Release(
        release_id=m["release_id"],
        workflow_id=m["workflow_id"],
        content_hash=m["content_hash"],
        definition=WorkflowDefinition.from_dict(m["definition"]),
    )


class EmbeddedReleaseRegistry:
    def __init__(self, db: Database) -> None:
        self._db = db

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
        with self._db.tenant(tenant_id) as conn:
            if release_id is None:
                release_id = conn.execute(
                    select(release_aliases.c.release_id).where(
                        release_aliases.c.workflow_id == workflow_id,
                        release_aliases.c.alias == (alias or "latest"),
                    )
                ).scalar_one_or_none()
                if release_id is None:
                    raise errors.WorkflowNotFound(
                        f"workflow {workflow_id!r} has no release aliased {alias or 'latest'!r}",
                        workflow_id=workflow_id,
                    )
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
        return _release(row)
