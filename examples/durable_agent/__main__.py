"""``python -m examples.durable_agent``: make a sample repository, publish the workflow,
submit a run, show the change the agent proposes (as the reviewer), print the run's result,
the change made in the scratch copy, and the model requests made.

Against ``make run`` (tenant and project ``demo``), with the worker app running
(README.md beside this)."""

from __future__ import annotations

import difflib
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
from examples.repository_assessment.repository import make_sample
from runcontrol.domain import canonical_hash

from .agents import WORKFLOW_ID, requests_of, workflow


def show_change(repository: Path, scratch: Path) -> None:
    for changed in sorted(p for p in scratch.rglob("*") if p.is_file()):
        path = changed.relative_to(scratch)
        before = (repository / path).read_text().splitlines(True)
        after = changed.read_text().splitlines(True)
        sys.stdout.writelines(difflib.unified_diff(before, after, f"a/{path}", f"b/{path}"))


def main(argv: list[str] | None = None) -> int:
    args = arguments("durable_agent", "change").parse_args(argv)

    where = Path(tempfile.mkdtemp(prefix="durable-agent-"))
    repository, scratch = where / "repository", where / "scratch"
    make_sample(repository)
    print(f"sample repository {repository}; the change goes to {scratch}")
    print(f"published release {publish(args.tenant, workflow())} of {WORKFLOW_ID}")
    requester, reviewer = clients(args.url, args.tenant, args.project)
    run_id = submit_run(
        requester, WORKFLOW_ID, {"repository": str(repository), "scratch": str(scratch)}
    )
    print(f"run {run_id} submitted")

    def approve(approval: dict[str, Any], proposal: dict[str, Any] | None) -> bool:
        if proposal is None or canonical_hash(proposal) != approval["proposalHash"]:
            print("the proposal shown is not the one whose hash is to be approved: rejecting")
            return False
        arguments = proposal["arguments"]
        print(f"\nthe agent asks to call {proposal['tool']} on {arguments['path']}:")
        print(f"  {arguments['summary']}\n")
        print(arguments["content"])
        print(f"its hash {approval['proposalHash']} is the approval's")
        return args.yes or input("approve? [y/N] ").strip().lower() in ("y", "yes")

    run = follow(requester, reviewer, run_id, approve)
    print(f"\nrun {run['state']}; result:\n{json.dumps(run['result'], indent=2)}")
    if scratch.exists():
        show_change(repository, scratch)
    turns = [entry["turn"] for entry in requests_of(run_id)]
    print(f"model requests made by the scripted model: {len(turns)}, turns {turns}")
    return 0 if run["state"] == "Completed" else 1


if __name__ == "__main__":
    sys.exit(main())
