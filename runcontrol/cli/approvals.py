"""The people's commands on approval requests: ``runcontrol approvals list|show|approve|reject``,
over the HTTP API."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from .http_api import Api, CliError, Handler, add_retry_key, command, idempotency, pages
from .output import bulk_outcomes, emit_json, fields, listing, reply

APPROVAL_COLUMNS = (
    ("APPROVAL", "approvalId"),
    ("STATE", "state"),
    ("RUN", "runId"),
    ("ACTION", "actionClass"),
    ("REQUESTED BY", "requestedBy"),
    ("EXPIRES", "expiresAt"),
)


def approvals_list(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    params: dict[str, Any] = {"limit": min(args.limit, 200)}
    if args.state:
        params["state"] = args.state
    items = pages(api, "/factory/approvals", params, args.limit)
    listing(items, APPROVAL_COLUMNS, args, out)


APPROVAL_FIELDS = (
    ("approval", "approvalId"),
    ("state", "state"),
    ("run", "runId"),
    ("step", "stepId"),
    ("action class", "actionClass"),
    ("proposal hash", "proposalHash"),
    ("policy revision", "policyRevision"),
    ("approver rule", "approverRule"),
    ("requested by", "requestedBy"),
    ("version", "version"),
    ("expires", "expiresAt"),
    ("decided by", "decidedBy"),
    ("reason", "reason"),
)


def approvals_show(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    approval = api.call("GET", f"/factory/approvals/{args.approval_id}")
    if args.json:
        emit_json(approval, out)
    else:
        fields(approval, APPROVAL_FIELDS, out)


def _decide(verdict: str) -> Handler:
    def decide(api: Api, args: argparse.Namespace, out: TextIO) -> None:
        # The decision names the request's version and proposal hash as the server showed
        # them: a regenerated proposal is a new request, so this one cannot change under us.
        approval = api.call("GET", f"/factory/approvals/{args.approval_id}")
        proposal = args.proposal_hash or approval["proposalHash"]
        body = {
            "decision": verdict,
            "version": approval["version"],
            "proposalHash": proposal,
        }
        if args.reason:
            body["reason"] = args.reason
        headers = idempotency(args)
        decided = api.call(
            "POST", f"/factory/approvals/{args.approval_id}/decision", json=body, headers=headers
        )
        reply(
            decided,
            lambda d: f"approval {d['approvalId']} is {d['state']} (proposal {d['proposalHash']})",
            args,
            out,
        )

    return decide


def approvals_decide_many(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    """Decide the named requests (or every Pending one, ``--all-pending``) in one call, each
    on the version and proposal the server shows now; prints each one's outcome."""
    if args.all_pending:
        params: dict[str, Any] = {"state": "Pending", "limit": 200}
        shown = pages(api, "/factory/approvals", params, args.limit)
    elif args.approval_ids:
        shown = [api.call("GET", f"/factory/approvals/{a}") for a in args.approval_ids]
    else:
        raise CliError("name approval ids, or --all-pending")
    if not shown:
        raise CliError("no approval requests to decide")
    items = [
        {
            "approvalId": a["approvalId"],
            "decision": args.decision,
            "version": a["version"],
            "proposalHash": a["proposalHash"],
            **({"reason": args.reason} if args.reason else {}),
        }
        for a in shown
    ]
    answer = api.call(
        "POST", "/factory/approvals/decisions", json={"items": items}, headers=idempotency(args)
    )
    refused = bulk_outcomes(answer, "approvalId", args, out)
    if refused:
        raise CliError(f"{refused} of {len(items)} decisions refused (outcomes above)")


def _list_options(p: Any) -> None:
    p.add_argument("--state", action="append", help="Pending, Approved, ... (repeatable)")
    p.add_argument("--limit", type=int, default=50)


def add_approvals(sub: Any) -> None:
    approvals = command(
        sub, "approvals", approvals_list, "list (the default), show and decide approval requests"
    )
    _list_options(approvals)  # `runcontrol approvals` alone lists, as `approvals list` does
    a = approvals.add_subparsers(dest="approvals_command")
    _list_options(command(a, "list", approvals_list, "approval requests newest first"))
    p = command(a, "show", approvals_show, "one approval request")
    p.add_argument("approval_id")
    for verdict, name, needs_reason in (("approve", "approve", False), ("reject", "reject", True)):
        p = command(a, name, _decide(verdict), f"{name} the request's proposal")
        p.add_argument("approval_id")
        p.add_argument("--reason", required=needs_reason, default=None)
        p.add_argument(
            "--proposal-hash", default=None, help="refuse unless it is this proposal (409)"
        )
        add_retry_key(p)
    p = command(a, "decide-many", approvals_decide_many, "decide many requests in one call")
    p.add_argument("decision", choices=("approve", "reject", "request-changes"))
    p.add_argument("approval_ids", nargs="*", help="the requests (or --all-pending)")
    p.add_argument("--all-pending", action="store_true", help="every Pending request you see")
    p.add_argument("--limit", type=int, default=500, help="with --all-pending: at most this many")
    p.add_argument("--reason", default=None)
    add_retry_key(p)
