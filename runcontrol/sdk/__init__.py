"""The worker SDK: write an agent function, decorate it, run a worker.

    from runcontrol.sdk import Step, Transient, Worker

    worker = Worker("reviewer")

    @worker.agent("planner")
    async def plan(step: Step) -> dict[str, object]:
        await step.progress("listing files")
        return {"files": list_files(step.input["repository"])}

Run it with ``runcontrol worker --app mypackage.agents:worker`` (docs/workers.md).
"""

from __future__ import annotations

from ._app import AppNotFound, load_app
from ._backoff import Backoff
from ._errors import AgentError, CallFailed, Permanent, ReplayDiverged, Transient, Uncertain
from ._identity import token_identity
from ._step import Approval, AsyncToolCall, LeaseGone, Step, SyncStep, SyncToolCall, ToolCall
from ._worker import Agent, Worker

__all__ = [
    "Agent",
    "AgentError",
    "AppNotFound",
    "Approval",
    "AsyncToolCall",
    "Backoff",
    "CallFailed",
    "LeaseGone",
    "Permanent",
    "ReplayDiverged",
    "Step",
    "SyncStep",
    "SyncToolCall",
    "ToolCall",
    "Transient",
    "Uncertain",
    "Worker",
    "load_app",
    "token_identity",
]
