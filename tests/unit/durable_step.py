"""A step kept in memory, with the journal semantics of ``step.run`` (the first execution's
value, or final error, is stored; a later execution of the step gets it back without calling
the function; keyed by name and the n-th call of that name), approvals that park, at-most-once
tool calls storing their results, a stream and consumed units: the adapters' logic tested
without a cluster (tests/actors/test_integrations_agents.py runs them on the real one)."""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from uuid import UUID, uuid4

from runcontrol.domain import FailureClass, SideEffectClass, ToolCallStatus, canonical_hash
from runcontrol.sdk import AgentError, Approval, CallFailed
from runcontrol.sdk._step import Parked

T = TypeVar("T")


class MemoryToolCall:
    def __init__(self, step: MemoryStep, call_id: str, status: ToolCallStatus) -> None:
        self.step, self.call_id, self.status = step, call_id, status
        self.result = step.claim_results.get(call_id)

    @property
    def proceed(self) -> bool:
        return self.status is ToolCallStatus.PROCEED

    async def complete(self, result: Any) -> str:
        self.step.claims[self.call_id] = ToolCallStatus.COMPLETED
        self.step.claim_results[self.call_id] = json.loads(json.dumps(result))
        return canonical_hash(result)


class MemoryStep:
    """One step of one run; ``reenter()`` starts its next execution (after an approval, or a
    retry when ``approved`` is None)."""

    def __init__(self) -> None:
        self.step_id: UUID = uuid4()
        self.approved_proposal_hash: str | None = None
        self.cancelled = False
        self.journal: dict[tuple[str, int], Any] = {}
        self.calls_run: Counter[str] = Counter()  # fn calls per name, over all executions
        self.chunks: list[str | dict[str, Any]] = []
        self.progress_data: list[dict[str, Any] | None] = []
        self.asked: list[Any] = []  # proposals whose approval was asked for
        self.claims: dict[str, ToolCallStatus] = {}
        self.claim_results: dict[str, Any] = {}  # stored with the claim by complete()
        self.consumed: list[tuple[str, float]] = []
        self.auto_approve = False  # a policy that needs no human
        self._nth: Counter[str] = Counter()

    def reenter(self, approved: str | None = None) -> None:
        self._nth.clear()
        self.approved_proposal_hash = approved

    async def run(self, name: str, fn: Callable[..., Awaitable[T]], /, *args: Any) -> T:
        self._nth[name] += 1
        key = (name, self._nth[name])
        if key in self.journal:
            stored = json.loads(self.journal[key])
            if "error" in stored:
                raise CallFailed(name, key[1], stored["error"])
            return stored["value"]
        try:
            value = await fn(*args)
        except AgentError as exc:
            if exc.failure_class is FailureClass.TRANSIENT:
                raise  # not recorded: the next execution calls fn again
            error = {"type": type(exc).__name__, "message": str(exc)}
            error["failure_class"] = str(exc.failure_class)
            self.journal[key] = json.dumps({"error": error})  # a final error is kept
            raise CallFailed(name, key[1], error) from exc
        self.calls_run[name] += 1
        self.journal[key] = json.dumps({"value": value})  # stored as JSON, as the server does
        return json.loads(self.journal[key])["value"]

    async def stream(self, chunk: str | dict[str, Any]) -> None:
        self.chunks.append(chunk)

    async def progress(self, text: str | None = None, data: dict[str, Any] | None = None) -> None:
        self.progress_data.append(data)

    async def approval(
        self, proposal: Any, *, action_class: SideEffectClass | None = None
    ) -> Approval:
        proposal_hash = canonical_hash(proposal)
        if self.auto_approve or self.approved_proposal_hash == proposal_hash:
            return Approval(proposal_hash)
        self.asked.append(proposal)
        raise Parked(proposal_hash)

    async def tool_call(self, call_id: str, request: Any) -> MemoryToolCall:
        if call_id in self.claims:
            return MemoryToolCall(self, call_id, self.claims[call_id])
        self.claims[call_id] = ToolCallStatus.IN_PROGRESS
        return MemoryToolCall(self, call_id, ToolCallStatus.PROCEED)

    async def consume(self, name: str, units: float) -> None:
        self.consumed.append((name, units))
