"""What the commands that run the service (``up``, ``hosts``, ``worker --transport ray``) need
from the Ray runtime, as a port: runcontrol never imports ``actors``.

The ``runcontrol`` console script (``actors/cli.py``) hands ``main`` a loader of the Ray
implementation (``actors/cluster.py``); ``python -m runcontrol.cli`` has none, and those commands
say where to start them. Ray is imported only when one of them starts.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ..config import Settings
from ..workers.protocol import SessionTransport


class RunningService(Protocol):
    """The service ``Cluster.start_service`` started: where it answers."""

    @property
    def url(self) -> str: ...

    @property
    def grpc_target(self) -> str: ...


class Cluster(Protocol):
    def start_ray(self, address: str | None, metrics_export_port: int | None = None) -> None:
        """Join the cluster at ``address``, or start a local one (None)."""

    def start_service(
        self,
        settings: Settings,
        owner_url: str,
        host: str,
        port: int,
        *,
        app_settings: dict[str, Any] | None,
        grpc_port: int,
    ) -> RunningService:
        """Run hosts, scheduler and the HTTP + gRPC app, once all of them answer."""

    async def drain_service(
        self, grace_s: float, stop_workers: Callable[[float], Awaitable[None]]
    ) -> dict[str, Any]:
        """Drain the service started here within ``grace_s``: the edge, the workers
        (``stop_workers(remaining_s)``), then the hosts; answers the drain's report."""

    def stop_service(self, serve_timeout_s: float) -> dict[str, float]:
        """Stop Serve, then Ray; answers how long each took (s)."""

    def start_hosts(self, settings: Settings, owner_url: str) -> int:
        """Start (or find) the run hosts and the scheduler, detached; answers the host count."""

    async def replace_host(self, index: int, grace_s: float) -> dict[str, Any]:
        """Drain run host ``index`` and restart it; answers once it serves again."""

    def session_transport(self, settings: Settings, owner_url: str) -> SessionTransport:
        """A worker session with the run hosts over actor calls."""


# Called only by the commands that run on Ray: the others (tokens, the HTTP commands) stay light.
ClusterLoader = Callable[[], Cluster]


def load(cluster: ClusterLoader | None, command: str) -> Cluster:
    if cluster is None:
        raise SystemExit(
            f"runcontrol {command} runs on Ray: start it with the `runcontrol` command "
            f"(or `python -m actors.cli {command}`), not `python -m runcontrol.cli`"
        )
    return cluster()
