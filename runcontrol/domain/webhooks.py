"""Webhooks: what a delivery is signed with, when a failed one is retried, which URLs may
receive one. Pure: resolving a host name and sending are the caller's.

A delivery is the event envelope as JSON (its ``payload`` as the outbox stores it, valid
against its event type's schema: ``GET /factory/schemas/events``), POSTed with these headers:

- ``Runcontrol-Event-Id``: the event's id; receivers deduplicate on it (delivery is
  at-least-once: a lost answer, a retry or a redelivery sends the same event again);
- ``Runcontrol-Timestamp``: Unix seconds when this attempt was signed;
- ``Runcontrol-Signature``: ``v1=`` + hex HMAC-SHA256, keyed with the subscription's secret,
  over ``timestamp + "." + body`` (the timestamp inside the MAC stops a replay under a new
  timestamp; receivers refuse timestamps too far from their clock);
- ``Runcontrol-Feed-Position``: the event's tenant-wide position (a redelivery cursor);
- ``Runcontrol-Delivery-Attempt``: 1 for the first attempt.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Callable, Iterable
from enum import StrEnum
from urllib.parse import urlsplit

from .backoff import backoff_delay
from .errors import InvalidWebhookUrl

EVENT_ID_HEADER = "Runcontrol-Event-Id"
TIMESTAMP_HEADER = "Runcontrol-Timestamp"
SIGNATURE_HEADER = "Runcontrol-Signature"
POSITION_HEADER = "Runcontrol-Feed-Position"
ATTEMPT_HEADER = "Runcontrol-Delivery-Attempt"
SIGNATURE_VERSION = "v1"
DEFAULT_TOLERANCE_S = 300


class DeliveryState(StrEnum):
    PENDING = "Pending"
    DELIVERED = "Delivered"
    DEAD_LETTERED = "DeadLettered"


class Undeliverable(Exception):
    """A delivery nothing can send (its format unknown here, its config gone): dead-lettered
    at once, with this message."""


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The ``Runcontrol-Signature`` header of ``body`` signed at ``timestamp``."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"{SIGNATURE_VERSION}={mac.hexdigest()}"


def verify(
    secret: str,
    timestamp: str,
    body: bytes,
    signature_header: str,
    now: float,
    tolerance_s: float = DEFAULT_TOLERANCE_S,
) -> bool:
    """What a receiver checks: the signature is ours over this body and timestamp, and the
    timestamp is within ``tolerance_s`` of ``now`` (Unix seconds). Constant-time compare."""
    try:
        sent_at = int(timestamp)
    except ValueError:
        return False
    if abs(now - sent_at) > tolerance_s:
        return False
    return hmac.compare_digest(signature(secret, sent_at, body), signature_header)


def retry_delay(
    attempts_made: int,
    max_attempts: int,
    *,
    base_seconds: float,
    cap_seconds: float,
    uniform: Callable[[float, float], float],
) -> float | None:
    """Seconds until the next attempt after ``attempts_made`` failed ones (exponential backoff,
    full jitter), or None: the limit is reached and the delivery is dead-lettered."""
    if attempts_made >= max_attempts:
        return None
    return backoff_delay(
        attempts_made, base_seconds=base_seconds, cap_seconds=cap_seconds, uniform=uniform
    )


def succeeded(status: int) -> bool:
    """Any 2xx answer acknowledges a delivery; anything else (or no answer) is retried."""
    return 200 <= status < 300


def check_url(
    url: str,
    *,
    allow_private: bool,
    resolve: Callable[[str], Iterable[str]],
) -> str:
    """``url`` if it may receive deliveries: http(s), a host, no credentials, and unless
    ``allow_private`` no address of the host (``resolve``: host -> IP strings) is loopback,
    private, link-local or otherwise not global: a tenant must not make the control plane
    call its own network (a cloud metadata endpoint, the database)."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidWebhookUrl(f"the webhook URL is malformed: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise InvalidWebhookUrl("a webhook URL must be http or https")
    if not parts.hostname:
        raise InvalidWebhookUrl("a webhook URL needs a host")
    if parts.username or parts.password:
        raise InvalidWebhookUrl("a webhook URL must not carry credentials")
    if port == 0:
        raise InvalidWebhookUrl("a webhook URL needs a real port")
    if allow_private:
        return url
    try:
        addresses = [ipaddress.ip_address(a.split("%")[0]) for a in resolve(parts.hostname)]
    except (OSError, ValueError) as exc:
        raise InvalidWebhookUrl(
            f"the webhook host {parts.hostname!r} does not resolve: {exc}"
        ) from None
    if not addresses:
        raise InvalidWebhookUrl(f"the webhook host {parts.hostname!r} has no address")
    local = sorted({str(a) for a in addresses if not a.is_global})
    if local:
        raise InvalidWebhookUrl(
            f"the webhook host {parts.hostname!r} resolves to non-public addresses "
            f"({', '.join(local)}); set RUNCONTROL_WEBHOOKS__ALLOW_PRIVATE_ADDRESSES=true "
            "to allow them"
        )
    return url
