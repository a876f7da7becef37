"""The tests' reference worker: ``Executor`` objects (``propose`` / ``execute``) run by the
worker SDK (importable because tests/ holds the root conftest; not part of the product).

``ReferenceWorker`` keeps the constructor the tests and the chaos suite build
(a transport, a holder, executors by agent id) and runs them as SDK agents
(``runcontrol.sdk``): one worker loop in the codebase. An executor's step asks for approval
first when its step needs it (an approval gate, or a side effect of local-write or more),
with ``propose(input)`` as the proposal; then ``execute(input)``. Raise ``TransientError``
for a failure worth retrying; any other exception is permanent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from runcontrol.clock import Clock
from runcontrol.domain import WorkerIdentity, canonical_hash
from runcontrol.sdk import Backoff, Step, Transient, Worker
from runcontrol.sdk._worker import slot_holders
from runcontrol.workers.protocol import SessionTransport

# What an executor raises for a failure a retry may fix (the SDK's ``Transient``).
TransientError = Transient


class Executor(Protocol):
    async def propose(self, input: dict[str, Any] | None) -> dict[str, Any]: ...

    async def execute(self, input: dict[str, Any] | None) -> dict[str, Any]: ...


class EchoExecutor:
    """Does no work: proposes and returns a digest of its input (the demo's agents)."""

    def __init__(self, name: str, seconds: float = 0.5) -> None:
        self.name = name
        self.seconds = seconds

    async def propose(self, input: dict[str, Any] | None) -> dict[str, Any]:
        return {"agent": self.name, "action": "apply", "inputHash": canonical_hash(input or {})}

    async def execute(self, input: dict[str, Any] | None) -> dict[str, Any]:
        await asyncio.sleep(self.seconds)
        return {"agent": self.name, "inputHash": canonical_hash(input or {})}


def executor_agent(executor: Executor) -> Callable[[Step], Awaitable[dict[str, Any]]]:
    """An executor as an SDK agent function."""

    async def agent(step: Step) -> dict[str, Any]:
        if step.needs_approval:
            await step.approval(await executor.propose(step.input))
        return await executor.execute(step.input)

    return agent


class ReferenceWorker:
    def __init__(
        self,
        client: SessionTransport,
        holder: str | WorkerIdentity,
        executors: Mapping[str, Executor],
        *,
        renew_every_s: float = 30.0,
        claim_timeout_s: float = 20.0,
        lease_grace_s: float = 35.0,
        backoff: Backoff | None = None,
        restart_backoff: Backoff | None = None,
        clock: Clock | None = None,
        concurrency: int = 8,
        stop_timeout_s: float = 10.0,
    ) -> None:
        self.client = client
        self.identity = holder
        self.holder = holder.holder if isinstance(holder, WorkerIdentity) else holder
        self.executors = dict(executors)
        self.concurrency = concurrency
        self.worker = Worker(
            self.holder,
            concurrency=concurrency,
            wait_s=claim_timeout_s,
            renew_every_s=renew_every_s,
            lease_grace_s=lease_grace_s,
            stop_timeout_s=stop_timeout_s,
            backoff=backoff,
            restart_backoff=restart_backoff,
            clock=clock,
        )
        for agent_id, executor in self.executors.items():
            self.worker.agent(agent_id)(executor_agent(executor))

    @property
    def completed(self) -> int:
        return self.worker.completed

    def slot_holder(self, k: int) -> str:
        return slot_holders(self.identity, self.concurrency)[k]

    def stop(self) -> None:
        self.worker.stop()

    async def run(self) -> None:
        await self.worker.run(self.client, self.identity)

    async def run_supervised(self) -> None:
        await self.worker.run_supervised(self.client, self.identity)
