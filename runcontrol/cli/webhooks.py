"""The people's commands on the tenant's webhook subscriptions: ``runcontrol webhooks create|
list|show|delete|deliveries|redeliver``, over the HTTP API."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from .http_api import Api, command
from .output import emit_json, fields, listing, reply

WEBHOOK_COLUMNS = (
    ("WEBHOOK", "subscriptionId"),
    ("URL", "url"),
    ("MAX ATTEMPTS", "maxAttempts"),
    ("CREATED", "createdAt"),
    ("DISABLED", "disabledAt"),
)


DELIVERY_COLUMNS = (
    ("POSITION", "position"),
    ("STATE", "state"),
    ("ATTEMPTS", "attempts"),
    ("RUN", "runId"),
    ("SEQ", "seq"),
    ("TYPE", "type"),
    ("LAST", "lastError"),
)


def webhooks_create(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    body: dict[str, Any] = {"url": args.webhook_url}
    if args.description:
        body["description"] = args.description
    if args.max_attempts:
        body["maxAttempts"] = args.max_attempts
    created = api.call("POST", "/factory/webhooks", json=body)
    if args.json:
        emit_json(created, out)
        return
    fields(
        created,
        (
            ("webhook", "subscriptionId"),
            ("url", "url"),
            ("max attempts", "maxAttempts"),
            ("starts after", "startsAfter"),
            ("secret", "secret"),
        ),
        out,
    )
    print("\nkeep the secret: it is shown only now (it signs every delivery)", file=out)


def webhooks_list(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    items = api.call("GET", "/factory/webhooks")["items"]
    listing(items, WEBHOOK_COLUMNS, args, out)


def webhooks_show(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    view = api.call("GET", f"/factory/webhooks/{args.subscription_id}")
    if args.json:
        emit_json(view, out)
        return
    counts = view.get("deliveries") or {}
    fields(
        {**view, **{f"n_{k}": v for k, v in counts.items()}},
        (
            ("webhook", "subscriptionId"),
            ("url", "url"),
            ("description", "description"),
            ("max attempts", "maxAttempts"),
            ("created by", "createdBy"),
            ("created", "createdAt"),
            ("starts after", "startsAfter"),
            ("disabled", "disabledAt"),
            ("pending", "n_pending"),
            ("delivered", "n_delivered"),
            ("dead-lettered", "n_deadLettered"),
        ),
        out,
    )


def webhooks_delete(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    api.call("DELETE", f"/factory/webhooks/{args.subscription_id}")
    disabled = {"subscriptionId": args.subscription_id, "disabled": True}
    reply(disabled, lambda d: f"webhook {d['subscriptionId']} disabled", args, out)


def webhooks_deliveries(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    params: dict[str, Any] = {"after": args.after, "limit": args.limit}
    if args.state:
        params["state"] = args.state
    page = api.call("GET", f"/factory/webhooks/{args.subscription_id}/deliveries", params=params)
    listing(page["items"], DELIVERY_COLUMNS, args, out)


def webhooks_redeliver(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    answer = api.call(
        "POST",
        f"/factory/webhooks/{args.subscription_id}/redeliver",
        json={"after": args.after},
    )
    reply(
        answer,
        lambda a: (
            f"{a['queued']} events after position {a['after']} queued again for "
            f"webhook {a['subscriptionId']}"
        ),
        args,
        out,
    )


def add_webhooks(sub: Any) -> None:
    hooks = sub.add_parser("webhooks", help="the tenant's webhook subscriptions")
    w = hooks.add_subparsers(dest="webhooks_command", required=True)
    p = command(w, "create", webhooks_create, "subscribe a URL to every event of the tenant")
    p.add_argument("webhook_url")
    p.add_argument("--description", default=None)
    p.add_argument("--max-attempts", type=int, default=None)
    command(w, "list", webhooks_list, "the subscriptions")
    for name, handler, help_text in (
        ("show", webhooks_show, "a subscription and its delivery counts"),
        ("delete", webhooks_delete, "disable a subscription"),
    ):
        command(w, name, handler, help_text).add_argument("subscription_id")
    p = command(w, "deliveries", webhooks_deliveries, "a subscription's deliveries")
    p.add_argument("subscription_id")
    p.add_argument("--state", action="append", help="Pending, Delivered, DeadLettered")
    p.add_argument("--after", type=int, default=0, help="after this feed position")
    p.add_argument("--limit", type=int, default=100)
    p = command(w, "redeliver", webhooks_redeliver, "send every event after a position again")
    p.add_argument("subscription_id")
    p.add_argument("--after", type=int, required=True, help="a feed position (0: all retained)")
