"""A runtime worker process that talks only gRPC, with Ray made unimportable.

``python grpc_worker_proc.py TARGET TOKEN INSTANCE FLAKY_AGENT AGENT...``: runs the tests'
reference worker (``ReferenceWorker`` over ``GrpcSessionTransport``) for these agents until
SIGTERM; the first execution of FLAKY_AGENT fails transiently. Any ``import ray`` in
this process raises ImportError, so finishing work proves the worker path needs no Ray.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.modules["ray"] = None  # type: ignore[assignment]  # every `import ray` now fails
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the reference worker

import asyncio  # noqa: E402
import signal  # noqa: E402
from typing import Any  # noqa: E402

from reference_worker import EchoExecutor, ReferenceWorker, TransientError  # noqa: E402

from runcontrol.rpc.exchange import GrpcSessionTransport  # noqa: E402
from runcontrol.sdk import token_identity  # noqa: E402


class FlakyOnce(EchoExecutor):
    def __init__(self, name: str) -> None:
        super().__init__(name, seconds=0.05)
        self.failed = False

    async def execute(self, input: dict[str, Any] | None) -> dict[str, Any]:
        if not self.failed:
            self.failed = True
            raise TransientError("the first try fails (test)")
        return await super().execute(input)


async def main(target: str, token: str, instance: str, flaky: str, agents: list[str]) -> None:
    executors: dict[str, Any] = {a: EchoExecutor(a, 0.05) for a in agents}
    executors[flaky] = FlakyOnce(flaky)
    transport = GrpcSessionTransport(target, token)
    try:
        worker = ReferenceWorker(
            transport,
            token_identity(token, instance),
            executors,
            renew_every_s=0.5,
            claim_timeout_s=1.0,
            lease_grace_s=5,
        )
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, worker.stop)
        print(
            "worker ready; ray importable:",
            "ray" in sys.modules and sys.modules["ray"] is not None,
            flush=True,
        )
        await worker.run()
    finally:
        await transport.close()


if __name__ == "__main__":
    target, token, instance, flaky, *agents = sys.argv[1:]
    asyncio.run(main(target, token, instance, flaky, agents))
