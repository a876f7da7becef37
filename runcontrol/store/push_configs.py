"""A2A push notification configs (migration 0028): one row per (task, owner, config id), each
delivered through a webhook subscription of its run (``store.webhooks``: the URL, the retries,
the dead letters), so the delivery job sends them as it sends every webhook. The token and the
authentication are the config's; only its owner reads them. Tenant-scoped functions run on
``Database.tenant()`` connections; ``config_of`` on the delivery job's (system) one.
"""

from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from sqlalchemy import Connection, delete, func, insert, select, update

from . import webhooks
from .tables import a2a_push_configs, webhook_subscriptions


def configs(
    conn: Connection, run_id: UUID, owner: str, config_id: str | None = None
) -> list[dict[str, Any]]:
    """The owner's configs of the run (or the one ``config_id``), with their URLs, oldest
    first."""
    p, s = a2a_push_configs, webhook_subscriptions
    query = (
        select(p, s.c.url)
        .join(s, s.c.subscription_id == p.c.subscription_id)
        .where(p.c.run_id == run_id, p.c.owner == owner)
    )
    if config_id is not None:
        query = query.where(p.c.config_id == config_id)
    rows = conn.execute(query.order_by(p.c.created_at, p.c.config_id))
    return [dict(r._mapping) for r in rows]


def set_config(
    conn: Connection,
    *,
    tenant_id: str,
    run_id: UUID,
    owner: str,
    config_id: str,
    url: str,
    token: str | None,
    auth_scheme: str | None,
    auth_credentials: str | None,
    scope: webhooks.RunScope,
    max_attempts: int,
    max_configs: int,
    now: datetime,
) -> bool:
    """Create the config, or replace the URL, token and authentication of the owner's config
    of that id. False (nothing stored) when the owner has ``max_configs`` for the run."""
    webhooks.lock_feed(conn)  # two sets of one config id at once: the second sees the first
    p = a2a_push_configs
    found = configs(conn, run_id, owner, config_id)
    secret = {"token": token, "auth_scheme": auth_scheme, "auth_credentials": auth_credentials}
    if found:
        subscription_id = found[0]["subscription_id"]
        s = webhook_subscriptions
        conn.execute(update(s).where(s.c.subscription_id == subscription_id).values(url=url))
        conn.execute(
            update(p).where(p.c.subscription_id == subscription_id).values(**secret, updated_at=now)
        )
        return True
    held = select(func.count()).where(p.c.run_id == run_id, p.c.owner == owner)
    if conn.execute(held).scalar_one() >= max_configs:
        return False
    subscription_id = uuid4()
    webhooks.create_subscription(
        conn,
        subscription_id=subscription_id,
        tenant_id=tenant_id,
        url=url,
        # Unused by an A2A push (the token is its proof); a subscription has one.
        secret="whsec_" + secrets.token_urlsafe(32),
        description=f"A2A push config {config_id!r} of task {run_id}",
        max_attempts=max_attempts,
        created_by=owner,
        now=now,
        run=scope,
    )
    conn.execute(
        insert(p).values(
            run_id=run_id,
            owner=owner,
            config_id=config_id,
            tenant_id=tenant_id,
            subscription_id=subscription_id,
            created_at=now,
            updated_at=now,
            **secret,
        )
    )
    return True


def delete_config(
    conn: Connection, run_id: UUID, owner: str, config_id: str, now: datetime
) -> bool:
    """Remove the owner's config and stop its deliveries (its subscription stays, disabled,
    for the record). False if there was none."""
    p = a2a_push_configs
    gone = conn.execute(
        delete(p)
        .where(p.c.run_id == run_id, p.c.owner == owner, p.c.config_id == config_id)
        .returning(p.c.subscription_id)
    ).first()
    if gone is None:
        return False
    webhooks.disable_subscription(conn, gone.subscription_id, now)
    return True


def config_of(conn: Connection, subscription_id: UUID) -> dict[str, Any] | None:
    """The config a run's subscription delivers (the delivery job's read)."""
    p = a2a_push_configs
    row = conn.execute(select(p).where(p.c.subscription_id == subscription_id)).first()
    return None if row is None else dict(row._mapping)
