"""``python -m examples.repository_assessment``: make a sample git repository, publish the
workflow, submit a run, show the patch to approve (as the reviewer), print the run's result.

Against ``make run`` (tenant and project ``demo``); the tokens are minted with ``runcontrol
token`` (the dev secret of ``make run``). Run the worker app first (README.md beside this)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from runcontrol.domain import canonical_hash

from .agents import WORKFLOW_ID, workflow
from .repository import git, make_sample

TERMINAL = ("Completed", "Failed", "Cancelled")


def cli(*args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "runcontrol.cli", *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def token(tenant: str, project: str, subject: str, roles: str) -> str:
    who = ("--tenant", tenant, "--project", project, "--sub", subject)
    return cli("token", *who, "--roles", roles)


def clients(url: str, tenant: str, project: str) -> tuple[httpx.Client, httpx.Client]:
    """HTTP clients of the requester (alice) and the reviewer (bob, a second identity)."""
    auth = lambda t: {"Authorization": f"Bearer {t}"}  # noqa: E731
    requester = httpx.Client(
        base_url=url, headers=auth(token(tenant, project, "alice", "Requester"))
    )
    reviewer = httpx.Client(base_url=url, headers=auth(token(tenant, project, "bob", "Reviewer")))
    return requester, reviewer


def publish(tenant: str, definition: dict[str, Any] | None = None) -> str:
    """Publish ``definition`` (default: this example's workflow) for ``tenant``."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as fh:
        json.dump(definition or workflow(), fh)
    return str(json.loads(cli("release", fh.name, "--tenant", tenant))["releaseId"])


def submit_run(requester: httpx.Client, workflow_id: str, input: dict[str, Any]) -> str:
    body = {
        "workflowId": workflow_id,
        "releaseAlias": "latest",
        "modelProfileId": "code-agent",
        "input": input,
        "limits": {"maxCostUsd": 1, "maxMinutes": 30},
    }
    key = {"Idempotency-Key": f"{workflow_id}-{uuid.uuid4().hex}"}
    answer = requester.post("/factory/runs", json=body, headers=key)
    answer.raise_for_status()
    return str(answer.json()["runId"])


def submit(requester: httpx.Client, repository: str, revision: str) -> str:
    return submit_run(requester, WORKFLOW_ID, {"repository": repository, "revision": revision})


def follow(
    requester: httpx.Client,
    reviewer: httpx.Client,
    run_id: str,
    approve: Callable[[dict[str, Any], dict[str, Any] | None], bool],
    *,
    timeout_s: float = 300.0,
    say: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Until the run ends: each approval it asks for is decided by ``approve(approval,
    proposal)``, ``proposal`` the one ``apply`` showed in its progress (None if not seen)."""
    decided: set[str] = set()
    proposal: dict[str, Any] | None = None
    seen = 0
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        run: dict[str, Any] = requester.get(f"/factory/runs/{run_id}").json()
        for event in requester.get(
            f"/factory/runs/{run_id}/events/history", params={"after": seen}
        ).json():
            seen = event["seq"]
            if event["type"] == "ProgressReported":
                say(f"  {event['payload'].get('text')}")
                proposal = (event["payload"].get("payload") or {}).get("proposal", proposal)
        if run["state"] in TERMINAL:
            return run
        for approval in run["pendingApprovals"]:
            if approval["approvalId"] in decided:
                continue
            decided.add(approval["approvalId"])
            ok = approve(approval, proposal)
            answer = reviewer.post(
                f"/factory/approvals/{approval['approvalId']}/decision",
                json={
                    "decision": "approve" if ok else "reject",
                    "version": approval["version"],
                    "proposalHash": approval["proposalHash"],
                    "reason": "reviewed the patch" if ok else "rejected the patch",
                },
            )
            answer.raise_for_status()
        time.sleep(0.5)
    raise TimeoutError(f"run {run_id} did not end within {timeout_s:.0f} s")


def arguments(example: str, approved: str) -> argparse.ArgumentParser:
    """The examples' command line: where ``make run`` serves, the tenant and project, and
    ``--yes`` to approve the ``approved`` without asking."""
    parser = argparse.ArgumentParser(prog=f"python -m examples.{example}")
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--tenant", default="demo")
    parser.add_argument("--project", default="demo")
    parser.add_argument("--yes", action="store_true", help=f"approve the {approved} without asking")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = arguments("repository_assessment", "patch")
    parser.add_argument("--repo", default=None, help="where to make the sample repository")
    args = parser.parse_args(argv)

    where = Path(args.repo or tempfile.mkdtemp(prefix="assessment-")).resolve()
    revision = make_sample(where)
    print(f"sample repository {where} at {revision[:7]}")
    print(f"published release {publish(args.tenant)} of {WORKFLOW_ID}")
    requester, reviewer = clients(args.url, args.tenant, args.project)
    run_id = submit(requester, str(where), revision)
    print(f"run {run_id} submitted")

    def approve(approval: dict[str, Any], proposal: dict[str, Any] | None) -> bool:
        print(f"\nstep apply asks to commit on {proposal and proposal['branch']}:\n")
        print(proposal["patch"] if proposal else "(the proposal was not shown)")
        if proposal is None or canonical_hash(proposal) != approval["proposalHash"]:
            print("the patch shown is not the one whose hash is to be approved: rejecting")
            return False
        print(f"its hash {approval['proposalHash']} is the approval's")
        if args.yes:
            return True
        return input("approve? [y/N] ").strip().lower() in ("y", "yes")

    run = follow(requester, reviewer, run_id, approve)
    print(f"\nrun {run['state']}; result ({run['resultBytes']} bytes, {run['resultHash']}):")
    print(json.dumps(run["result"], indent=2))
    if run["state"] == "Completed":
        branch = run["result"]["branch"]
        print(git(where, "log", "--oneline", "-1", branch))
    return 0 if run["state"] == "Completed" else 1


if __name__ == "__main__":
    sys.exit(main())
