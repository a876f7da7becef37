"""A bench worker process on the old claim path: the figure before the worker session.

``python -m bench.claim_worker --address A --holder H --concurrency N --agents ...``: joins the
Ray cluster and runs N slots, each a loop of ``RunControlClient.claim`` (a long-poll actor call
to any host: ``RunHost.claim`` reads the claimable attempts and leases one, or refuses) and a
``ReportOutcome`` ``Succeeded`` (a grain command through the run's host), doing no work. This is
what the reference worker did per attempt before the SDK ran on sessions, less its cancellation
watch and its renewals (a no-op attempt ends before a renewal is due), so it understates the old
cost a little. Bench only: the product's worker is the SDK (``runcontrol.sdk``).
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from actors.run_host import host_config, make_router
from actors.service import start_ray
from runcontrol.client import RunControlClient
from runcontrol.commands import ReportOutcome
from runcontrol.config import Settings
from runcontrol.domain import AttemptOutcome, canonical_hash, errors

OUTCOME = canonical_hash({"ok": True})
CLAIM_WAIT_S = 5.0


async def slot(
    client: RunControlClient, agents: list[str], holder: str, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        try:
            found = await client.claim(agents, holder, CLAIM_WAIT_S)
            if found is not None:
                await client.send(
                    ReportOutcome(
                        **found.fenced(), outcome=AttemptOutcome.SUCCEEDED, outcome_hash=OUTCOME
                    )
                )
        except errors.RunControlError:
            await asyncio.sleep(0.1)  # refused or unavailable: the next claim tries again


async def main(args: argparse.Namespace) -> None:
    start_ray(address=args.address)
    client = RunControlClient(make_router(host_config(Settings(), "")))
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await asyncio.gather(
        *(slot(client, args.agents, f"{args.holder}/{k}", stop) for k in range(args.concurrency))
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--holder", required=True)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--agents", nargs="+", required=True)
    asyncio.run(main(parser.parse_args()))
