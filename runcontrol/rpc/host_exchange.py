"""``Exchange`` served by a run host itself (issue 42 point 5): a worker's session exchanges
with host k reach host k's own gRPC server, not an API replica that relays each one as an
actor call (one hop, one decode and one encode less per exchange).

The same call as through the ingress (``rpc.exchange.serve``): the worker is the one its token
names (role ``Worker``, scope ``factory.runtime``), the credits' tenant and holders are the
token's, each command is answered as its own RPC would answer it (a stale fencing token as its
typed error), and a draining host takes no credit and refuses the commands (``draining``).
Only ``Exchange`` is served here; every other RPC answers ``UNIMPLEMENTED`` (the ingress
serves them). Workers learn each host's target from the ingress's Exchange replies
(``host_targets``); ``actors.host_exchange`` starts the server on the host's event loop.
"""

from __future__ import annotations

from typing import Any

from schemas import runcontrol_pb2 as pb
from schemas import runcontrol_pb2_grpc as pb_grpc

from ..domain import errors
from ..drain import Drain
from ..edge.auth import TokenVerifier
from ..edge.unexpected import unexpected
from . import exchange
from .service import refuse, worker_of


class HostExchange(pb_grpc.RunControlServicer):
    def __init__(
        self,
        index: int,
        hosts: int,
        send: exchange.Send,
        verifier: TokenVerifier,
        drain: Drain,
    ) -> None:
        """Run host ``index`` of ``hosts``; ``send``: its own sessions' exchange."""
        self._index = index
        self._hosts = hosts
        self._send = send
        self._verifier = verifier
        self._drain = drain

    async def Exchange(self, request: pb.ExchangeRequest, context: Any) -> pb.ExchangeReply:  # noqa: N802 - the RPC's name
        try:
            worker = await worker_of(self._verifier, context, "session")
            if request.session_id and request.host != self._index:
                raise errors.ValidationFailed(
                    f"this is run host {self._index}, not {request.host}", field="host"
                )
            return await exchange.serve(request, worker, self._hosts, self._send, self._drain)
        except errors.RunControlError as exc:
            refuse(context, exc)
        except Exception as exc:  # noqa: BLE001 - logged with an id, answered INTERNAL
            refuse(context, unexpected(exc, "gRPC Exchange (run host)"))
        return pb.ExchangeReply()
