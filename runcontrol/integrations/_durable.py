"""What both adapters do with a step: journaled calls under stable names, the approval of
exactly one tool call, an at-most-once side effect, token usage, the cancel check.

Written against ``DurableStep``, the part of ``runcontrol.sdk.Step`` an adapter uses, so the
adapters' logic is tested without a cluster too (tests/unit/durable_step.py).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol, TypeVar
from uuid import UUID

from ..domain import SideEffectClass, ToolCallStatus, canonical_hash
from ..sdk import Approval, AsyncToolCall, Permanent, ReplayDiverged, Transient, Uncertain

T = TypeVar("T")

# A journaled call's name, at most: the server takes 200 characters (for a call's name and a
# tool call's id alike), and a side effect's tool call id is the step's id (37) plus the name.
MAX_NAME = 160


def bounded(name: str) -> str:
    """``name``, or its head and a hash of it when it is too long (a model's call ids and a
    tool's name are the model's and the author's to choose)."""
    if len(name) <= MAX_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:16]
    return f"{name[: MAX_NAME - 17]}#{digest}"


class DurableStep(Protocol):
    """The step verbs an adapter calls (``runcontrol.sdk.Step`` has them all)."""

    @property
    def step_id(self) -> UUID: ...

    @property
    def approved_proposal_hash(self) -> str | None: ...

    @property
    def cancelled(self) -> bool: ...

    async def run(self, name: str, fn: Callable[..., Awaitable[T]], /, *args: Any) -> T: ...

    async def stream(self, chunk: str | dict[str, Any]) -> None: ...

    async def progress(
        self, text: str | None = None, data: dict[str, Any] | None = None
    ) -> None: ...

    async def approval(
        self, proposal: Any, *, action_class: SideEffectClass | None = None
    ) -> Approval: ...

    async def tool_call(self, call_id: str, request: Any) -> AsyncToolCall: ...

    async def consume(self, name: str, units: float) -> Any: ...


def _ignoring(fn: Callable[[], Awaitable[T]]) -> Callable[[Any], Awaitable[T]]:
    """``fn`` as a journaled call taking its request as an argument (hashed, not used)."""

    async def call(_request: Any) -> T:
        return await fn()

    return call


def tool_proposal(tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """What a reviewer approves for a tool call: the tool's name and its arguments, nothing
    the model worded around them (so its hash is the call's, whoever asks)."""
    return {"tool": tool, "arguments": arguments}


@dataclass(eq=False)
class AgentCalls:
    """The journaled calls of one agent run inside a step.

    Names are ``{agent}:model`` (the n-th model request is the n-th call of that name) and
    ``{agent}:tool:{tool}:{call id}``: tools may run concurrently, so a tool call is named by the
    model's id of the call (journaled with the response that made it), not by its turn."""

    step: DurableStep
    agent: str
    _: KW_ONLY
    token_limit: str | None = None
    stream_text: bool = True
    action_class: SideEffectClass | None = None
    _named: Counter[str] = field(default_factory=Counter, init=False, repr=False)

    def check_cancelled(self) -> None:
        """A cancelled run stops before its next model request or tool call."""
        if self.step.cancelled:
            raise asyncio.CancelledError(f"the run of agent {self.agent} was cancelled")

    async def model_request(
        self,
        send: Callable[[], Awaitable[Any]],
        transient: tuple[type[Exception], ...] = (),
        request: Any = None,
    ) -> Any:
        """``send()`` (a model request; it returns its JSON form) once per run of the step.
        An error of the ``transient`` kinds (the provider's rate limits, timeouts, outages,
        once the framework's own retries gave up) is raised as ``Transient``: the step is
        retried under its policy, and the requests before it are replayed. ``request``: the
        request's JSON form (the messages sent), the call's argument: a replay answers it
        from the original only when it is the same (docs/replay.md)."""
        self.check_cancelled()

        async def once(_request: Any) -> Any:
            try:
                return await send()
            except transient as exc:
                raise Transient(f"the model request failed: {exc!r}") from exc

        return await self.step.run(bounded(f"{self.agent}:model"), once, request)

    async def consumed(self, tokens: int) -> None:
        """Report ``tokens`` against the release's limit ``token_limit`` (inside the journaled
        request: a replayed request is not counted again)."""
        if self.token_limit is not None and tokens > 0:
            await self.step.consume(self.token_limit, float(tokens))

    async def text(self, chunk: str) -> None:
        if self.stream_text and chunk:
            await self.step.stream(chunk)

    def _tool_name(self, tool: str, call_id: str) -> str:
        name = f"{self.agent}:tool:{tool}:{call_id}"
        self._named[name] += 1  # a model reusing an id gets its own key per use
        n = self._named[name]
        return bounded(name if n == 1 else f"{name}#{n}")

    async def tool(
        self,
        tool: str,
        call_id: str,
        arguments: dict[str, Any],
        call: Callable[[], Awaitable[Any]],
        *,
        side_effect: bool = False,
        proposal: dict[str, Any] | None = None,
        ready: Callable[[], Awaitable[None]] | None = None,
    ) -> Any:
        """``call()`` (the tool; it returns its JSON form), journaled; a ``side_effect`` is
        also claimed with ``step.tool_call`` first (at most once per run): an execution that
        finds it completed gets the result stored with the claim, one that finds it claimed
        and unfinished (a worker died during it) raises ``Uncertain``, stored as the call's
        final error: the step settles ``Uncertain`` for an operator to resolve. ``proposal``:
        the claim's request (default: ``tool_proposal``); ``ready()``, awaited before the
        claim, fails while nothing is claimed (a connection to open)."""
        self.check_cancelled()
        name = self._tool_name(tool, call_id)
        if not side_effect:
            return await self.step.run(name, _ignoring(call), arguments)

        async def once(_arguments: Any) -> Any:
            request = proposal or tool_proposal(tool, arguments)
            if ready is not None:
                await ready()
            claim = await self.step.tool_call(f"{self.step.step_id}:{name}", request)
            if claim.status is ToolCallStatus.COMPLETED and claim.result is not None:
                return claim.result  # it ran, and its result was stored with the claim
            if not claim.proceed:  # it may be running or have run: never run it again
                raise Uncertain(
                    f"tool {tool} (call {call_id}) was claimed by an earlier execution "
                    f"({claim.status.value}) and its result is not in hand"
                )
            result = await call()
            await claim.complete(result)
            return result

        return await self.step.run(name, once, arguments)

    async def approve(
        self,
        tool: str,
        call_id: str,
        arguments: dict[str, Any],
        *,
        proposal: dict[str, Any] | None = None,
    ) -> None:
        """Ask for approval of exactly this tool call (its name and arguments); returns when
        it is approved, parks the attempt otherwise (``step.approval``). The decision is
        journaled, so a step with several approvals does not ask for the earlier ones again.
        ``proposal``: what is shown and approved (default: ``tool_proposal``)."""
        proposal = proposal or tool_proposal(tool, arguments)
        proposal_hash = canonical_hash(proposal)

        async def ask() -> dict[str, Any]:
            if self.step.approved_proposal_hash != proposal_hash:  # not yet shown and approved
                await self.step.progress(f"approval asked for {tool}", {"proposal": proposal})
            approval = await self.step.approval(proposal, action_class=self.action_class)
            approval_id = approval.approval_id
            return {
                "proposalHash": approval.proposal_hash,
                "approvalId": None if approval_id is None else str(approval_id),
            }

        name = bounded(f"{self.agent}:approval:{tool}:{call_id}")
        try:
            decided = await self.step.run(name, _ignoring(ask), proposal)
        except ReplayDiverged:
            # A replay whose original never decided this proposal: asked of Run Control,
            # which parks it for a human (or fails it, by the replay's option).
            decided = await ask()
        if decided["proposalHash"] != proposal_hash:  # fail closed: never run an unapproved call
            raise Permanent(
                f"the journaled approval of {tool} (call {call_id}) is of another proposal"
            )
