"""The people's commands on runs and events: ``runcontrol runs list|show|submit|cancel|signal|
tail`` and ``runcontrol events tail`` (the tenant's feed), over the HTTP API."""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any, TextIO

from ..domain.events import TERMINAL_EVENTS
from .approvals import APPROVAL_COLUMNS
from .http_api import Api, CliError, Sse, add_retry_key, command, idempotency, json_arg, pages
from .output import bulk_outcomes, emit_json, fields, listing, reply, table
from .replays import add_replay

RUN_COLUMNS = (
    ("RUN", "runId"),
    ("STATE", "state"),
    ("WORKFLOW", "workflowId"),
    ("PROJECT", "projectId"),
    ("REQUESTED BY", "requestedBy"),
    ("CREATED", "createdAt"),
    ("RESULT BYTES", "resultBytes"),
)


def event_line(e: Sse, feed: bool) -> str:
    d = e.data
    where = " ".join(
        f"{k}={d[key]}" for k, key in (("step", "stepId"), ("attempt", "attemptId")) if d.get(key)
    )
    run = f"run={d['runId']} seq={d['seq']} " if feed else ""
    payload = d.get("payload") or {}
    if "fromState" in payload and "toState" in payload:  # RunStateChanged: what it changed
        where = f"{payload['fromState']} -> {payload['toState']} {where}"
    return f"{e.id:>6}  {d.get('occurredAt', '')}  {e.event:<24} {run}{where}".rstrip()


def runs_list(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    params: dict[str, Any] = {"limit": min(args.limit, 200)}
    if args.state:
        params["state"] = args.state
    if args.workflow:
        params["workflowId"] = args.workflow
    items = pages(api, "/factory/runs", params, args.limit)
    listing(items, RUN_COLUMNS, args, out)


def runs_show(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    run = api.call("GET", f"/factory/runs/{args.run_id}")
    if args.result:
        # the result alone, as JSON (a reference when the result is stored elsewhere)
        emit_json(run["resultRef"] if run.get("resultRef") is not None else run["result"], out)
        return
    if args.json:
        emit_json(run, out)
        return
    fields(
        run,
        (
            ("run", "runId"),
            ("state", "state"),
            ("workflow", "workflowId"),
            ("release", "releaseId"),
            ("policy revision", "policyRevision"),
            ("project", "projectId"),
            ("requested by", "requestedBy"),
            ("failure", "failureClass"),
            ("created", "createdAt"),
            ("updated", "updatedAt"),
            ("last event seq", "lastEventSeq"),
            ("result hash", "resultHash"),
            ("result bytes", "resultBytes"),
            ("priority", "priority"),
        ),
        out,
    )
    if run.get("result") is not None or run.get("resultRef") is not None:
        print("\nresult:", file=out)
        emit_json(run["resultRef"] if run.get("resultRef") is not None else run["result"], out)
    print("\nsteps:", file=out)
    rows = []
    for step in run["steps"]:
        attempts = step["attempts"] or [{}]
        for a in attempts:
            lease = a.get("lease") or {}
            rows.append(
                {
                    "step": f"{step['ordinal']}:{step['name']}",
                    "stepState": (
                        f"{step['state']} (held: {step['heldReason']})"
                        if step.get("heldReason")
                        else step["state"]
                    ),
                    "attempt": a.get("number"),
                    "attemptState": a.get("state"),
                    "holder": lease.get("holder"),
                    "token": lease.get("fencingToken"),
                    "expires": lease.get("expiresAt"),
                }
            )
    table(
        rows,
        (
            ("STEP", "step"),
            ("STATE", "stepState"),
            ("ATTEMPT", "attempt"),
            ("ATTEMPT STATE", "attemptState"),
            ("LEASE HOLDER", "holder"),
            ("TOKEN", "token"),
            ("LEASE EXPIRES", "expires"),
        ),
        out,
    )
    for step in run["steps"]:
        if step.get("heldReason"):
            print(f"step {step['ordinal']}:{step['name']} held: {step['heldReason']}", file=out)
    if run["pendingApprovals"]:
        print("\npending approvals:", file=out)
        table(run["pendingApprovals"], APPROVAL_COLUMNS, out)


def runs_submit(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    body: dict[str, Any] = {
        "workflowId": args.workflow,
        "modelProfileId": args.model_profile,
        "input": json_arg(args.input),
    }
    limits = {"maxCostUsd": args.max_cost_usd, "maxMinutes": args.max_minutes}
    body["limits"] = {k: v for k, v in limits.items() if v is not None}  # optional, as in the API
    if args.release_id:
        body["releaseId"] = args.release_id
    else:
        body["releaseAlias"] = args.release_alias
    if args.environment:
        body["environmentId"] = args.environment
    if args.priority is not None:
        body["priority"] = args.priority
    key = args.key or f"cli-{uuid.uuid4()}"
    answer = api.call("POST", "/factory/runs", json=body, headers={"Idempotency-Key": key})
    if args.json:
        emit_json(answer, out)
        return
    fields(
        {**answer, "idempotencyKey": key},
        (
            ("run", "runId"),
            ("state", "state"),
            ("release", "releaseId"),
            ("policy revision", "policyRevision"),
            ("snapshot", "snapshotId"),
            ("idempotency key", "idempotencyKey"),
        ),
        out,
    )


def runs_signal(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    """Send a run's signal step its input (a new key each time unless --key: a retry with the
    same key gets the first answer)."""
    body = json_arg(args.data, "--data")
    key = args.key or f"cli-{uuid.uuid4()}"
    answer = api.call(
        "POST",
        f"/factory/runs/{args.run_id}/signals/{args.name}",
        json=body,
        headers={"Idempotency-Key": key},
    )
    if args.json:
        emit_json(answer, out)
        return
    answer = {
        **answer,
        "idempotencyKey": key,
        "delivered": "yes" if answer["delivered"] else "no: kept until the step waits",
    }
    fields(
        answer,
        (
            ("run", "runId"),
            ("step", "stepId"),
            ("signal", "name"),
            ("delivered", "delivered"),
            ("run state", "state"),
            ("idempotency key", "idempotencyKey"),
        ),
        out,
    )


def runs_cancel(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    headers = idempotency(args)
    answer = api.call(
        "POST",
        f"/factory/runs/{args.run_id}/cancel",
        json={"reason": args.reason},
        headers=headers,
    )
    reply(answer, lambda a: f"run {a['runId']} is {a['state']}", args, out)


def runs_cancel_many(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    body = {"runIds": args.run_ids, "reason": args.reason}
    answer = api.call("POST", "/factory/runs/cancel", json=body, headers=idempotency(args))
    refused = bulk_outcomes(answer, "runId", args, out)
    if refused:
        raise CliError(f"{refused} of {len(args.run_ids)} cancels refused (outcomes above)")


def _tail(api: Api, path: str, args: argparse.Namespace, out: TextIO, feed: bool) -> None:
    seen = 0
    for event in api.stream(path, args.after, {}):
        if args.json:
            print(json.dumps(event.data), file=out, flush=True)
        else:
            print(event_line(event, feed), file=out, flush=True)
        seen += 1
        if args.count is not None and seen >= args.count:
            return
        if not feed and event.event in TERMINAL_EVENTS:
            return


def runs_tail(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    if args.output:
        _tail_output(api, args, out)
        return
    _tail(api, f"/factory/runs/{args.run_id}/events", args, out, feed=False)


def _tail_output(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    """The run's streamed output as it is written: text as it is (a model's tokens read as
    prose), a JSON chunk on a line of its own; ``--json``: each chunk's view on a line."""
    seen = 0
    for chunk in api.stream(f"/factory/runs/{args.run_id}/output/stream", args.after, {}):
        d = chunk.data
        if args.json:
            print(json.dumps(d), file=out, flush=True)
        elif "text" in d:
            print(d["text"], end="", file=out, flush=True)
        else:
            print(json.dumps(d.get("data")), file=out, flush=True)
        seen += 1
        if args.count is not None and seen >= args.count:
            return


def events_tail(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    _tail(api, "/factory/events", args, out, feed=True)


def add_runs(sub: Any) -> None:
    runs = sub.add_parser("runs", help="list, show, submit, cancel and tail runs (HTTP API)")
    r = runs.add_subparsers(dest="runs_command", required=True)
    p = command(r, "list", runs_list, "runs newest first")
    p.add_argument("--state", action="append", help="only runs in this state (repeatable)")
    p.add_argument("--workflow", default=None, help="only runs of this workflow id")
    p.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    p = command(r, "show", runs_show, "a run with its result, steps, attempts and leases", ["get"])
    p.add_argument("run_id")
    p.add_argument("--result", action="store_true", help="print only the run's result (JSON)")
    p = command(r, "submit", runs_submit, "submit a run (idempotent on --key)")
    p.add_argument("--workflow", required=True)
    p.add_argument("--model-profile", required=True)
    p.add_argument("--input", default="{}", help="JSON object, or @FILE")
    p.add_argument("--release-alias", default="latest")
    p.add_argument("--release-id", default=None, help="pin this release (instead of an alias)")
    p.add_argument("--environment", default=None)
    p.add_argument("--max-cost-usd", type=float, default=None, help="the run's cost limit")
    p.add_argument("--max-minutes", type=int, default=None, help="the run's time limit")
    p.add_argument(
        "--priority",
        type=int,
        choices=range(1, 6),
        default=None,
        help="1-5 (default 3); above 3 needs factory.runs.operate (docs/flow-control.md)",
    )
    p.add_argument("--key", default=None, help="Idempotency-Key (default: a new one, printed)")
    p = command(r, "cancel", runs_cancel, "record cancellation intent")
    p.add_argument("run_id")
    p.add_argument("--reason", required=True)
    add_retry_key(p)
    p = command(r, "cancel-many", runs_cancel_many, "record cancellation intent on many runs")
    p.add_argument("run_ids", nargs="+")
    p.add_argument("--reason", required=True)
    add_retry_key(p)
    p = command(r, "signal", runs_signal, "send a run's signal step its input")
    p.add_argument("run_id")
    p.add_argument("name", help="the signal's name (the step's `signal`)")
    p.add_argument("--data", required=True, help="the body: JSON (not null), or @FILE")
    add_retry_key(p)
    p = command(r, "tail", runs_tail, "follow a run's events until it ends (resumes)")
    p.add_argument("run_id")
    p.add_argument(
        "--output",
        action="store_true",
        help="follow the run's streamed output instead of its events (--after: a position)",
    )
    p.add_argument("--after", type=int, default=None, help="start after this seq (default 0)")
    p.add_argument("--count", type=int, default=None, help="stop after this many events")
    add_replay(r)


def add_events(sub: Any) -> None:
    """``runcontrol events tail``: the tenant event feed."""
    events = sub.add_parser("events", help="the tenant event feed")
    e = events.add_subparsers(dest="events_command", required=True)
    p = command(e, "tail", events_tail, "follow every event you may see (resumes)")
    p.add_argument("--after", type=int, default=None, help="start after this feed position")
    p.add_argument("--count", type=int, default=None, help="stop after this many events")
