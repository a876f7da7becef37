"""What the routes need from outside (built once by ``create_app``) and how they read."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, TypeVar
from urllib.parse import quote
from uuid import UUID

from fastapi import Depends, Query, Request
from sqlalchemy import Connection

from ..client import RunControlClient
from ..commands import Command
from ..config import Settings
from ..drain import Drain
from ..edge import reads
from ..edge.auth import Caller
from ..edge.commands import Outside
from ..edge.errors import InvalidCursor, Overloaded
from ..edge.metering import TenantRateLimiter
from ..store import Database
from ..store import queries as q
from ..store.notify import Listener

T = TypeVar("T")
R = TypeVar("R")

HostProbe = Callable[[], Awaitable[Any]]


@dataclass
class Streams:
    """The live event streams open on this replica (``api.sse_max_streams``)."""

    live: int = 0


@dataclass
class InFlight:
    """The commands this replica waits on (``api.max_commands_in_flight``)."""

    commands: int = 0


@dataclass(frozen=True)
class Services:
    """Commands go to the run hosts through ``client``; reads and event streams never do:
    ``read`` queries the database from this replica, and ``feed`` (one LISTEN connection per
    replica) wakes every stream whose run committed."""

    client: RunControlClient
    db: Database
    settings: Settings
    feed: Listener
    host_probe: HostProbe | None = None
    streams: Streams = field(default_factory=Streams)
    in_flight: InFlight = field(default_factory=InFlight)
    drain: Drain = field(default_factory=Drain)

    def outside(self, caller: Caller, meter: TenantRateLimiter | None = None) -> Outside:
        """The caller as the sender of an outside command through this door
        (``edge.commands``); ``meter``: the tenant's rate, taken per command (a bulk call's
        items) where the route's dependency did not take it."""
        return Outside(caller, self.db, "http", meter)

    async def send(self, command: Command[R]) -> R:
        """Send a command to its run's host, unless this replica already waits on
        ``api.max_commands_in_flight`` of them: then shed it (503 ``overloaded``, Retry-After)
        before it does anything, so the client may retry, here or on another replica. While
        the replica drains, new work (a submission) is refused the same way (503
        ``draining``); commands of work already accepted go on, and the drain waits for them."""
        self.drain.admit(command)
        limit = self.settings.api.max_commands_in_flight
        if self.in_flight.commands >= limit:
            raise Overloaded(f"this replica is waiting on {limit} commands already; retry")
        self.in_flight.commands += 1
        try:
            with self.drain.track():
                return await self.client.send(command)
        finally:
            self.in_flight.commands -= 1

    async def read(
        self, tenant_id: str, query: Callable[[Connection], T], *, project_id: str | None
    ) -> T:
        """A read model query in the caller's tenant and, unless None, project, on a thread
        (``runcontrol.edge.reads``: a lost database answers 503)."""
        return await reads.read(self.db, tenant_id, query, project_id=project_id)

    async def read_in_scope(self, caller: Caller, query: Callable[[Connection], T]) -> T:
        """``read`` in the caller's tenant and project scope (``Caller.project_scope``: its
        project, or the whole tenant for a role that spans it)."""
        return await self.read(caller.tenant_id, query, project_id=caller.project_scope)

    async def read_in_tenant(self, caller: Caller, query: Callable[[Connection], T]) -> T:
        """``read`` across the caller's tenant: what the tenant owns, not a project (the
        catalog, webhook subscriptions, the approval policy)."""
        return await self.read(caller.tenant_id, query, project_id=None)


async def services(request: Request) -> Services:
    # async: FastAPI runs a plain ``def`` dependency on a thread pool, a hop per request
    found: Services = request.app.state.services
    return found


Svc = Annotated[Services, Depends(services)]


def location(prefix: str, *segments: object) -> str:
    """A ``Location`` header's path: ``prefix``, then each segment percent-encoded (RFC 3986).
    A header holds Latin-1 only; an id may hold any script (``domain.limits.name``)."""
    return "/".join([prefix, *(quote(str(s), safe="") for s in segments)])


def found(view: T | None, missing: Exception) -> T:
    """What a read found, or ``missing`` raised (a not-found error: 404) when it found nothing."""
    if view is None:
        raise missing
    return view


# A page of a list: the cursor the previous page answered (``nextCursor``), and its size.
Cursor = Annotated[str | None, Query(max_length=1000)]
PageLimit = Annotated[int, Query(ge=1, le=200)]


def check_cursor(cursor: str | None) -> str | None:
    """An opaque cursor this API handed out, or 400 (never a database error later)."""
    if cursor is None:
        return None
    try:
        _, key = q.decode_cursor(cursor)
        UUID(key)
    except (ValueError, TypeError):
        raise InvalidCursor("the cursor is not one this API returned") from None
    return cursor


Page = tuple[list[dict[str, Any]], str | None]


async def list_page(
    svc: Services,
    caller: Caller,
    query: Callable[..., Page],
    cursor: str | None,
    limit: int,
    **filters: Any,
) -> dict[str, Any]:
    """One page of a read model list in the caller's scope, as the list routes answer it: the
    items, the cursor of the next page (None after the last) and when it was read.
    ``query(conn, project_id=, cursor=, limit=, **filters)`` reads the page."""
    check_cursor(cursor)
    project = caller.project_scope

    def page(conn: Connection) -> Page:
        return query(conn, project_id=project, cursor=cursor, limit=limit, **filters)

    as_of = datetime.now(UTC)
    items, next_cursor = await svc.read_in_scope(caller, page)
    return {"items": items, "nextCursor": next_cursor, "asOf": as_of}
