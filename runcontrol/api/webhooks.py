"""Webhook subscriptions of the caller's tenant: create, list, show, disable, deliveries and
redelivery from a feed position.

A subscription receives every event of the tenant, whatever its project, so only the roles
that span the tenant manage them (Operator, WorkspaceAdmin, PlatformAdmin: scope
``factory.webhooks.manage``). Delivery itself is the scheduler's (``runcontrol/webhooks.py``).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Annotated, Any
from uuid import UUID

from fastapi import Path, Query, Response
from sqlalchemy import Connection

from schemas.api import (
    DeliveryPage,
    RedeliverRequest,
    RedeliverResponse,
    WebhookCreated,
    WebhookCreateRequest,
    WebhookPage,
    WebhookView,
)

from .. import webhooks
from ..domain import errors
from ..domain.webhooks import DeliveryState
from ..store import webhooks as store
from . import routes
from .auth import WebhooksManager
from .context import Svc, found, location
from .problems import responses

router = routes.router("/factory/webhooks", "webhooks")

SubscriptionIdPath = Annotated[UUID, Path(alias="subscriptionId")]
MAX_SEQ = 2**63 - 1


def _not_found(subscription_id: UUID) -> errors.WebhookNotFound:
    return errors.WebhookNotFound(f"webhook subscription {subscription_id} not found")


@router.post("", status_code=201, response_model=WebhookCreated)
async def create_webhook(
    caller: WebhooksManager, svc: Svc, body: WebhookCreateRequest, response: Response
) -> dict[str, Any]:
    """Subscribe a URL to every event of the tenant published from now on.

    Scope `factory.webhooks.manage`; roles Operator, WorkspaceAdmin, PlatformAdmin. The answer holds
    the signing secret, shown only here.
    """
    created = await asyncio.to_thread(
        webhooks.create_subscription,
        svc.db,
        caller.tenant_id,
        url=body.url,
        description=body.description,
        max_attempts=body.max_attempts,
        created_by=caller.principal.subject,
        options=svc.settings.webhooks,
        now=datetime.now(UTC),
    )
    response.headers["Location"] = location(router.prefix, created["subscriptionId"])
    return created


@router.get("", response_model=WebhookPage)
async def list_webhooks(caller: WebhooksManager, svc: Svc) -> dict[str, Any]:
    """The tenant's webhook subscriptions (disabled ones too), oldest first."""
    items = await svc.read_in_tenant(caller, store.list_subscriptions)
    return {"items": items}


@router.get("/{subscriptionId}", response_model=WebhookView)
async def get_webhook(
    caller: WebhooksManager, svc: Svc, subscription_id: SubscriptionIdPath
) -> dict[str, Any]:
    """A subscription with its delivery counts by state."""
    view = await svc.read_in_tenant(
        caller, lambda conn: store.get_subscription(conn, subscription_id)
    )
    return found(view, _not_found(subscription_id))


@router.delete("/{subscriptionId}", status_code=204)
async def disable_webhook(
    caller: WebhooksManager, svc: Svc, subscription_id: SubscriptionIdPath
) -> Response:
    """Stop deliveries to the subscription (kept, disabled, for the record)."""
    now = datetime.now(UTC)
    disabled = await svc.read_in_tenant(
        caller, lambda conn: store.disable_subscription(conn, subscription_id, now)
    )
    if not disabled:
        raise _not_found(subscription_id)
    return Response(status_code=204)


@router.get("/{subscriptionId}/deliveries", response_model=DeliveryPage)
async def list_webhook_deliveries(
    caller: WebhooksManager,
    svc: Svc,
    subscription_id: SubscriptionIdPath,
    state: Annotated[list[DeliveryState] | None, Query()] = None,
    after: Annotated[int, Query(ge=0, le=MAX_SEQ)] = 0,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
) -> dict[str, Any]:
    """The subscription's deliveries after a feed position, in position order.

    `state=DeadLettered` lists the dead letters; redeliver them with `POST .../redeliver`.
    """
    states = [str(s) for s in state or ()]

    def page(conn: Connection) -> list[dict[str, Any]] | None:
        if store.get_subscription(conn, subscription_id) is None:
            return None
        return store.list_deliveries(conn, subscription_id, states=states, after=after, limit=limit)

    items = found(await svc.read_in_tenant(caller, page), _not_found(subscription_id))
    next_after = items[-1]["position"] if len(items) == limit else None
    return {"items": items, "nextAfter": next_after}


@router.post(
    "/{subscriptionId}/redeliver",
    status_code=202,
    response_model=RedeliverResponse,
    responses=responses(409),
)
async def redeliver_webhook(
    caller: WebhooksManager,
    svc: Svc,
    subscription_id: SubscriptionIdPath,
    body: RedeliverRequest,
) -> dict[str, Any]:
    """Queue every retained event after a feed position again for the subscription.

    Delivered and dead-lettered events start over (receivers deduplicate on eventId); each run's
    events go in seq order as always. `after` is a feed position (`Runcontrol-Feed-Position`, a
    delivery's `position`, the `/factory/events` id).
    """
    queued = await asyncio.to_thread(
        webhooks.redeliver,
        svc.db,
        caller.tenant_id,
        subscription_id,
        body.after,
        datetime.now(UTC),
    )
    return {"subscriptionId": subscription_id, "after": body.after, "queued": queued}
