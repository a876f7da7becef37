"""The worker session in the cluster: an exchange is one actor call to run host ``k``.

``ActorSessionTransport`` is the ``runcontrol.session.SessionTransport`` of in-cluster workers
(``RunControlClient`` is one too, through its router): ``exchange(k, up)`` calls
``RunHost.exchange`` on ``runcontrol-host-{k}`` (retried across the host's restarts by the
router: an exchange is safe to repeat, its commands carry their ids and its credits replace
the last set); ``hosts()`` is the configured host count.
"""

from __future__ import annotations

from runcontrol.session import SessionDown, SessionUp

from .placement import HostRouter


class ActorSessionTransport:
    def __init__(self, router: HostRouter) -> None:
        self._router = router

    async def hosts(self) -> int:
        return await self._router.hosts()

    async def exchange(self, host: int, up: SessionUp) -> SessionDown:
        """Host ``host``'s answer; a host refusing as draining answers ``draining=True``
        (the worker offers its credits and commands to another host)."""
        return await self._router.exchange(host, up)
