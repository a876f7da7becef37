"""The reference runtime worker: claim, renew while working, ask for approval, report once.

Executors are pluggable by ``agentId``. An executor may offer ``propose(input)`` (what it is
about to do, hashed into the approval's ``proposalHash``) and must offer ``execute(input)``.
Raise ``TransientError`` for a failure worth retrying; any other exception is permanent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from .client import Claim, RunControlClient
from .domain import (
    ApprovalState,
    AttemptOutcome,
    FailureClass,
    SideEffectClass,
    canonical_hash,
    errors,
)

log = logging.getLogger(__name__)


class TransientError(Exception):
    """An executor failure that a retry may fix."""


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


class ReferenceWorker:
    def __init__(
        self,
        client: RunControlClient,
        holder: str,
        executors: Mapping[str, Executor],
        *,
        renew_every_s: float = 30.0,
        claim_timeout_s: float = 20.0,
    ) -> None:
        self.client = client
        self.holder = holder
        self.executors = dict(executors)
        self.renew_every_s = renew_every_s
        self.claim_timeout_s = claim_timeout_s
        self.completed = 0
        self._stop = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    async def run(self) -> None:
        """Claim and work until stopped (drains: the current attempt finishes first)."""
        stopping = asyncio.create_task(self._stop.wait())
        try:
            while not self._stop.is_set():
                polling = asyncio.create_task(
                    self.client.claim(list(self.executors), self.holder, self.claim_timeout_s)
                )
                await asyncio.wait({polling, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not polling.done():
                    # Stopping while idle. Should the host grant a lease regardless, it expires
                    # and the reconciler re-dispatches the attempt.
                    polling.cancel()
                    break
                try:
                    claim = polling.result()
                except errors.Unavailable:
                    await asyncio.sleep(1.0)
                    continue
                if claim is not None:
                    await self.work(claim)
        finally:
            stopping.cancel()

    async def work(self, claim: Claim) -> None:
        grant = claim.grant
        executor = self.executors[grant.agent_id]
        renewer = asyncio.create_task(self._renew(claim))
        try:
            if grant.cancel_requested:
                await self._report(claim, AttemptOutcome.CANCELLED)
                return
            if grant.gate == "approval" or grant.side_effect_class.at_least(
                SideEffectClass.LOCAL_WRITE
            ):
                if not await self._approved(claim, executor):
                    return
            try:
                result = await executor.execute(claim.input)
            except TransientError as exc:
                log.info("attempt %s failed transiently: %s", grant.attempt_id, exc)
                await self._report(claim, AttemptOutcome.FAILED, FailureClass.TRANSIENT)
                return
            except Exception:
                log.exception("attempt %s failed", grant.attempt_id)
                await self._report(claim, AttemptOutcome.FAILED, FailureClass.PERMANENT)
                return
            await self._report(claim, AttemptOutcome.SUCCEEDED, outcome_hash=canonical_hash(result))
            self.completed += 1
        except errors.LeaseRejected as exc:
            log.warning("lease on attempt %s lost: %s", grant.attempt_id, exc)
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer

    async def _approved(self, claim: Claim, executor: Executor) -> bool:
        """Ask for approval of the exact proposal; wait for the decision; re-propose on Stale."""
        while True:
            proposal = await executor.propose(claim.input)
            approval = await self.client.request_approval(claim, canonical_hash(proposal))
            if approval is None or approval.state is ApprovalState.APPROVED:
                return True
            state = await self._decision(claim, str(approval.approval_id))
            if state == ApprovalState.APPROVED:
                return True
            if state != ApprovalState.STALE:
                return False  # rejected, expired or cancelled: the run settles the attempt

    async def _decision(self, claim: Claim, approval_id: str) -> str:
        async for event in self.client.watch(claim.tenant_id, claim.run_id, 0):
            payload = event["payload"]
            if event["type"] == "ApprovalDecided" and payload.get("approvalId") == approval_id:
                return str(payload["state"])
        return "Cancelled"

    async def _renew(self, claim: Claim) -> None:
        while True:
            await asyncio.sleep(self.renew_every_s)
            try:
                await self.client.renew(claim)
            except errors.RunControlError as exc:
                log.warning("renewal of attempt %s refused: %s", claim.attempt_id, exc)
                return

    async def _report(
        self,
        claim: Claim,
        outcome: AttemptOutcome,
        failure_class: FailureClass | None = None,
        outcome_hash: str | None = None,
    ) -> None:
        await self.client.report_outcome(
            claim, outcome, failure_class=failure_class, outcome_hash=outcome_hash
        )
