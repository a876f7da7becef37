"""A bench worker process on worker sessions (DESIGN 10): no work, just the session loop.

``python -m bench.session_worker --address A --holder H --concurrency N --agents ...``: joins
the Ray cluster (or, with ``--grpc TARGET --token T``, reaches Serve's gRPC ingress as a worker
outside it: ``rpc.exchange.GrpcSessionTransport``), keeps one session with each run host
(the router, ``actors.placement.HostRouter``, in the cluster), offers its slots as credits (split
evenly over the hosts) and reports every grant ``Succeeded`` in the next exchange of the same
session, with the freed slot's new credit. Bench only: the product's worker is the SDK
(``runcontrol.sdk``, issue 20); this measures the host side apart from it.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import uuid
from typing import Any

from actors.placement import HostRouter
from actors.run_host import host_config, make_router
from actors.service import start_ray
from runcontrol.commands import Command, ReportOutcome
from runcontrol.config import Settings
from runcontrol.domain import AttemptOutcome, canonical_hash, errors
from runcontrol.workers.protocol import Credit, SessionDown, SessionTransport, SessionUp

OUTCOME = canonical_hash({"ok": True})


class Session:
    def __init__(
        self,
        transport: HostRouter,
        host: int,
        agents: tuple[str, ...],
        holder: str,
        slots: int,
    ) -> None:
        self.transport, self.host, self.agents, self.holder = transport, host, agents, holder
        self.session_id = f"{holder}-{uuid.uuid4().hex[:8]}"
        self.credits = {c.claim_id: c for c in (self._credit() for _ in range(slots))}
        self.commands: list[Command[Any]] = []
        self.acks: list[str] = []
        self.seen: set[str] = set()
        self.completed = 0

    def _credit(self) -> Credit:
        return Credit(str(uuid.uuid4()), self.holder, self.agents)

    def take(self, down: SessionDown) -> None:
        for grant in down.grants:
            self.acks.append(grant.claim_id)
            if grant.claim_id in self.seen:
                continue
            self.seen.add(grant.claim_id)
            self.credits.pop(grant.claim_id, None)
            self.commands.append(
                ReportOutcome(
                    **grant.fenced(), outcome=AttemptOutcome.SUCCEEDED, outcome_hash=OUTCOME
                )
            )
            fresh = self._credit()
            self.credits[fresh.claim_id] = fresh
        self.completed += sum(1 for a in down.answers if a.ok)

    async def serve(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            commands, self.commands = self.commands, []
            acks, self.acks = self.acks, []
            up = SessionUp(
                self.session_id,
                tuple(self.credits.values()),
                tuple(commands),
                tuple(acks),
                wait_s=2.0,
            )
            self.take(await self.transport.exchange(self.host, up))
        # withdraw the credits on the way out
        await self.transport.exchange(self.host, SessionUp(self.session_id, acks=tuple(self.acks)))


async def main(args: argparse.Namespace) -> None:
    transport: SessionTransport
    if args.grpc:
        from runcontrol.rpc.exchange import GrpcSessionTransport

        app = (("application", args.application),) if args.application else ()
        transport = GrpcSessionTransport(args.grpc, args.token, metadata=app)
    else:
        start_ray(address=args.address)
        transport = make_router(host_config(Settings(), ""))
    for _ in range(60):  # the ingress may still be starting
        try:
            hosts = await transport.hosts()
            break
        except errors.RunControlError:
            await asyncio.sleep(0.5)
    else:
        raise SystemExit("no run host answered")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    per_host = max(args.concurrency // hosts, 1)
    sessions = [
        Session(transport, k, tuple(args.agents), args.holder, per_host) for k in range(hosts)
    ]
    await asyncio.gather(*(s.serve(stop) for s in sessions))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--address")
    parser.add_argument("--grpc", help="Serve's gRPC ingress (a worker outside the cluster)")
    parser.add_argument("--token", help="the worker's bearer token (with --grpc)")
    parser.add_argument("--application", help="Serve's application (with --grpc)")
    parser.add_argument("--holder", required=True)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--agents", nargs="+", required=True)
    asyncio.run(main(parser.parse_args()))
