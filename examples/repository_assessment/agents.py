"""The worker app of ``repository-assessment``: four agents, each a function of the worker SDK
whose return value is its step's result (the next step receives it in ``step.results``).

    runcontrol worker --app examples.repository_assessment.agents:worker --tenant demo

``REPOSITORY_ASSESSMENT_PAUSE_S`` (default 0) makes ``analyse`` pause that long per file, to
watch its progress or cancel it mid-way.
"""

from __future__ import annotations

import asyncio
import difflib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runcontrol.domain import canonical_hash
from runcontrol.sdk import Permanent, Step, Worker

from . import repository as repo

WORKFLOW_ID = "repository-assessment"
AGENTS = {
    "plan": "assessment-planner",
    "analyse": "assessment-analyser",
    "apply": "assessment-applier",
    "report": "assessment-reporter",
}
REPORT_FILE = "ASSESSMENT.md"


def workflow(agent: Callable[[str], str] = lambda name: name) -> dict[str, Any]:
    """The workflow definition (``runcontrol release``'s JSON); ``agent`` renames agent ids."""
    return {
        "workflowId": WORKFLOW_ID,
        "steps": [
            {"name": "plan", "agentId": agent(AGENTS["plan"])},
            {"name": "analyse", "agentId": agent(AGENTS["analyse"])},
            {
                "name": "apply",
                "agentId": agent(AGENTS["apply"]),
                "gate": "approval",
                "sideEffectClass": "shared-write",
            },
            {"name": "report", "agentId": agent(AGENTS["report"])},
        ],
    }


def _where(step: Step) -> tuple[str, str]:
    data = step.input or {}
    repository, revision = data.get("repository"), data.get("revision")
    if not isinstance(repository, str) or not isinstance(revision, str):
        raise Permanent("input needs {repository, revision} (a local git repository)")
    if not (Path(repository) / ".git").exists():
        raise Permanent(f"{repository} is not a local git repository")
    return repository, revision


async def plan(step: Step) -> dict[str, Any]:
    """The files at the revision."""
    repository, revision = _where(step)
    files = await asyncio.to_thread(repo.files_at, repository, revision)
    await step.progress(f"{len(files)} files at {revision[:7]}")
    return {"repository": repository, "revision": revision, "files": files}


async def _ruff(repository: str, path: str, text: str) -> list[dict[str, Any]]:
    """ruff's findings on one file's content (read from stdin: the revision, not the tree), run
    in the repository (its own ruff configuration, if any, applies; not the worker's)."""
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    proc = await asyncio.create_subprocess_exec(
        ruff, "check", "--no-cache", "--output-format", "json", "--stdin-filename", path, "-",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=repository,
    )  # fmt: skip
    try:
        out, _ = await proc.communicate(text.encode())
    except asyncio.CancelledError:  # cancelled mid-file: the tool stops with the step
        proc.kill()
        raise
    return [
        {"code": f["code"], "line": f["location"]["row"], "message": f["message"]}
        for f in json.loads(out or b"[]")
    ]


async def analyse(step: Step) -> dict[str, Any]:
    """Line counts, TODOs and ruff findings per file of the plan."""
    planned = step.results["plan"]
    repository, revision = planned["repository"], planned["revision"]
    pause = float(os.environ.get("REPOSITORY_ASSESSMENT_PAUSE_S", "0"))
    found: dict[str, Any] = {}
    for n, path in enumerate(planned["files"], 1):
        text = await asyncio.to_thread(repo.content_at, repository, revision, path)
        lines = text.splitlines()
        todos = [i for i, line in enumerate(lines, 1) if "TODO" in line]
        findings = await _ruff(repository, path, text) if path.endswith(".py") else []
        found[path] = {"lines": len(lines), "todos": todos, "ruff": findings}
        await step.progress(f"analysed {path}", {"file": n, "of": len(planned["files"])})
        if pause:
            await asyncio.sleep(pause)
    totals = {
        "files": len(found),
        "lines": sum(f["lines"] for f in found.values()),
        "todos": sum(len(f["todos"]) for f in found.values()),
        "ruff": sum(len(f["ruff"]) for f in found.values()),
    }
    return {"repository": repository, "revision": revision, "files": found, "totals": totals}


def _assessment(analysis: dict[str, Any]) -> str:
    lines = [f"# Assessment of {analysis['revision'][:7]}", "", "| file | lines | TODOs | ruff |"]
    lines.append("|---|---|---|---|")
    for path, f in sorted(analysis["files"].items()):
        codes = ", ".join(sorted({r["code"] for r in f["ruff"]})) or "-"
        lines.append(f"| {path} | {f['lines']} | {len(f['todos'])} | {codes} |")
    t = analysis["totals"]
    lines += ["", f"{t['files']} files, {t['lines']} lines, {t['todos']} TODOs, {t['ruff']} ruff"]
    return "\n".join(lines) + "\n"


def proposal_of(analysis: dict[str, Any]) -> dict[str, Any]:
    """The patch ``apply`` proposes: a function of the analysis alone, so the attempt that
    resumes after the approval proposes the same one (same hash: approved at once)."""
    text = _assessment(analysis)
    patch = "".join(
        difflib.unified_diff([], text.splitlines(True), "/dev/null", f"b/{REPORT_FILE}")
    )
    return {
        "action": "commit",
        "repository": analysis["repository"],
        "base": analysis["revision"],
        "branch": f"assessment/{analysis['revision'][:12]}",
        "files": {REPORT_FILE: text},
        "patch": patch,
    }


async def apply(step: Step) -> dict[str, Any]:
    """Propose the patch, wait for a reviewer to approve its hash, then commit it on a branch
    (claimed as a tool call first: a retried attempt never commits twice)."""
    analysis = step.results["analyse"]
    proposal = proposal_of(analysis)
    if step.approved_proposal_hash != canonical_hash(proposal):  # not yet shown and approved
        await step.progress(f"proposing a patch on {proposal['branch']}", {"proposal": proposal})
    await step.approval(proposal)  # parks here until approved; re-entered after it
    call = await step.tool_call("commit-branch", proposal)
    if call.proceed:
        commit = await asyncio.to_thread(
            repo.commit_files,
            proposal["repository"],
            proposal["base"],
            proposal["branch"],
            proposal["files"],
            "Add the repository assessment",
        )
        await call.complete({"commit": commit})
    else:  # committed by an earlier attempt: the branch says which commit
        commit = repo.branch_head(proposal["repository"], proposal["branch"]) or ""
    return {
        "branch": proposal["branch"],
        "commit": commit,
        "patchHash": canonical_hash(proposal),
        "totals": analysis["totals"],
        "revision": analysis["revision"],
    }


async def report(step: Step) -> dict[str, Any]:
    """The summary: the run's result."""
    applied = step.results["apply"]
    t = applied["totals"]
    return {
        "revision": applied["revision"],
        "branch": applied["branch"],
        "commit": applied["commit"],
        "patchHash": applied["patchHash"],
        "totals": t,
        "summary": (
            f"{t['files']} files, {t['lines']} lines, {t['todos']} TODOs, {t['ruff']} ruff "
            f"findings; the assessment is committed on {applied['branch']}"
        ),
    }


FUNCTIONS = {"plan": plan, "analyse": analyse, "apply": apply, "report": report}


def assessment_worker(agent: Callable[[str], str] = lambda name: name, **options: Any) -> Worker:
    """The app's worker; ``agent`` renames agent ids (as ``workflow`` does)."""
    options.setdefault("concurrency", 4)
    worker = Worker(WORKFLOW_ID, **options)
    for step, fn in FUNCTIONS.items():
        worker.agent(agent(AGENTS[step]))(fn)
    return worker


worker = assessment_worker()
