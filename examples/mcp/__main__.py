"""``python -m examples.mcp``: publish the workflow, submit a run asking to copy the notes
server's ``welcome`` note to a file, show the MCP call the agent asks to make (as the
reviewer), print the run's result and the file.

Against ``make run`` (tenant and project ``demo``), with the notes server and the worker app
running (README.md beside this)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from examples.repository_assessment.__main__ import (
    arguments,
    clients,
    follow,
    publish,
    submit_run,
)
from runcontrol.domain import canonical_hash

from .agents import WORKFLOW_ID, workflow


def main(argv: list[str] | None = None) -> int:
    args = arguments("mcp", "call").parse_args(argv)

    target = Path(tempfile.mkdtemp(prefix="mcp-notes-")) / "welcome.txt"
    print(f"published release {publish(args.tenant, workflow())} of {WORKFLOW_ID}")
    requester, reviewer = clients(args.url, args.tenant, args.project)
    run_id = submit_run(requester, WORKFLOW_ID, {"path": str(target)})
    print(f"run {run_id} submitted")

    def approve(approval: dict[str, Any], proposal: dict[str, Any] | None) -> bool:
        if proposal is None or canonical_hash(proposal) != approval["proposalHash"]:
            print("the proposal shown is not the one whose hash is to be approved: rejecting")
            return False
        print(f"\nthe agent asks MCP server {proposal['server']} to call {proposal['tool']}:")
        print(json.dumps(proposal["arguments"], indent=2))
        print(f"its hash {approval['proposalHash']} is the approval's")
        return args.yes or input("approve? [y/N] ").strip().lower() in ("y", "yes")

    run = follow(requester, reviewer, run_id, approve)
    print(f"\nrun {run['state']}; result:\n{json.dumps(run['result'], indent=2)}")
    if target.exists():
        print(f"{target}: {target.read_text()}")
    return 0 if run["state"] == "Completed" else 1


if __name__ == "__main__":
    sys.exit(main())
