"""Events out: webhook subscriptions and the delivery job the scheduler runs.

The outbox relay queues one delivery per (subscription, event) when it publishes the event
(``store.webhooks.publish``). ``deliver_webhooks`` then sends, for each (subscription, run),
that run's pending deliveries one at a time in seq order: a failed one is retried after an
exponential backoff with full jitter and holds back the run's later events until it succeeds
or is dead-lettered (after the subscription's ``max_attempts``); other runs carry on. Delivery
is at-least-once: receivers deduplicate on the event id.
"""

from __future__ import annotations

import logging
import random
import secrets
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import KW_ONLY, dataclass, field
from datetime import datetime, timedelta
from typing import Any, Protocol
from uuid import UUID, uuid4

import httpx
from sqlalchemy import Connection

from schemas.api import EventEnvelope

from .config import WebhookOptions
from .domain import errors
from .domain.webhooks import (
    ATTEMPT_HEADER,
    EVENT_ID_HEADER,
    POSITION_HEADER,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    DeliveryState,
    Undeliverable,
    check_url,
    retry_delay,
    signature,
    succeeded,
)
from .store import Database
from .store import webhooks as store

log = logging.getLogger(__name__)

MAX_ERROR_CHARS = 500
EVENT_FORMAT = "event"  # a subscription's default: the signed event envelope
Resolve = Callable[[str], Iterable[str]]


def resolve_host(host: str) -> list[str]:
    """Every address ``host`` resolves to (what a delivery could connect to)."""
    return [str(info[4][0]) for info in socket.getaddrinfo(host, None)]


class Format(Protocol):
    """How a subscription's deliveries are rendered when its ``format`` is not the signed
    event envelope (a run's subscription: an A2A push config, ``runcontrol.a2a.push``): the
    body and the headers of one delivery of ``event``, read on the delivery job's
    connection. ``Undeliverable`` dead-letters the delivery at once."""

    def __call__(
        self, conn: Connection, delivery: dict[str, Any], event: dict[str, Any]
    ) -> tuple[bytes, dict[str, str]]: ...


def delivery_formats() -> dict[str, Format]:
    """The formats this installation renders: A2A push notifications with a2a-sdk (the
    ``a2a`` extra), else none (such a delivery is dead-lettered, saying why)."""
    try:
        from .a2a.notify import FORMAT, render
    except ImportError:
        return {}
    return {FORMAT: render}


class Transport(Protocol):
    """Sends one delivery: answers the HTTP status, or raises ``httpx.HTTPError``."""

    def post(self, url: str, body: bytes, headers: dict[str, str]) -> int: ...


class HttpTransport:
    def __init__(self, timeout_s: float) -> None:
        # No redirects: a receiver cannot bounce a signed delivery to another address.
        self._client = httpx.Client(timeout=timeout_s, follow_redirects=False)

    def post(self, url: str, body: bytes, headers: dict[str, str]) -> int:
        return self._client.post(url, content=body, headers=headers).status_code

    def close(self) -> None:
        self._client.close()


# ---------------------------------------------------------------------- subscriptions


def create_subscription(
    db: Database,
    tenant_id: str,
    *,
    url: str,
    description: str | None,
    max_attempts: int | None,
    created_by: str,
    options: WebhookOptions,
    now: datetime,
    resolve: Resolve = resolve_host,
) -> dict[str, Any]:
    """A new subscription of the tenant, receiving every event published after it; the
    answer carries its signing ``secret``, shown this once."""
    check_url(url, allow_private=options.allow_private_addresses, resolve=resolve)
    secret = "whsec_" + secrets.token_urlsafe(32)
    with db.tenant(tenant_id) as conn:
        view = store.create_subscription(
            conn,
            subscription_id=uuid4(),
            tenant_id=tenant_id,
            url=url,
            secret=secret,
            description=description,
            max_attempts=max_attempts or options.max_attempts,
            created_by=created_by,
            now=now,
        )
    return {**view, "secret": secret}


def redeliver(
    db: Database, tenant_id: str, subscription_id: UUID, after: int, now: datetime
) -> int:
    """Queue the tenant's events after feed position ``after`` again for the subscription."""
    with db.tenant(tenant_id) as conn:
        found = store.get_subscription(conn, subscription_id)
        if found is None:
            raise errors.WebhookNotFound(f"webhook subscription {subscription_id} not found")
        if found["disabledAt"] is not None:
            raise errors.WebhookDisabled(f"webhook subscription {subscription_id} is disabled")
        return store.redeliver(conn, found, after, now)


# ---------------------------------------------------------------------- delivery


@dataclass(frozen=True)
class DeliveryReport:
    delivered: int = 0
    failed: int = 0
    dead_lettered: int = 0


@dataclass
class _Tally:
    delivered: int = 0
    failed: int = 0
    dead_lettered: int = 0


@dataclass(frozen=True)
class Deliverer:
    """The delivery job: ``run`` sends what is due and returns. Safe to run twice at once
    (each attempt is claimed by a guarded UPDATE); the scheduler also holds a job lock."""

    db: Database
    transport: Transport
    options: WebhookOptions
    now: Callable[[], datetime]
    _: KW_ONLY
    formats: Mapping[str, Format] = field(default_factory=dict)
    uniform: Callable[[float, float], float] = random.uniform
    resolve: Resolve = resolve_host
    wall_clock: Callable[[], float] = time.time

    def run(self, limit: int = 500) -> DeliveryReport:
        with self.db.system_tx() as conn:
            heads = store.due_heads(conn, self.now(), limit)
        if not heads:
            return DeliveryReport()
        tally = _Tally()
        workers = min(self.options.max_parallel, len(heads))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="webhooks") as pool:
            for result in pool.map(self._run_chain, heads):
                tally.delivered += result.delivered
                tally.failed += result.failed
                tally.dead_lettered += result.dead_lettered
        return DeliveryReport(tally.delivered, tally.failed, tally.dead_lettered)

    def _run_chain(self, head: dict[str, Any], max_per_chain: int = 100) -> _Tally:
        """One (subscription, run): its due deliveries in seq order until one fails."""
        tally = _Tally()
        delivery: dict[str, Any] | None = head
        for _ in range(max_per_chain):
            if delivery is None or delivery["next_attempt_at"] > self.now():
                break
            try:
                outcome = self._attempt(delivery)
            except Exception:
                log.exception("webhook delivery %s failed unexpectedly", delivery["position"])
                break
            if outcome is DeliveryState.DELIVERED:
                tally.delivered += 1
            elif outcome is DeliveryState.DEAD_LETTERED:
                tally.dead_lettered += 1
            elif outcome is DeliveryState.PENDING:
                tally.failed += 1
                break
            else:  # not claimed: another job has it
                break
            with self.db.system_tx() as conn:
                delivery = store.next_pending(conn, delivery["subscription_id"], delivery["run_id"])
        return tally

    def _attempt(self, delivery: dict[str, Any]) -> DeliveryState | None:
        """One attempt: claim, send, record. Answers the delivery's state after it, or None
        when it was not ours to send."""
        now = self.now()
        hold = now + timedelta(seconds=self.options.timeout_seconds * 3)
        with self.db.system_tx() as conn:
            if not store.claim(conn, delivery, hold, now):
                return None
            event = store.envelope(conn, delivery)
            # pruned by retention meanwhile: nothing left to send
            request: tuple[bytes, dict[str, str]] | str = "event expired"
            if event is not None:
                try:
                    request = self._request(conn, delivery, event)
                except Undeliverable as exc:
                    request = str(exc)
        delivery = {**delivery, "next_attempt_at": hold}
        if isinstance(request, str):
            return self._record(delivery, DeliveryState.DEAD_LETTERED, None, request)
        status, error = self._send(delivery, *request)
        if status is not None and succeeded(status):
            return self._record(delivery, DeliveryState.DELIVERED, status, None)
        delay = retry_delay(
            delivery["attempts"] + 1,
            delivery["max_attempts"],
            base_seconds=self.options.base_delay_seconds,
            cap_seconds=self.options.max_delay_seconds,
            uniform=self.uniform,
        )
        if delay is None:
            log.warning(
                "webhook delivery of event %s to %s dead-lettered after %d attempts: %s",
                request[1][EVENT_ID_HEADER],
                delivery["url"],
                delivery["attempts"] + 1,
                error or status,
            )
            return self._record(delivery, DeliveryState.DEAD_LETTERED, status, error)
        return self._record(delivery, DeliveryState.PENDING, status, error, delay)

    def _request(
        self, conn: Connection, delivery: dict[str, Any], event: dict[str, Any]
    ) -> tuple[bytes, dict[str, str]]:
        """The body and headers of one attempt: the signed envelope, or the subscription's
        format's rendering (with the event's id and the attempt, for deduplication)."""
        common = {
            "User-Agent": "runcontrol-webhooks/1",
            EVENT_ID_HEADER: str(event["eventId"]),
            POSITION_HEADER: str(delivery["position"]),
            ATTEMPT_HEADER: str(delivery["attempts"] + 1),
        }
        if delivery["format"] != EVENT_FORMAT:
            render = self.formats.get(delivery["format"])
            if render is None:
                raise Undeliverable(f"no renderer for format {delivery['format']!r} here")
            body, headers = render(conn, delivery, event)
            return body, {**common, **headers}
        # The same envelope as the event history and SSE ``data``, byte for byte.
        body = EventEnvelope.model_validate(event).model_dump_json(by_alias=True).encode()
        timestamp = int(self.wall_clock())
        return body, {
            **common,
            "Content-Type": "application/json",
            TIMESTAMP_HEADER: str(timestamp),
            SIGNATURE_HEADER: signature(delivery["secret"], timestamp, body),
        }

    def _send(
        self, delivery: dict[str, Any], body: bytes, headers: dict[str, str]
    ) -> tuple[int | None, str]:
        url = delivery["url"]
        try:  # checked again at each attempt: the host's addresses may have changed
            check_url(url, allow_private=self.options.allow_private_addresses, resolve=self.resolve)
        except errors.InvalidWebhookUrl as exc:
            return None, str(exc)
        try:
            status = self.transport.post(url, body, headers)
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
        return status, "" if succeeded(status) else f"HTTP {status}"

    def _record(
        self,
        delivery: dict[str, Any],
        state: DeliveryState,
        status: int | None,
        error: str | None,
        delay_s: float = 0.0,
    ) -> DeliveryState | None:
        now = self.now()
        with self.db.system_tx() as conn:
            recorded = store.record(
                conn,
                delivery,
                state=state,
                status=status,
                error=error or None,
                next_attempt_at=now + timedelta(seconds=delay_s),
                now=now,
            )
        return state if recorded else None
