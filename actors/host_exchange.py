"""A run host's own gRPC server for the workers' ``Exchange`` (``runcontrol.rpc.host_exchange``).

Started on the host's event loop, so an exchange reaches the host's sessions with no actor
call: on port ``grains.exchange_port`` plus the host's index (0: a free one), advertised to
workers as ``grains.exchange_target`` formatted with the node's address, the port and the
index (the API's Exchange replies carry every host's, ``HostRouter.exchange_targets``).
"""

from __future__ import annotations

import logging

import grpc
import ray

from runcontrol.config import AuthNotConfigured, Settings
from runcontrol.drain import Drain
from runcontrol.edge.auth import TokenVerifier
from runcontrol.rpc.exchange import Send
from runcontrol.rpc.host_exchange import HostExchange
from schemas import runcontrol_pb2_grpc as pb_grpc

log = logging.getLogger(__name__)


def exchange_server(
    settings: Settings, index: int | None, send: Send, drain: Drain
) -> ExchangeServer | None:
    """Host ``index``'s Exchange server, or None: configured off (``grains.exchange_port``), a
    dedicated host (no index), or no token verification key to check workers' tokens with."""
    if settings.grains.exchange_port is None or index is None:
        return None
    try:
        verifier = TokenVerifier(settings.auth)
    except AuthNotConfigured:
        log.info("run host %d serves no Exchange of its own: no token key is configured", index)
        return None
    return ExchangeServer(settings, index, send, drain, verifier)


class ExchangeServer:
    def __init__(
        self, settings: Settings, index: int, send: Send, drain: Drain, verifier: TokenVerifier
    ) -> None:
        grains = settings.grains
        self.target: str | None = None  # once serving
        self._index = index
        self._port = grains.exchange_port + index if grains.exchange_port else 0
        self._format = grains.exchange_target
        self._server = grpc.aio.server()
        servicer = HostExchange(index, grains.host_count, send, verifier, drain)
        pb_grpc.add_RunControlServicer_to_server(servicer, self._server)  # type: ignore[no-untyped-call]

    async def start(self) -> None:
        """Serve; a host that cannot bind its port serves its workers through the ingress."""
        try:
            port = self._server.add_insecure_port(f"[::]:{self._port}")
            await self._server.start()
        except Exception:  # noqa: BLE001 - the ingress's relay still serves its exchanges
            log.exception("run host %d: its Exchange server did not start", self._index)
            return
        node_ip = ray.util.get_node_ip_address()
        self.target = self._format.format(node_ip=node_ip, port=port, index=self._index)

    async def stop(self) -> None:
        await self._server.stop(grace=None)
