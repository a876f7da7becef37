"""A minimal worker session for the host tests: slots offered as credits to the run hosts
through the in-cluster transport, each grant answered by a report (or held), every answer
recorded. Not the SDK (``runcontrol.sdk``): only what the tests need to drive ``exchange``."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from runcontrol.commands import Command, ReportOutcome
from runcontrol.domain import AttemptOutcome, canonical_hash
from runcontrol.workers.protocol import Credit, Grant, SessionDown, SessionTransport, SessionUp


@dataclass
class Received:
    host: int
    down: SessionDown
    at: float


@dataclass
class SessionDriver:
    transport: SessionTransport
    agents: tuple[str, ...]
    holder: str = "session-worker"
    slots_per_host: int = 2
    tenant_id: str | None = None
    # grant -> whether to report its outcome at once (False: hold the lease)
    work: Callable[[Grant], bool] = lambda grant: True
    session_id: str = field(default_factory=lambda: f"s-{uuid.uuid4().hex[:8]}")
    received: list[Received] = field(default_factory=list)
    grants: list[tuple[int, Grant]] = field(default_factory=list)
    cancels: list[tuple[float, UUID]] = field(default_factory=list)
    _credits: dict[int, dict[str, Credit]] = field(default_factory=dict)
    _commands: dict[int, list[Command[Any]]] = field(default_factory=dict)
    _acks: dict[int, list[str]] = field(default_factory=dict)
    _seen: set[str] = field(default_factory=set)
    _stop: bool = False

    def credit(self, host: int, *, resent: bool = False, claim_id: str | None = None) -> Credit:
        found = Credit(
            claim_id or str(uuid.uuid4()), self.holder, self.agents, self.tenant_id, resent
        )
        self._credits.setdefault(host, {})[found.claim_id] = found
        return found

    def up(self, host: int, wait_s: float) -> SessionUp:
        commands, self._commands[host] = self._commands.get(host, []), []
        acks, self._acks[host] = self._acks.get(host, []), []
        return SessionUp(
            self.session_id,
            credits=tuple(self._credits.get(host, {}).values()),
            commands=tuple(commands),
            acks=tuple(acks),
            wait_s=wait_s,
        )

    def take(self, host: int, down: SessionDown) -> None:
        loop = asyncio.get_running_loop()
        self.received.append(Received(host, down, loop.time()))
        for at_cancel in down.cancels:
            self.cancels.append((loop.time(), at_cancel))
        for grant in down.grants:
            self._acks.setdefault(host, []).append(grant.claim_id)
            if grant.claim_id in self._seen:
                continue
            self._seen.add(grant.claim_id)
            self.grants.append((host, grant))
            self._credits.get(host, {}).pop(grant.claim_id, None)
            if self.work(grant):
                self._commands.setdefault(host, []).append(report(grant))
                self.credit(host)  # the slot is free again

    async def serve(self, host: int, wait_s: float = 1.0) -> None:
        for _ in range(self.slots_per_host):
            self.credit(host)
        while not self._stop:
            self.take(host, await self.transport.exchange(host, self.up(host, wait_s)))

    async def run(self, until: Callable[[], bool], timeout: float = 60.0) -> None:
        hosts = await self.transport.hosts()
        tasks = [asyncio.create_task(self.serve(k)) for k in range(hosts)]
        try:
            async with asyncio.timeout(timeout):
                while not until():
                    await asyncio.sleep(0.05)
                    for task in tasks:
                        if task.done():
                            task.result()
        finally:
            self._stop = True
            await asyncio.wait(tasks, timeout=5)
            for task in tasks:
                task.cancel()


def report(grant: Grant, n: int = 1) -> ReportOutcome:
    return ReportOutcome(
        **grant.fenced(),
        outcome=AttemptOutcome.SUCCEEDED,
        outcome_hash=canonical_hash({"outcome": n}),
    )
