"""The echo agents of ``make run``, as an app of the SDK: each streams a line, proposes and
returns a digest of its input, doing no work (``runcontrol worker`` runs this app when given no
``--app``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterable
from typing import Any

from ..domain import canonical_hash
from ._step import Step
from ._worker import Worker

DEMO_AGENTS = ("planner", "applier", "reporter")


def echo_agent(name: str, seconds: float) -> Callable[[Step], Coroutine[Any, Any, dict[str, Any]]]:
    async def echo(step: Step) -> dict[str, Any]:
        digest = canonical_hash(step.input or {})
        await step.stream(f"{name}: attempt {step.attempt} of step {step.step_id}\n")
        if step.needs_approval:
            # a journaled call, as a model-written proposal would be: the re-entry after the
            # approval gets the stored one back (docs/workers.md)
            proposal = await step.run("proposal", _proposal, name, digest)
            await step.approval(proposal)
        if seconds:
            await asyncio.sleep(seconds)
        return {"agent": name, "inputHash": digest}

    return echo


def _proposal(agent: str, digest: str) -> dict[str, Any]:
    return {"agent": agent, "action": "apply", "inputHash": digest}


def echo_worker(
    agents: Iterable[str] = DEMO_AGENTS, seconds: float = 0.5, **options: Any
) -> Worker:
    """A worker whose agents ``agents`` each echo after ``seconds``."""
    worker = Worker("echo", **options)
    for agent_id in agents:
        worker.agent(agent_id)(echo_agent(agent_id, seconds))
    return worker


worker = echo_worker()
