"""The operators' commands: ``runcontrol ops suspend|resume|retry|resolve|rerun`` (run
controls: Operator, WorkspaceAdmin, PlatformAdmin; every control needs ``--reason``, audited with
the caller) and ``runcontrol queues`` (concurrency keys), over the HTTP API."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from .http_api import Api, Handler, add_retry_key, command, idempotency
from .output import emit_json, reply, table

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


def _control(path: str) -> Handler:
    """A run control: POST ``path`` (formatted with the args) with the reason, print the run's
    state as the control left it."""

    def handler(api: Api, args: argparse.Namespace, out: TextIO) -> None:
        headers = idempotency(args)
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
    headers = idempotency(args)
    answer = api.call(
        "POST",
        f"/factory/runs/{args.run_id}/rerun",
        json={"reason": args.reason, "release": args.release, "releaseAlias": args.release_alias},
        headers=headers,
    )
    reply(
        answer,
        lambda a: (
            f"run {a['runId']} reruns {a['rerunOf']} on release {a['releaseId']} "
            f"({a['release']}); it is {a['state']}"
        ),
        args,
        out,
    )


def add_ops(sub: Any) -> None:
    """``runcontrol ops suspend|resume|retry|resolve|rerun`` (Operator, WorkspaceAdmin,
    PlatformAdmin; every control needs ``--reason``, audited with the caller)."""
    ops = sub.add_parser("ops", help="run controls for operators (suspend, resume, retry, ...)")
    o = ops.add_subparsers(dest="ops_command", required=True)

    def control(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = command(o, name, handler, help_text)
        p.add_argument("run_id")
        p.add_argument("--reason", required=True, help="why (audited with the caller)")
        add_retry_key(p)
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


def add_queues(sub: Any) -> None:
    command(sub, "queues", queues_list, "concurrency keys: holders, waiting runs, oldest wait")
