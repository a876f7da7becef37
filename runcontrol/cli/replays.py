"""``runcontrol runs replay RUN --release ALIAS [--live-calls]`` (docs/replay.md): replay a
finished run against the release an alias names now, wait for the replay to end (or to wait
for a human), and print its divergence report, over the HTTP API."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, TextIO

from .http_api import Api, add_retry_key, command, idempotency
from .output import emit_json

SETTLED = {"Completed", "Failed", "Cancelled", "WaitingForApproval"}


def runs_replay(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    body = {
        "reason": args.reason,
        "releaseAlias": args.release,
        "liveCalls": args.live_calls,
        "approvals": args.approvals,
    }
    started = api.call(
        "POST", f"/factory/runs/{args.run_id}/replays", json=body, headers=idempotency(args)
    )
    replay_id = started["runId"]
    if args.no_wait:
        if args.json:
            emit_json(started, out)
        else:
            print(f"run {replay_id} replays {args.run_id} on {args.release}", file=out)
        return
    deadline = time.monotonic() + args.timeout
    while api.call("GET", f"/factory/runs/{replay_id}")["state"] not in SETTLED:
        if time.monotonic() > deadline:
            print(f"run {replay_id} replays {args.run_id}: not ended yet", file=out)
            return
        time.sleep(0.5)
    found = api.call("GET", f"/factory/runs/{replay_id}/replay-report")
    if args.json:
        emit_json(found, out)
        return
    print(render(found), file=out)


def render(found: dict[str, Any]) -> str:
    """A report as lines: the verdict, each step, the calls and approvals that differ."""
    verdict = "DIVERGED" if found["diverged"] else "equal"
    lines = [
        f"replay {found['replayRunId']} of {found['originalRunId']}: {verdict} "
        f"({found['originalState']} -> {found['replayState']})"
    ]
    for s in found["steps"]:
        state = "equal" if s["equal"] else "DIFFERENT"
        failed = f" [{s['replayFailureClass']}]" if s.get("replayFailureClass") else ""
        lines.append(
            f"  step {s['step']}: {state}{failed} original={s['originalHash']} "
            f"replay={s['replayHash']}"
        )
        for d in s.get("diff", []):
            lines.append(
                f"    {d['path']}: {json.dumps(d.get('before'))} -> {json.dumps(d.get('after'))}"
            )
    for title, key in (
        ("calls not in the original", "callsNotInOriginal"),
        ("calls of the original not made", "originalCallsNotMade"),
    ):
        for c in found[key]:
            lines.append(f"  {title}: {c['step']} {c['name']} #{c['occurrence']}")
    for a in found["approvalsChanged"]:
        lines.append(f"  approval changed: {a['step']} {a['proposalHash']}")
    return "\n".join(lines)


def add_replay(group: Any) -> None:
    """``runs replay`` under ``runcontrol runs``."""
    p = command(group, "replay", runs_replay, "replay a finished run against a newer release")
    p.add_argument("run_id")
    p.add_argument("--release", default="latest", help="the alias of the release to replay on")
    p.add_argument(
        "--live-calls",
        action="store_true",
        help="make the calls the original did not make (model requests; never side effects)",
    )
    p.add_argument(
        "--approvals",
        choices=("park", "fail"),
        default="park",
        help="a proposal the original never had approved: wait for a human, or fail the step",
    )
    p.add_argument("--reason", default="replay against a newer release", help="audited")
    p.add_argument("--no-wait", action="store_true", help="print the replay's id, not its report")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for its end")
    add_retry_key(p)
