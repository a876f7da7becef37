"""``runcontrol runs replay RUN --release ALIAS [--live-calls]`` (docs/replay.md): replay a
finished run against the release an alias names now, wait for the replay to end (or to wait
for a human), and print its divergence report, over the HTTP API."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any, TextIO

from ..domain.replay import summary
from .http_api import Api, add_retry_key, command, idempotency
from .output import emit_json

SETTLED = {"Completed", "Failed", "Cancelled", "WaitingForApproval"}


def _start(api: Api, run_id: str, args: argparse.Namespace) -> Any:
    body = {
        "reason": args.reason,
        "releaseAlias": args.release,
        "liveCalls": args.live_calls,
        "approvals": args.approvals,
    }
    return api.call("POST", f"/factory/runs/{run_id}/replays", json=body, headers=idempotency(args))


def _report(api: Api, replay_id: str, deadline: float) -> dict[str, Any] | None:
    """The replay's report once it ended (or waits for a human); None past ``deadline``."""
    while api.call("GET", f"/factory/runs/{replay_id}")["state"] not in SETTLED:
        if time.monotonic() > deadline:
            return None
        time.sleep(0.5)
    found: dict[str, Any] = api.call("GET", f"/factory/runs/{replay_id}/replay-report")
    return found


def runs_replay(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    started = _start(api, args.run_id, args)
    replay_id = started["runId"]
    if args.no_wait:
        if args.json:
            emit_json(started, out)
        else:
            print(f"run {replay_id} replays {args.run_id} on {args.release}", file=out)
        return
    found = _report(api, replay_id, time.monotonic() + args.timeout)
    if found is None:
        print(f"run {replay_id} replays {args.run_id}: not ended yet", file=out)
    elif args.json:
        emit_json(found, out)
    else:
        print(render(found), file=out)


def runs_replay_batch(api: Api, args: argparse.Namespace, out: TextIO) -> None:
    """Replay the last ``--last`` completed runs of a workflow and summarise, per step, how
    many were equal and how many diverged: the test a team runs before moving ``latest``."""
    query = {"workflowId": args.workflow, "state": "Completed", "limit": args.last}
    runs = api.call("GET", "/factory/runs", params=query)["items"]
    started = [_start(api, r["runId"], args)["runId"] for r in runs]
    deadline = time.monotonic() + args.timeout
    reports = [found for r in started if (found := _report(api, r, deadline)) is not None]
    total = summary(reports)
    if args.json:
        emit_json({**total, "reports": reports}, out)
        return
    print(f"{total['runs']} replayed on {args.release}, {total['diverged']} diverged", file=out)
    for step, counts in total["steps"].items():
        print(f"  step {step}: {counts['equal']} equal, {counts['diverged']} diverged", file=out)
    for found in reports:
        verdict = "DIVERGED" if found["diverged"] else "equal"
        print(f"  {found['originalRunId']} -> {found['replayRunId']}: {verdict}", file=out)


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
    """``runs replay`` and ``runs replay-batch`` under ``runcontrol runs``."""
    p = command(group, "replay", runs_replay, "replay a finished run against a newer release")
    p.add_argument("run_id")
    _options(p)
    p.add_argument("--no-wait", action="store_true", help="print the replay's id, not its report")
    p = command(
        group,
        "replay-batch",
        runs_replay_batch,
        "replay a workflow's last completed runs against a release and summarise",
    )
    p.add_argument("--workflow", required=True)
    p.add_argument("--last", type=int, default=10, help="how many completed runs (default 10)")
    _options(p)


def _options(p: argparse.ArgumentParser) -> None:
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
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the end")
    add_retry_key(p)  # a key per original run: a batch resent starts no second replay
