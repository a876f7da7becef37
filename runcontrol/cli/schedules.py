"""The people's commands on schedules: ``runcontrol schedules list|show|create|pause|resume|
trigger|backfill|delete``, over the HTTP API (docs/schedules.md)."""

from __future__ import annotations

import argparse
from typing import Any, TextIO

from .http_api import Api, CliError, command, json_arg
from .output import emit_json, fields, listing, reply, table

SCHEDULE_COLUMNS = (
    ("SCHEDULE", "scheduleId"),
    ("WORKFLOW", "run.workflowId"),
    ("CRON / EVERY", "when"),
    ("OVERLAP", "overlap"),
    ("PAUSED", "paused"),
    ("NEXT", "nextFireAt"),
    ("STARTED", "started"),
    ("SKIPPED", "skipped"),
    ("MISSED", "missed"),
)


def _when(s: dict[str, Any]) -> str:
    if s.get("cron"):
        return f"{s['cron']} ({s['timeZone']})"
    return f"every {s['intervalSeconds']:g} s"


def schedules_list(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    items = api.call("GET", "/factory/schedules", params={"limit": 200})["items"]
    listing([{**s, "when": _when(s)} for s in items], SCHEDULE_COLUMNS, args, out)


def _show(s: dict[str, Any], args: argparse.Namespace, out: TextIO) -> None:
    if args.json:
        emit_json(s, out)
        return
    fields(
        {
            **s,
            "when": _when(s),
            "workflow": f"{s['run']['workflowId']}@{s['run'].get('releaseAlias') or 'latest'}",
        },
        (
            ("schedule", "scheduleId"),
            ("workflow", "workflow"),
            ("when", "when"),
            ("jitter s", "jitterSeconds"),
            ("overlap", "overlap"),
            ("catch-up window s", "catchUpWindowSeconds"),
            ("owner", "owner"),
            ("paused", "paused"),
            ("note", "note"),
            ("next fire", "nextFireAt"),
            ("started", "started"),
            ("skipped", "skipped"),
            ("missed", "missed"),
        ),
        out,
    )
    if s.get("nextFireTimes"):
        print("\nnext fire times: " + ", ".join(s["nextFireTimes"]), file=out)
    print("\nlast fires:", file=out)
    table(
        s.get("lastFires", []),
        (
            ("NOMINAL", "nominalAt"),
            ("KIND", "kind"),
            ("OUTCOME", "outcome"),
            ("RUN", "runId"),
            ("RUN STATE", "runState"),
            ("ERROR", "error"),
        ),
        out,
    )


def schedules_show(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    _show(api.call("GET", f"/factory/schedules/{args.schedule_id}"), args, out)


def schedules_create(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    if (args.cron is None) == (args.every is None):
        raise CliError("give --cron or --every")
    run: dict[str, Any] = {
        "workflowId": args.workflow,
        "releaseAlias": args.release_alias,
        "modelProfileId": args.model_profile,
        "input": json_arg(args.input),
    }
    body: dict[str, Any] = {
        "run": run,
        "timeZone": args.time_zone,
        "jitterSeconds": args.jitter,
        "overlap": args.overlap,
        "catchUpWindowSeconds": args.catch_up,
    }
    if args.cron is not None:
        body["cron"] = args.cron
    else:
        body["intervalSeconds"] = args.every
    for flag, key in ((args.start, "startAt"), (args.end, "endAt")):
        if flag:
            body[key] = flag
    _show(api.call("POST", "/factory/schedules", json=body), args, out)


def _paused(paused: bool) -> Any:
    def change(api: Api, args: argparse.Namespace, out: TextIO) -> None:
        body = {"paused": paused, **({"note": args.note} if args.note else {})}
        s = api.call("PATCH", f"/factory/schedules/{args.schedule_id}", json=body)
        reply(
            s,
            lambda v: f"schedule {v['scheduleId']} {'paused' if v['paused'] else 'resumed'}",
            args,
            out,
        )

    return change


# A trigger or backfill fires through a pause (docs/schedules.md): said, not refused.
THROUGH_PAUSE = " (the schedule is paused: fired by hand anyway; its own fire times wait)"


def _through_pause(answer: dict[str, Any]) -> str:
    return THROUGH_PAUSE if answer.get("paused") else ""


def schedules_trigger(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    answer = api.call("POST", f"/factory/schedules/{args.schedule_id}/trigger")
    reply(
        answer,
        lambda a: (
            f"fired at {a['nominalAt']}: {a['outcome'] or 'already fired'}" + _through_pause(a)
        ),
        args,
        out,
    )


def schedules_backfill(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    body = {"startAt": args.start, "endAt": args.end}
    if args.overlap:
        body["overlap"] = args.overlap
    answer = api.call("POST", f"/factory/schedules/{args.schedule_id}/backfill", json=body)
    reply(
        answer,
        lambda a: ", ".join(f"{n} {k}" for k, n in a.items() if k != "paused") + _through_pause(a),
        args,
        out,
    )


def schedules_delete(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    api.call("DELETE", f"/factory/schedules/{args.schedule_id}")
    print(f"schedule {args.schedule_id} deleted", file=out)


OVERLAPS = ("skip", "buffer-one", "allow-all", "cancel-other")


def add_schedules(sub: Any) -> None:
    schedules = sub.add_parser("schedules", help="runs started on a cron or an interval")
    s = schedules.add_subparsers(dest="schedules_command", required=True)
    command(s, "list", schedules_list, "the schedules you may see")
    p = command(s, "show", schedules_show, "a schedule: next fire times, last fires, counts")
    p.add_argument("schedule_id")
    p = command(s, "create", schedules_create, "a schedule of runs of a workflow")
    p.add_argument("--workflow", required=True)
    p.add_argument("--release-alias", default="latest")
    p.add_argument("--model-profile", required=True)
    p.add_argument("--input", default="{}", help="JSON object, or @FILE")
    p.add_argument("--cron", default=None, help="5 fields (or 6, seconds first)")
    p.add_argument("--time-zone", default="UTC")
    p.add_argument("--every", type=float, default=None, help="instead of --cron: seconds")
    p.add_argument("--jitter", type=float, default=0.0, help="seconds (default 0)")
    p.add_argument("--overlap", choices=OVERLAPS, default="skip")
    p.add_argument("--catch-up", type=float, default=300.0, help="seconds (default 300)")
    p.add_argument("--start", default=None, help="ISO 8601 with a zone")
    p.add_argument("--end", default=None, help="ISO 8601 with a zone")
    for name, paused in (("pause", True), ("resume", False)):
        p = command(s, name, _paused(paused), f"{name} the schedule, with a note")
        p.add_argument("schedule_id")
        p.add_argument("--note", default=None)
    p = command(s, "trigger", schedules_trigger, "fire the schedule now")
    p.add_argument("schedule_id")
    p = command(s, "backfill", schedules_backfill, "fire each fire time in [start, end) once")
    p.add_argument("schedule_id")
    p.add_argument("--start", required=True)
    p.add_argument("--end", required=True)
    p.add_argument("--overlap", choices=OVERLAPS, default=None)
    p = command(s, "delete", schedules_delete, "delete the schedule (its runs stay)")
    p.add_argument("schedule_id")
