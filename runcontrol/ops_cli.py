"""The CLI for people: ``runcontrol runs|approvals|webhooks|events ...`` over the HTTP API.

It talks HTTP only (no Ray, no database): the base URL comes from ``--url``,
``RUNCONTROL_URL`` or the config file, the bearer token from ``--token``, ``RUNCONTROL_TOKEN``
or the config file (``RUNCONTROL_CONFIG``, default ``~/.config/runcontrol/cli.toml``, keys
``url`` and ``token``). Lists print as tables, ``--json`` prints the API's JSON for scripts,
and an API refusal prints its problem+json (status, code, detail) and exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tomllib
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import httpx
from platformdirs import user_config_dir

from .client import TERMINAL_EVENTS

DEFAULT_URL = "http://127.0.0.1:8000"
EXIT_REFUSED = 1  # the API answered with a problem
EXIT_UNREACHABLE = 3  # no answer at all
RECONNECT_S = 2.0  # until the stream's own ``retry:`` says otherwise


class CliError(Exception):
    """What the command tells the user on stderr before exiting with ``exit_code``."""

    def __init__(self, message: str, exit_code: int = EXIT_REFUSED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# ---------------------------------------------------------------------- configuration


def config_path() -> Path:
    configured = os.environ.get("RUNCONTROL_CONFIG")
    return Path(configured) if configured else Path(user_config_dir("runcontrol")) / "cli.toml"


def load_config(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise CliError(f"cannot read the config file {path}: {exc}") from None


@dataclass(frozen=True)
class Target:
    url: str
    token: str


def target(args: argparse.Namespace) -> Target:
    """Flag, then environment, then config file."""
    file = load_config(config_path())
    url = args.url or os.environ.get("RUNCONTROL_URL") or file.get("url") or DEFAULT_URL
    token = args.token or os.environ.get("RUNCONTROL_TOKEN") or file.get("token")
    if not token:
        raise CliError(
            'no token: pass --token, set RUNCONTROL_TOKEN, or put `token = "..."` in '
            f"{config_path()} (`runcontrol token ...` mints a dev token)"
        )
    return Target(str(url).rstrip("/"), str(token))


# ---------------------------------------------------------------------- HTTP


def problem_message(response: httpx.Response) -> str:
    """One line from an API refusal: its problem+json when there is one."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or "title" not in body:
        text = response.text.strip()[:300]
        return f"{response.status_code} {response.reason_phrase}" + (f": {text}" if text else "")
    code = f" ({body['code']})" if body.get("code") else ""
    detail = f": {body['detail']}" if body.get("detail") else ""
    line = f"{body.get('status', response.status_code)} {body['title']}{code}{detail}"
    for error in body.get("errors") or ():  # request validation
        if isinstance(error, dict):
            where = ".".join(str(p) for p in error.get("loc", ()))
            line += f"\n  {where}: {error.get('msg', '')}"
    if response.headers.get("Retry-After"):
        line += f" (retry after {response.headers['Retry-After']} s)"
    return line


class Api:
    def __init__(self, t: Target, timeout_s: float = 30.0) -> None:
        self.target = t
        self.http = httpx.Client(
            base_url=t.url, headers={"Authorization": f"Bearer {t.token}"}, timeout=timeout_s
        )

    def call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            response = self.http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise CliError(f"cannot reach {self.target.url}: {exc}", EXIT_UNREACHABLE) from None
        if response.status_code >= 400:
            raise CliError(problem_message(response))
        if response.status_code == 204 or not response.content:
            return None
        return response.json()

    def stream(self, path: str, after: int | None, params: dict[str, Any]) -> Iterator[Sse]:
        """The SSE stream at ``path`` from ``after``, reconnecting with ``Last-Event-ID``
        whenever the connection drops, until the server ends it (or answers 204)."""
        last = after
        delay = RECONNECT_S
        while True:
            headers = {"Last-Event-ID": str(last)} if last is not None else {}
            try:
                with self.http.stream(
                    "GET",
                    path,
                    headers=headers,
                    params=params,
                    timeout=httpx.Timeout(30.0, read=None),
                ) as response:
                    if response.status_code == 204:
                        return
                    if response.status_code >= 400:
                        response.read()
                        raise CliError(problem_message(response))
                    for item in parse_sse(response.iter_lines()):
                        if isinstance(item, int):
                            delay = item / 1000
                            continue
                        last = item.id
                        yield item
                return  # the server ended the stream
            except (httpx.TransportError, httpx.RemoteProtocolError) as exc:
                print(
                    f"runcontrol: stream interrupted ({exc}); resuming after {last} "
                    f"in {delay:.1f} s",
                    file=sys.stderr,
                    flush=True,
                )
                time.sleep(delay)

    def close(self) -> None:
        self.http.close()


@dataclass(frozen=True)
class Sse:
    id: int
    event: str
    data: dict[str, Any]


def parse_sse(lines: Iterator[str]) -> Iterator[Sse | int]:
    """Events of a text/event-stream, and each ``retry:`` (milliseconds) as an int."""
    fields: dict[str, str] = {}
    for line in lines:
        if line.startswith(":"):
            continue
        if line == "":
            if "data" in fields and "id" in fields:
                yield Sse(
                    int(fields["id"]), fields.get("event", "message"), json.loads(fields["data"])
                )
            fields = {}
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "retry" and value.isdigit():
            yield int(value)
        elif name == "data" and "data" in fields:
            fields["data"] += "\n" + value
        else:
            fields[name] = value


# ---------------------------------------------------------------------- output


def table(rows: Sequence[dict[str, Any]], columns: Sequence[tuple[str, str]], out: TextIO) -> None:
    """``rows`` as aligned columns: (header, key) pairs; nested keys with dots."""

    def cell(row: dict[str, Any], key: str) -> str:
        value: Any = row
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return "-" if value is None else str(value)

    cells = [[cell(r, key) for _, key in columns] for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, (h, _) in enumerate(columns)]
    print(
        "  ".join(h.ljust(w) for (h, _), w in zip(columns, widths, strict=True)).rstrip(), file=out
    )
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths, strict=True)).rstrip(), file=out)
    if not rows:
        print("(none)", file=out)


def emit_json(value: Any, out: TextIO) -> None:
    print(json.dumps(value, indent=2, sort_keys=False), file=out)


def listing(
    items: Sequence[dict[str, Any]],
    columns: Sequence[tuple[str, str]],
    args: argparse.Namespace,
    out: TextIO,
) -> None:
    """A list command's answer: the items as JSON with ``--json``, else as a table."""
    if args.json:
        emit_json(items, out)
    else:
        table(items, columns, out)


def fields(view: dict[str, Any], names: Sequence[tuple[str, str]], out: TextIO) -> None:
    width = max(len(label) for label, _ in names)
    for label, key in names:
        value = view.get(key)
        print(f"{label.ljust(width)}  {'-' if value is None else value}", file=out)


RUN_COLUMNS = (
    ("RUN", "runId"),
    ("STATE", "state"),
    ("WORKFLOW", "workflowId"),
    ("PROJECT", "projectId"),
    ("REQUESTED BY", "requestedBy"),
    ("CREATED", "createdAt"),
    ("RESULT BYTES", "resultBytes"),
)
APPROVAL_COLUMNS = (
    ("APPROVAL", "approvalId"),
    ("STATE", "state"),
    ("RUN", "runId"),
    ("ACTION", "actionClass"),
    ("REQUESTED BY", "requestedBy"),
    ("EXPIRES", "expiresAt"),
)
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


def event_line(e: Sse, feed: bool) -> str:
    d = e.data
    where = " ".join(
        f"{k}={d[key]}" for k, key in (("step", "stepId"), ("attempt", "attemptId")) if d.get(key)
    )
    run = f"run={d['runId']} seq={d['seq']} " if feed else ""
    return f"{e.id:>6}  {d.get('occurredAt', '')}  {e.event:<24} {run}{where}".rstrip()


# ---------------------------------------------------------------------- commands


Handler = Callable[[Api, argparse.Namespace, TextIO], None]


def _pages(api: Api, path: str, params: dict[str, Any], limit: int | None) -> list[dict[str, Any]]:
    """Items of every page up to ``limit`` items (None: all)."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        page = api.call("GET", path, params={**params, "cursor": cursor} if cursor else params)
        items.extend(page["items"])
        cursor = page.get("nextCursor")
        if not cursor or (limit is not None and len(items) >= limit):
            return items[:limit] if limit is not None else items


def runs_list(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    params: dict[str, Any] = {"limit": min(args.limit, 200)}
    if args.state:
        params["state"] = args.state
    if args.workflow:
        params["workflowId"] = args.workflow
    items = _pages(api, "/factory/runs", params, args.limit)
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


def _json_arg(value: str, flag: str = "--input") -> Any:
    try:
        text = Path(value[1:]).read_text(encoding="utf-8") if value.startswith("@") else value
    except OSError as exc:
        raise CliError(f"{flag}: cannot read {value[1:]}: {exc.strerror}") from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CliError(f"{flag} is not JSON: {exc}") from None


def runs_submit(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    body: dict[str, Any] = {
        "workflowId": args.workflow,
        "modelProfileId": args.model_profile,
        "input": _json_arg(args.input),
        "limits": {"maxCostUsd": args.max_cost_usd, "maxMinutes": args.max_minutes},
    }
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
    body = _json_arg(args.data, "--data")
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
    headers = {"Idempotency-Key": args.key} if args.key else {}
    answer = api.call(
        "POST",
        f"/factory/runs/{args.run_id}/cancel",
        json={"reason": args.reason},
        headers=headers,
    )
    if args.json:
        emit_json(answer, out)
    else:
        print(f"run {answer['runId']} is {answer['state']}", file=out)


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
    _tail(api, f"/factory/runs/{args.run_id}/events", args, out, feed=False)


def events_tail(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    _tail(api, "/factory/events", args, out, feed=True)


def approvals_list(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    params: dict[str, Any] = {"limit": min(args.limit, 200)}
    if args.state:
        params["state"] = args.state
    items = _pages(api, "/factory/approvals", params, args.limit)
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
        headers = {"Idempotency-Key": args.key} if args.key else {}
        decided = api.call(
            "POST", f"/factory/approvals/{args.approval_id}/decision", json=body, headers=headers
        )
        if args.json:
            emit_json(decided, out)
        else:
            print(
                f"approval {decided['approvalId']} is {decided['state']} "
                f"(proposal {decided['proposalHash']})",
                file=out,
            )

    return decide


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


QUEUE_COLUMNS = (
    ("KIND", "kind"),
    ("NAME", "name"),
    ("KEY", "key"),
    ("HOLDERS", "slots"),
    ("WAITING", "waiting"),
    ("OLDEST WAIT", "oldest"),
)


def queues_list(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    """The tenant's concurrency keys with holders or waiters (``GET /factory/queues``)."""
    items = api.call("GET", "/factory/queues")["items"]
    if args.json:
        emit_json(items, out)
        return
    if not items:
        print("no concurrency key has holders or waiters", file=out)
        return
    rows = [
        {
            **q,
            "name": q.get("name") or "-",
            "slots": f"{q['holders'] + q['promoted']}/{q['limit']}",
            "oldest": "-"
            if q.get("oldestWaitingSeconds") is None
            else f"{q['oldestWaitingSeconds']:.1f}s",
        }
        for q in items
    ]
    table(rows, QUEUE_COLUMNS, out)


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
    if args.json:
        emit_json({"subscriptionId": args.subscription_id, "disabled": True}, out)
    else:
        print(f"webhook {args.subscription_id} disabled", file=out)


def webhooks_deliveries(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    params: dict[str, Any] = {"after": args.after, "limit": args.limit}
    if args.state:
        params["state"] = args.state
    page = api.call("GET", f"/factory/webhooks/{args.subscription_id}/deliveries", params=params)
    if args.json:
        emit_json(page["items"], out)
    else:
        table(page["items"], DELIVERY_COLUMNS, out)


def webhooks_redeliver(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    answer = api.call(
        "POST",
        f"/factory/webhooks/{args.subscription_id}/redeliver",
        json={"after": args.after},
    )
    if args.json:
        emit_json(answer, out)
    else:
        print(
            f"{answer['queued']} events after position {answer['after']} queued again for "
            f"webhook {answer['subscriptionId']}",
            file=out,
        )


# ---------------------------------------------------------------------- the parser


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=None, help=f"API base URL (RUNCONTROL_URL; {DEFAULT_URL})")
    parser.add_argument("--token", default=None, help="bearer token (RUNCONTROL_TOKEN)")
    parser.add_argument("--json", action="store_true", help="print the API's JSON")


def _command(
    group: Any, name: str, handler: Handler, help_text: str, aliases: Sequence[str] = ()
) -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = group.add_parser(name, help=help_text, aliases=aliases)
    _common(parser)
    parser.set_defaults(func=lambda args: run(handler, args))
    return parser


def run(handler: Handler, args: argparse.Namespace, out: TextIO | None = None) -> int:
    """Run one command; API refusals and unreachable servers become a message and an exit
    code, never a traceback."""
    try:
        api = Api(target(args))
    except CliError as exc:
        print(f"runcontrol: {exc}", file=sys.stderr)
        return exc.exit_code
    try:
        handler(api, args, out or sys.stdout)
    except CliError as exc:
        print(f"runcontrol: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    finally:
        api.close()
    return 0


def add_commands(sub: Any) -> None:
    """Add ``runs``, ``approvals``, ``webhooks`` and ``events`` to the ``runcontrol`` parser."""
    runs = sub.add_parser("runs", help="list, show, submit, cancel and tail runs (HTTP API)")
    r = runs.add_subparsers(dest="runs_command", required=True)
    p = _command(r, "list", runs_list, "runs newest first")
    p.add_argument("--state", action="append", help="only runs in this state (repeatable)")
    p.add_argument("--workflow", default=None, help="only runs of this workflow id")
    p.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    p = _command(r, "show", runs_show, "a run with its result, steps, attempts and leases", ["get"])
    p.add_argument("run_id")
    p.add_argument("--result", action="store_true", help="print only the run's result (JSON)")
    p = _command(r, "submit", runs_submit, "submit a run (idempotent on --key)")
    p.add_argument("--workflow", required=True)
    p.add_argument("--model-profile", required=True)
    p.add_argument("--input", default="{}", help="JSON object, or @FILE")
    p.add_argument("--release-alias", default="latest")
    p.add_argument("--release-id", default=None, help="pin this release (instead of an alias)")
    p.add_argument("--environment", default=None)
    p.add_argument("--max-cost-usd", type=float, required=True)
    p.add_argument("--max-minutes", type=int, required=True)
    p.add_argument(
        "--priority",
        type=int,
        choices=range(1, 6),
        default=None,
        help="1-5 (default 3); above 3 needs factory.runs.operate (docs/flow-control.md)",
    )
    p.add_argument("--key", default=None, help="Idempotency-Key (default: a new one, printed)")
    p = _command(r, "cancel", runs_cancel, "record cancellation intent")
    p.add_argument("run_id")
    p.add_argument("--reason", required=True)
    p.add_argument("--key", default=None, help="Idempotency-Key: a retry gets the first answer")
    p = _command(r, "signal", runs_signal, "send a run's signal step its input")
    p.add_argument("run_id")
    p.add_argument("name", help="the signal's name (the step's `signal`)")
    p.add_argument("--data", default="null", help="the body: JSON, or @FILE")
    p.add_argument("--key", default=None, help="Idempotency-Key: a retry gets the first answer")
    p = _command(r, "tail", runs_tail, "follow a run's events until it ends (resumes)")
    p.add_argument("run_id")
    p.add_argument("--after", type=int, default=None, help="start after this seq (default 0)")
    p.add_argument("--count", type=int, default=None, help="stop after this many events")

    approvals = sub.add_parser("approvals", help="list, show and decide approval requests")
    a = approvals.add_subparsers(dest="approvals_command", required=True)
    p = _command(a, "list", approvals_list, "approval requests newest first")
    p.add_argument("--state", action="append", help="Pending, Approved, ... (repeatable)")
    p.add_argument("--limit", type=int, default=50)
    p = _command(a, "show", approvals_show, "one approval request")
    p.add_argument("approval_id")
    for verdict, name, needs_reason in (("approve", "approve", False), ("reject", "reject", True)):
        p = _command(a, name, _decide(verdict), f"{name} the request's proposal")
        p.add_argument("approval_id")
        p.add_argument("--reason", required=needs_reason, default=None)
        p.add_argument(
            "--proposal-hash", default=None, help="refuse unless it is this proposal (409)"
        )
        p.add_argument("--key", default=None, help="Idempotency-Key: a retry gets the first answer")

    hooks = sub.add_parser("webhooks", help="the tenant's webhook subscriptions")
    w = hooks.add_subparsers(dest="webhooks_command", required=True)
    p = _command(w, "create", webhooks_create, "subscribe a URL to every event of the tenant")
    p.add_argument("webhook_url")
    p.add_argument("--description", default=None)
    p.add_argument("--max-attempts", type=int, default=None)
    _command(w, "list", webhooks_list, "the subscriptions")
    for name, handler, help_text in (
        ("show", webhooks_show, "a subscription and its delivery counts"),
        ("delete", webhooks_delete, "disable a subscription"),
    ):
        _command(w, name, handler, help_text).add_argument("subscription_id")
    p = _command(w, "deliveries", webhooks_deliveries, "a subscription's deliveries")
    p.add_argument("subscription_id")
    p.add_argument("--state", action="append", help="Pending, Delivered, DeadLettered")
    p.add_argument("--after", type=int, default=0, help="after this feed position")
    p.add_argument("--limit", type=int, default=100)
    p = _command(w, "redeliver", webhooks_redeliver, "send every event after a position again")
    p.add_argument("subscription_id")
    p.add_argument("--after", type=int, required=True, help="a feed position (0: all retained)")

    _command(sub, "queues", queues_list, "concurrency keys: holders, waiting runs, oldest wait")

    events = sub.add_parser("events", help="the tenant event feed")
    e = events.add_subparsers(dest="events_command", required=True)
    p = _command(e, "tail", events_tail, "follow every event you may see (resumes)")
    p.add_argument("--after", type=int, default=None, help="start after this feed position")
    p.add_argument("--count", type=int, default=None, help="stop after this many events")
    _add_ops(sub)


# ---------------------------------------------------------------------- operator controls


def _control(path: str) -> Handler:
    """A run control: POST ``path`` (formatted with the args) with the reason, print the run's
    state as the control left it."""

    def handler(api: Api, args: argparse.Namespace, out: TextIO) -> None:
        headers = {"Idempotency-Key": args.key} if args.key else {}
        payload = {"reason": args.reason}
        if getattr(args, "outcome", None):
            payload["outcome"] = args.outcome
        answer = api.call("POST", path.format(**vars(args)), json=payload, headers=headers)
        if args.json:
            emit_json(answer, out)
            return
        line = f"run {answer['runId']} is {answer['state']}"
        if answer.get("suspended"):
            line += " (suspended)"
        if answer.get("attemptId"):
            line += (
                f"; attempt {answer['attemptId']} (#{answer['attemptNumber']}) is "
                f"{answer['attemptState']}"
            )
        print(line, file=out)

    return handler


def ops_rerun(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    headers = {"Idempotency-Key": args.key} if args.key else {}
    answer = api.call(
        "POST",
        f"/factory/runs/{args.run_id}/rerun",
        json={"reason": args.reason, "release": args.release, "releaseAlias": args.release_alias},
        headers=headers,
    )
    if args.json:
        emit_json(answer, out)
    else:
        print(
            f"run {answer['runId']} reruns {answer['rerunOf']} on release {answer['releaseId']} "
            f"({answer['release']}); it is {answer['state']}",
            file=out,
        )


def _add_ops(sub: Any) -> None:
    """``runcontrol ops suspend|resume|retry|resolve|rerun`` (Operator, WorkspaceAdmin,
    PlatformAdmin; every control needs ``--reason``, audited with the caller)."""
    ops = sub.add_parser("ops", help="run controls for operators (suspend, resume, retry, ...)")
    o = ops.add_subparsers(dest="ops_command", required=True)

    def control(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = _command(o, name, handler, help_text)
        p.add_argument("run_id")
        p.add_argument("--reason", required=True, help="why (audited with the caller)")
        p.add_argument("--key", default=None, help="Idempotency-Key: a retry gets the first answer")
        return p

    control(
        "suspend",
        _control("/factory/runs/{run_id}/suspend"),
        "hold a run: nothing new starts; leases in hand may finish",
    )
    control("resume", _control("/factory/runs/{run_id}/resume"), "resume a suspended run")
    p = control(
        "retry",
        _control("/factory/runs/{run_id}/steps/{step_id}/retry"),
        "dispatch a new attempt now of a step waiting for its retry",
    )
    p.add_argument("step_id")
    p = control(
        "resolve",
        _control("/factory/runs/{run_id}/attempts/{attempt_id}/resolve"),
        "settle an Uncertain attempt as Succeeded or Failed",
    )
    p.add_argument("attempt_id")
    p.add_argument("--outcome", required=True, choices=("Succeeded", "Failed"))
    p = control("rerun", ops_rerun, "rerun a finished run as a new run linked to it")
    p.add_argument("--release", choices=("pinned", "current"), default="pinned")
    p.add_argument("--release-alias", default="latest", help="the alias `current` resolves")
