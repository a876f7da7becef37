"""The people's commands on run templates (docs/templates.md): ``runcontrol templates create|
edit|list|show|decide|revoke``, over the HTTP API."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, TextIO

from .http_api import Api, command
from .output import emit_json, fields, listing, reply

COLUMNS = (
    ("TEMPLATE", "templateId"),
    ("VERSION", "version"),
    ("STATE", "state"),
    ("WORKFLOW", "workflowId"),
    ("USES", "uses"),
    ("DECIDED BY", "decidedBy"),
)
SHOWN = (
    ("template", "templateId"),
    ("version", "version"),
    ("state", "state"),
    ("workflow", "workflowId"),
    ("alias", "releaseAlias"),
    ("content hash", "contentHash"),
    ("created by", "createdBy"),
    ("decided by", "decidedBy"),
    ("reason", "reason"),
    ("uses", "uses"),
)


def _shown(view: dict[str, Any], args: argparse.Namespace, out: TextIO) -> None:
    if args.json:
        emit_json(view, out)
    else:
        fields(view, SHOWN, out)


def _document(path: str) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def templates_create(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    _shown(api.call("POST", "/factory/templates", json=_document(args.file)), args, out)


def templates_edit(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    path = f"/factory/templates/{args.template_id}"
    _shown(api.call("PUT", path, json=_document(args.file)), args, out)


def templates_list(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    listing(api.call("GET", "/factory/templates")["items"], COLUMNS, args, out)


def templates_show(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    _shown(api.call("GET", f"/factory/templates/{args.template_id}"), args, out)


def templates_decide(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    """Decide the newest version as shown now (its version and content hash)."""
    shown = api.call("GET", f"/factory/templates/{args.template_id}")
    body = {
        "decision": args.decision,
        "version": shown["version"],
        "contentHash": shown["contentHash"],
        "reason": args.reason,
    }
    decided = api.call("POST", f"/factory/templates/{args.template_id}/decision", json=body)
    reply(decided, lambda d: f"template {d['templateId']}@{d['version']} {d['state']}", args, out)


def templates_revoke(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    path = f"/factory/templates/{args.template_id}/revocation"
    revoked = api.call("POST", path, json={"reason": args.reason})
    reply(revoked, lambda d: f"template {d['templateId']}@{d['version']} {d['state']}", args, out)


def add_templates(sub: Any) -> None:
    group = sub.add_parser("templates", help="run templates with pre-approved action classes")
    t = group.add_subparsers(dest="templates_command", required=True)
    command(t, "create", templates_create, "propose a template (a JSON file)").add_argument("file")
    p = command(t, "edit", templates_edit, "a new version of a template (a JSON file)")
    p.add_argument("template_id")
    p.add_argument("file")
    command(t, "list", templates_list, "every template version")
    command(t, "show", templates_show, "a template's newest version").add_argument("template_id")
    p = command(t, "decide", templates_decide, "approve or reject the newest version")
    p.add_argument("decision", choices=("approve", "reject"))
    p.add_argument("template_id")
    p.add_argument("--reason", default=None)
    p = command(t, "revoke", templates_revoke, "revoke the newest version at once")
    p.add_argument("template_id")
    p.add_argument("--reason", default=None)
