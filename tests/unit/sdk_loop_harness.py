"""An in-process fake of the run hosts' session side for the worker SDK's loop tests
(``test_sdk_loop.py``): ``FakeHosts`` keeps the rules of ``runcontrol.workers.protocol`` and
nothing else."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

from runcontrol.commands import (
    ClaimToolCall,
    Command,
    CompleteToolCall,
    RenewLease,
    ReportOutcome,
    ReportProgress,
    RequestApproval,
)
from runcontrol.domain import (
    ApprovalRequest,
    ApprovalState,
    LeaseGrant,
    ProgressAck,
    SideEffectClass,
    ToolCallClaim,
    ToolCallStatus,
    errors,
)
from runcontrol.sdk import Backoff, Step, Worker
from runcontrol.workers.protocol import Answer, Credit, Grant, SessionDown, SessionUp

T = TypeVar("T")
TENANT = "t-1"
DEADLINE = datetime(2031, 1, 1, tzinfo=UTC)


@dataclass
class FakeAttempt:
    agent_id: str
    host: int
    attempt_id: UUID = field(default_factory=uuid.uuid4)
    run_id: UUID = field(default_factory=uuid.uuid4)
    gate: str = "none"
    approved_hash: str | None = None
    number: int = 1


class FakeHosts:
    def __init__(self, hosts: int = 1, lease_s: float = 30.0) -> None:
        self.hosts_count = hosts
        self.lease_s = lease_s
        self.waiting: list[FakeAttempt] = []
        self.credits: dict[tuple[int, str], dict[str, Credit]] = {}
        self.unacked: dict[tuple[int, str], dict[str, Grant]] = {}
        self.granted_claims: dict[str, Grant] = {}
        self.answers: dict[str, Answer] = {}
        self.outcomes: dict[UUID, list[ReportOutcome]] = {}
        self.commands: list[Command[Any]] = []
        self.ups: list[tuple[int, SessionUp]] = []
        self.cancelled: set[UUID] = set()
        self.pushed: set[UUID] = set()
        self.approvals: dict[UUID, ApprovalRequest] = {}
        self.tool_calls: dict[str, ToolCallClaim] = {}
        self.progress: dict[UUID, int] = {}
        self.attempts: dict[UUID, FakeAttempt] = {}
        # failures injected into the next exchanges: ("before", exc) fails before anything
        # is done, ("after", exc) after (the answer is lost)
        self.faults: list[tuple[str, Exception]] = []
        self.changed = asyncio.Event()
        self.waiters: dict[tuple[int, str], asyncio.Event] = {}
        self.draining: set[int] = set()

    # ------------------------------------------------------------------ the test's side

    def dispatch(self, attempt: FakeAttempt) -> FakeAttempt:
        self.waiting.append(attempt)
        self.attempts[attempt.attempt_id] = attempt
        self._wake()
        return attempt

    def late_grant(self, host: int, claim_id: str, attempt: FakeAttempt) -> None:
        """Grant a credit the worker already withdrew from ``host`` (an older exchange that
        still carried it reached the host last)."""
        key = (host, next(u.session_id for h, u in self.ups if h == host))
        self.attempts[attempt.attempt_id] = attempt
        grant = Grant(claim_id, TENANT, self._lease(attempt, "w-1"), {"n": 1})
        self.granted_claims[claim_id] = grant
        self.unacked.setdefault(key, {})[claim_id] = grant
        self._wake()

    def cancel(self, attempt_id: UUID) -> None:
        self.cancelled.add(attempt_id)
        self._wake()

    def _wake(self) -> None:
        for event in self.waiters.values():
            event.set()

    # ------------------------------------------------------------------ SessionTransport

    async def hosts(self) -> int:
        return self.hosts_count

    async def exchange(self, host: int, up: SessionUp) -> SessionDown:
        self.ups.append((host, up))
        key = (host, up.session_id)
        previous = self.waiters.get(key)
        if previous is not None:
            previous.set()  # superseded: the waiting exchange answers at once
        if self.faults and self.faults[0][0] == "before":
            raise self.faults.pop(0)[1]
        if host in self.draining:  # takes no credit, does nothing with the commands
            self.credits[key] = {}
            refused = [
                Answer(c.command_id, False, errors.Draining("draining")) for c in up.commands
            ]
            return SessionDown(answers=refused, hosts=self.hosts_count, draining=True)
        self.credits[key] = {c.claim_id: c for c in up.credits}
        unacked = self.unacked.setdefault(key, {})
        for claim_id in up.acks:
            unacked.pop(claim_id, None)
        for credit in up.credits:
            if credit.resent and credit.claim_id in self.granted_claims:
                unacked[credit.claim_id] = self.granted_claims[credit.claim_id]
                del self.credits[key][credit.claim_id]
        answers = [self._apply(c) for c in up.commands]
        self._match(host)
        if not answers and not unacked and not self._cancels(key) and up.wait_s > 0:
            event = self.waiters[key] = asyncio.Event()
            try:
                await asyncio.wait_for(event.wait(), up.wait_s)
            except TimeoutError:
                pass
            finally:
                if self.waiters.get(key) is event:
                    del self.waiters[key]
            self._match(host)
        if self.faults and self.faults[0][0] == "after":
            raise self.faults.pop(0)[1]
        backlog: dict[str, int] = {}
        for attempt in self.waiting:
            if attempt.host == host:
                backlog[attempt.agent_id] = backlog.get(attempt.agent_id, 0) + 1
        return SessionDown(
            answers=answers,
            grants=list(self.unacked.get(key, {}).values()),
            cancels=self._cancels(key),
            backlog=backlog,
            hosts=self.hosts_count,
        )

    def _cancels(self, key: tuple[int, str]) -> list[UUID]:
        return [
            g.lease.attempt_id
            for g in self.granted_claims.values()
            if g.lease.attempt_id in self.cancelled and g.lease.attempt_id not in self.outcomes
        ]

    def _match(self, host: int) -> None:
        for key, credits in self.credits.items():
            if key[0] != host:
                continue
            for claim_id, credit in list(credits.items()):
                attempt = next(
                    (a for a in self.waiting if a.host == host and a.agent_id in credit.agent_ids),
                    None,
                )
                if attempt is None:
                    continue
                self.waiting.remove(attempt)
                del credits[claim_id]
                grant = Grant(
                    claim_id=claim_id,
                    tenant_id=TENANT,
                    lease=self._lease(attempt, credit.holder),
                    input={"n": 1},
                    results={"plan": {"files": 2}},
                    deadline_at=DEADLINE,
                )
                self.granted_claims[claim_id] = grant
                self.unacked.setdefault(key, {})[claim_id] = grant

    def _lease(self, attempt: FakeAttempt, holder: str) -> LeaseGrant:
        return LeaseGrant(
            run_id=attempt.run_id,
            step_id=uuid.uuid4(),
            attempt_id=attempt.attempt_id,
            lease_id=uuid.uuid4(),
            fencing_token=attempt.number,
            holder=holder,
            expires_at=datetime.now(UTC) + timedelta(seconds=self.lease_s),
            agent_id=attempt.agent_id,
            skill_id=None,
            attempt_number=attempt.number,
            side_effect_class=SideEffectClass.READ,
            gate=attempt.gate,
            cancel_requested=attempt.attempt_id in self.cancelled,
            approved_proposal_hash=attempt.approved_hash,
        )

    def _apply(self, command: Command[Any]) -> Answer:
        self.commands.append(command)
        stored = self.answers.get(command.command_id)
        if stored is not None:
            return stored
        try:
            value = self._effect(command)
        except errors.RunControlError as exc:
            return Answer(command.command_id, False, exc)
        answer = self.answers[command.command_id] = Answer(command.command_id, True, value)
        return answer

    def _effect(self, command: Command[Any]) -> Any:
        if isinstance(command, ReportOutcome):
            if self.outcomes.get(command.attempt_id):
                raise errors.OutcomeAlreadyRecorded("a second outcome")
            self.outcomes[command.attempt_id] = [command]
            return None
        if isinstance(command, RenewLease):
            attempt = self.attempts[command.attempt_id]
            return replace(
                self._lease(attempt, command.holder), fencing_token=command.fencing_token
            )
        if isinstance(command, RequestApproval):
            attempt = self.attempts[command.attempt_id]
            if attempt.gate != "approval":
                return None
            approval = ApprovalRequest(
                approval_id=uuid.uuid4(),
                run_id=attempt.run_id,
                step_id=uuid.uuid4(),
                attempt_id=attempt.attempt_id,
                tenant_id=TENANT,
                action_class=SideEffectClass.SHARED_WRITE,
                proposal_hash=command.proposal_hash,
                policy_revision="r1",
                approver_rule="any-reviewer",
                required_approvals=1,
                requested_by="alice",
                created_at=datetime.now(UTC),
                expires_at=datetime.now(UTC) + timedelta(hours=1),
                state=ApprovalState.PENDING,
            )
            self.approvals[attempt.attempt_id] = approval
            return approval
        if isinstance(command, ReportProgress):
            last = self.progress.get(command.attempt_id, 0)
            stored = sum(1 for m in command.messages if m.seq > last)
            self.progress[command.attempt_id] = max(last, *(m.seq for m in command.messages))
            return ProgressAck(
                command.attempt_id,
                self.progress[command.attempt_id],
                stored,
                len(command.messages) - stored,
            )
        if isinstance(command, ClaimToolCall):
            known = self.tool_calls.get(command.call_id)
            if known is not None:
                return known
            claim = ToolCallClaim(uuid.uuid4(), command.call_id, ToolCallStatus.PROCEED)
            self.tool_calls[command.call_id] = replace(claim, status=ToolCallStatus.IN_PROGRESS)
            return claim
        if isinstance(command, CompleteToolCall):
            known = self.tool_calls[command.call_id]
            done = replace(known, status=ToolCallStatus.COMPLETED, result_hash=command.result_hash)
            self.tool_calls[command.call_id] = done
            return done
        raise AssertionError(command)

    def outcome(self, attempt: FakeAttempt) -> ReportOutcome:
        (report,) = self.outcomes[attempt.attempt_id]
        return report


def fast(**kw: Any) -> Worker:
    kw.setdefault("wait_s", 0.2)
    kw.setdefault("probe_s", 0.05)
    kw.setdefault("stop_timeout_s", 0.5)
    kw.setdefault("backoff", Backoff(base_s=0.01, cap_s=0.05))
    return Worker("test", **kw)


async def until(check: Callable[[], bool], what: str, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


def scenario(
    worker: Worker,
    hosts: FakeHosts,
    body: Callable[[], Awaitable[None]],
    holder: str = "w-1",
) -> None:
    async def main() -> None:
        task = asyncio.create_task(worker.run(hosts, holder))
        try:
            async with asyncio.timeout(15):
                await body()
        finally:
            worker.stop()
            await asyncio.wait_for(task, 10)

    asyncio.run(main())


def noop_worker(**kw: Any) -> Worker:
    """A one-slot worker whose agent ``a`` does nothing."""
    kw.setdefault("concurrency", 1)
    worker = fast(**kw)

    @worker.agent("a")
    async def noop(step: Step) -> None:
        return None

    return worker


def run_one(worker: Worker, hosts: FakeHosts, attempt: FakeAttempt) -> ReportOutcome:
    """Dispatch ``attempt``, run the worker until it reports, and answer its report."""

    async def body() -> None:
        hosts.dispatch(attempt)
        await until(lambda: attempt.attempt_id in hosts.outcomes, "the outcome")

    scenario(worker, hosts, body)
    return hosts.outcome(attempt)
