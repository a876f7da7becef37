"""RunHost: a named async Ray actor hosting many RunGrain activations (virtual actors).

The Ray shell and the mailbox: it owns mailboxes (one asyncio.Lock per run, so one run's
commands run strictly in order while other runs interleave), activation and idle deactivation,
and the long-poll waits of event watchers. Every rule lives in ``runcontrol``: the worker path
(sessions, the book of credits and offers, fair shares, grants, claims) is
``runcontrol.workers``, which this host hands its mailboxes, router and database. Grains run
on the host's event loop: their loads, port reads and commits are awaited
(``runcontrol.store.commit``), and the commits made at the same moment share one statement
(``GroupCommit``). The host's few remaining reads (claims, run views, event pages) are
synchronous queries run off the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from uuid import UUID

import psycopg
import ray
from sqlalchemy import exc as sa_exc

from runcontrol.bootstrap import DATABASE_WAIT_S, build, build_database
from runcontrol.commands import AcquireLease, CancelRun, Command, new_command_id
from runcontrol.config import Settings
from runcontrol.domain import LeaseGrant, RunAggregate, errors
from runcontrol.domain.run import RUN_CONTROL
from runcontrol.drain import Drain
from runcontrol.grain import UNSERIALISED, Outcome, RunGrain, outcome, together, turn
from runcontrol.store import Database
from runcontrol.store import queries as q
from runcontrol.store.commit import CONFIG_CHANNEL, DISPATCH_CHANNEL, EVENTS_CHANNEL
from runcontrol.store.notify import Listener
from runcontrol.store.shards import follow_directory
from runcontrol.telemetry import Carrier, configure
from runcontrol.workers.book import CreditBook
from runcontrol.workers.claims import Claims
from runcontrol.workers.fair_shares import FairShare
from runcontrol.workers.protocol import SessionUp
from runcontrol.workers.sessions import FusedGrants, HostSessions

from .host_exchange import exchange_server
from .metrics import HostMetrics, command_span
from .placement import (
    HostRouter,
    get_or_create,
    host_index,
    host_name,
    pack,
    pack_answers,
    unpack,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

HOST_OPTIONS: dict[str, Any] = {
    "num_cpus": 0,
    "max_restarts": -1,
    "max_task_retries": 0,  # the router retries, with idempotent or fenced commands
    "max_concurrency": 1000,
    "concurrency_groups": {"control": 8},
    "enable_task_events": False,  # Serve turns them off for its actors; ours cost per call
}

# The claimers' and watchers' LISTEN connection closes once nobody waited on it for this long.
WATCH_IDLE_S = 30.0
# The cyclic collector's youngest threshold on a host (Python's is 700). A command allocates
# hundreds of short-lived containers: at 700 the collector ran about every other run, and
# every 250 runs scanned the whole heap (the libraries' 250,000 objects): 0.8 ms of CPU per
# completed 3-step run, 15% of a host's, in the sessions driven without Ray (issue 33).
GC_YOUNGEST = 10_000


def collect_less() -> None:
    """Leave what the process holds once started (Ray, the libraries, the host) out of the
    cyclic collector's scans (``gc.freeze``: never freed, and never garbage), and collect the
    young generation less often: a host's garbage is freed by reference counts; the
    collector finds the few cycles a little later (issue 33: its CPU 0.82 -> 0.09 ms per run,
    the process's 5.2 -> 4.4 ms, medians of three)."""
    gc.collect()
    gc.freeze()
    youngest, middle, oldest = gc.get_threshold()
    gc.set_threshold(max(youngest, GC_YOUNGEST), middle, oldest)


def host_config(settings: Settings, owner_url: str) -> dict[str, Any]:
    """A host's settings, with the HS256 secret (JSON hides it): it checks workers' tokens."""
    raw, secret = settings.model_dump(mode="json"), settings.auth.hs256_secret
    if secret is not None:
        raw["auth"]["hs256_secret"] = secret.get_secret_value()
    return {"owner_url": owner_url, "settings": raw}


def actor_start(config: dict[str, Any], role: str) -> tuple[Settings, Database]:
    """An actor's settings (its telemetry configured as ``role``) and its database: migrated by
    the deployment, never by an actor, and of a schema this release runs on, waited for."""
    settings = Settings.model_validate(config["settings"])
    configure(settings.telemetry, role)
    db = build_database(
        settings,
        owner_url=config["owner_url"],
        migrate=False,
        require_compatible_schema=True,
        wait_s=DATABASE_WAIT_S,
    )
    return settings, db


def make_router(config: dict[str, Any]) -> HostRouter:
    settings = Settings.model_validate(config["settings"])
    return HostRouter(
        settings.grains.host_count,
        placement=settings.grains.placement,
        dedicated_factory=lambda name: get_or_create(
            name, RunHost, config, lifetime="detached", **HOST_OPTIONS
        ),
    )


@dataclass
class Activation:
    """One run's grain and its mailbox: ``lock`` is held by the command running, ``queued``
    counts the commands holding or waiting for it (``lock.locked()`` alone misses a waiter
    already woken but not yet running)."""

    grain: RunGrain
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    last_used: float = field(default_factory=time.monotonic)
    queued: int = 0

    @property
    def idle(self) -> bool:
        return self.queued == 0 and not self.lock.locked()

    @contextlib.asynccontextmanager
    async def mailbox(self) -> AsyncIterator[None]:
        """Hold the run's mailbox: its commands run one at a time, in arrival order."""
        self.queued += 1
        try:
            async with self.lock:
                self.last_used = time.monotonic()
                yield
        finally:
            self.queued -= 1
            self.last_used = time.monotonic()


class RunHost:
    def __init__(self, config: dict[str, Any]) -> None:
        self._config = config
        self.settings, db = actor_start(config, "host")
        # The policy/alias cache's LISTEN connection, always on (a change must evict at once).
        self._listener = Listener(db.system_urls, (CONFIG_CHANNEL,))
        self._listener.start()
        # Unary long-poll claimers' and event watchers' own, open only while one waits:
        # sessions need neither, and every commit NOTIFYs both channels (issue 24).
        self._watch = Listener(
            db.system_urls,
            (DISPATCH_CHANNEL, EVENTS_CHANNEL),
            application_name="runcontrol-watch",
            idle_s=WATCH_IDLE_S,
        )
        container = build(self.settings, db=db, migrate=False, listener=self._listener)
        self._directory = follow_directory(db)  # routes the runs of a moved virtual shard
        self._shards = container.shards
        self._db = db
        self._env = container.env
        self._metrics = HostMetrics()
        self._env.observers.append(self._metrics.observe)
        self._activations: dict[UUID, Activation] = {}
        self._router = make_router(config)
        self._started = time.monotonic()
        self._commands = 0
        self.turns = 0  # mailbox turns deciding several commands of one run (``command_turn``)
        # Once draining, every new command and claim is refused (``errors.Draining``: the
        # router re-routes it to another host at once); those in flight finish (``drain``).
        self._drain = Drain(self.settings.drain.retry_after_seconds)
        self._reads = 0  # claims, run views, event pages: host calls that are not commands
        self._calls = 0  # actor calls served on the data path (batches, claims, reads, exchanges)
        # One fair share of this host's untenanted slots (its book's grants and its claims).
        flow = self.settings.flow
        fair = FairShare(flow.tenant_weights, flow.default_tenant_weight)
        self._claims = Claims(db, self._router, self._watch, fair, self._drain, self._in_thread)
        # The worker sessions (docs/sessions.md): the book, the exchanges, the grants.
        count = self.settings.grains.host_count
        index = _own_index(count)
        self._sessions = HostSessions(
            book=CreditBook(fair),
            runs=self,
            drain=self._drain,
            db=db,
            read=self._in_thread,
            clock=self._env.clock,
            options=self._env.options,
            hosts=count,
            sweep_interval=self.settings.scheduler.dispatch_sweep_interval,
            own=lambda run_id: index is None or host_index(run_id, count) == index,
        )
        self._env.observers.append(self._sessions.observe)
        self._env.credits = FusedGrants(self._sessions, self._drain)
        self._env.cancel_runs = self._cancel_run
        self._env.send = self._router.send  # a parent's commands to its children, and back
        self._cancels: set[asyncio.Future[Any]] = set()  # cancel-oldest's CancelRuns in flight
        loop = asyncio.get_running_loop()
        self._loop = loop  # the commands' and exchanges' loop (the control group has its own)
        self._reaper = loop.create_task(self._reap())
        self._sweeper = loop.create_task(self._sessions.sweep())
        # Workers' gRPC exchanges served here, with no replica relaying them (issue 42).
        self._exchange_server = exchange_server(
            self.settings, index, lambda _, up: self._sessions.exchange(up), self._drain
        )
        collect_less()

    def _cancel_run(self, tenant_id: str, run_id: UUID, reason: str, wanted_by: UUID) -> None:
        """A holder displaced by a ``cancel-oldest`` limit (docs/flow-control.md): a CancelRun
        by the system principal through the router (the run may live on another host). Its id
        names the run asking, so a repeat is answered once."""
        command = CancelRun(
            tenant_id=tenant_id,
            run_id=run_id,
            command_id=f"flow-cancel:{wanted_by}:{run_id}",
            requested_by=RUN_CONTROL,
            reason=reason,
        )
        task = asyncio.get_running_loop().create_task(self._router.send(command))
        self._cancels.add(task)

        def done(t: asyncio.Future[Any]) -> None:
            self._cancels.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.warning("cancel-oldest: CancelRun %s failed: %r", run_id, t.exception())

        task.add_done_callback(done)

    # ------------------------------------------------------------------ activations

    def _activation(self, tenant_id: str, run_id: UUID) -> Activation:
        act = self._activations.get(run_id)
        if act is None or act.grain.tenant_id != tenant_id:
            act = Activation(RunGrain(self._env, tenant_id, run_id))
            self._activations[run_id] = act
        return act

    async def _reap(self) -> None:
        idle = self.settings.grains.idle_seconds
        while True:
            # at least every second: a session past its exchange deadline ends promptly
            await asyncio.sleep(min(max(idle / 4, 0.05), 1.0))
            cutoff = time.monotonic() - idle
            for run_id, act in list(self._activations.items()):
                if act.last_used < cutoff and act.idle:
                    del self._activations[run_id]
            self._sessions.expire(time.monotonic())

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        """A synchronous read (claims, run views, event pages) off the loop. A read that met a
        pooled connection the database dropped (a restart) is retried once on a fresh one
        (the pool replaces the connections opened before the loss); then ``Unavailable``."""
        for retry in (True, False):
            try:
                return await asyncio.to_thread(fn, *args)
            except (sa_exc.OperationalError, psycopg.OperationalError) as exc:
                if not retry:
                    raise errors.Unavailable("the database connection was lost") from exc
                log.warning("a read met a lost database connection (%r); retrying", exc)
        raise AssertionError("unreachable")

    async def command(self, command: Command[T], carrier: Carrier | None = None) -> T:
        """Run one grain command in the run's mailbox (strictly in order per run); its span
        is the child of the span that sent it when ``carrier`` holds that span's context."""
        self._drain.check(f"{type(command).__name__} for run {command.run_id}")
        run_id = command.run_id
        act = self._activation(command.tenant_id, run_id)
        with self._drain.track():
            if type(command) in UNSERIALISED:  # nothing of the run: beside its mailbox
                self._commands += 1
                return await act.grain.execute(command)
            return await self._in_mailbox(act, command, carrier)

    async def _in_mailbox(
        self, act: Activation, command: Command[T], carrier: Carrier | None = None
    ) -> T:
        run_id = command.run_id
        async with act.mailbox():
            self._commands += 1
            try:
                with command_span(command, carrier) as span:
                    result = await act.grain.execute(command)
                    step_id = getattr(result, "step_id", None)
                    if step_id is not None and span.is_recording():  # no id made for no span
                        span.set_attribute("step.id", str(step_id))
                return result
            finally:
                if not act.grain.active and self._activations.get(run_id) is act:
                    del self._activations[run_id]  # terminal: nothing left to serialise

    async def command_batch(
        self, items: list[Command[Any]], carriers: list[Carrier | None] | None = None
    ) -> list[Outcome]:
        """Several commands in one actor call (``HostRouter.send`` batches them, a worker's
        exchange carries them), each answered ``(ok, result or error)`` as if sent alone: one
        run's commands in the order listed (across batches, no order: DESIGN 9.6). They all
        start in this turn of the loop, each in its run's mailbox, so their commits share one
        statement (``GroupCommit``); several of one run are one turn of its grain and one
        document (``runcontrol.grain.turn``). ``carriers`` (tracing on): each one's context."""
        contexts = carriers or [None] * len(items)
        outcomes: dict[int, Outcome] = {}

        async def group(positions: list[int]) -> None:
            first, commands = positions[0], [items[p] for p in positions]
            if len(commands) > 1:
                answered = await self.command_turn(commands, contexts[first])
            else:
                answered = [await outcome(self.command(commands[0], contexts[first]))]
            outcomes.update(zip(positions, answered, strict=True))

        await asyncio.gather(*map(group, together(items)))
        return [outcomes[p] for p in range(len(items))]

    async def command_turn(
        self, commands: list[Command[Any]], carrier: Carrier | None = None
    ) -> list[Outcome]:
        """Several commands of one run (``together``) in one hold of its mailbox: one turn
        of its grain, one commit. Refused whole while the host drains (none ran)."""
        first = commands[0]
        if self._drain.draining:
            return [(False, self._drain.refuse(f"commands for run {first.run_id}"))] * len(commands)
        act = self._activation(first.tenant_id, first.run_id)
        with self._drain.track():
            async with act.mailbox():
                self._commands += len(commands)
                self.turns += 1
                try:
                    with command_span(first, carrier):
                        return await turn(act.grain, commands)
                finally:
                    if not act.grain.active and self._activations.get(first.run_id) is act:
                        del self._activations[first.run_id]

    async def command_batch_packed(
        self, payload: bytes, carriers: list[Carrier | None] | None = None
    ) -> bytes:
        """``command_batch`` as the router sends it: items and answers each one pickle."""
        self._calls += 1
        return pack_answers(await self.command_batch(unpack(payload), carriers))

    async def lease(self, command: AcquireLease) -> tuple[LeaseGrant, RunAggregate]:
        """A session's grant (``HostSessions``): the lease made in the run's mailbox (the
        session checked the drain), then the run as committed, read in its mailbox."""
        act = self._activation(command.tenant_id, command.run_id)
        lease = await self._in_mailbox(act, command)
        return lease, await self._committed(act)

    async def committed(self, tenant_id: str, run_id: UUID) -> RunAggregate:
        return await self._committed(self._activation(tenant_id, run_id))

    @staticmethod
    async def _committed(act: Activation) -> RunAggregate:
        """The run's cached rows, read in its mailbox (no read of the store while the
        activation holds them)."""
        async with act.mailbox():
            return await act.grain.load_cached()

    # ------------------------------------------------------------------ worker sessions

    async def exchange_packed(self, payload: bytes) -> bytes:
        """One exchange of a worker session (``runcontrol.workers.sessions.HostSessions``), as
        the router sends it: the ``SessionUp`` and the ``SessionDown`` each one pickle
        (``pack``), not walked and cloudpickled by Ray object by object."""
        self._calls += 1
        up: SessionUp = unpack(payload)
        return pack(await self._sessions.exchange(up))

    # ------------------------------------------------------------------ claims

    async def claim(
        self,
        agent_ids: list[str],
        holder: str,
        timeout_s: float = 30.0,
        tenant_id: str | None = None,
        claim_id: str | None = None,
    ) -> dict[str, Any] | None:
        """Pull the oldest dispatched attempt for these agents and lease it (long-poll);
        with ``tenant_id``, only that tenant's (``runcontrol.workers.claims``). ``claim_id``:
        the claim's request id, the command id of its ``AcquireLease`` (a resend after a lost
        answer gets the lease the first send was granted).

        A draining host refuses a new claim and ends a long poll with None (at its next
        wake-up, within 2 s); a claim granting a lease finishes first (the drain waits for it:
        a grant whose answer is lost leaves an attempt nobody works until its lease expires)."""
        self._drain.check("a claim")
        self._reads += 1
        self._calls += 1
        with self._drain.track():
            return await self._claims.claim(
                agent_ids, holder, timeout_s, tenant_id, claim_id or new_command_id()
            )

    async def grant_results(self, tenant_id: str, run_id: UUID, attempt_id: UUID) -> dict[str, Any]:
        """The dependencies' results a unary claim's lease of ``attempt_id`` carries, asked
        of the run's own host (a claim may be served by another): from the run's cached rows,
        as a session's grant carries them."""
        self._calls += 1
        agg = await self.committed(tenant_id, run_id)
        return agg.grant_results(attempt_id)

    # ------------------------------------------------------------------ reads

    def _run_view(self, tenant_id: str, run_id: UUID) -> dict[str, Any] | None:
        with self._db.tenant(tenant_id) as conn:
            return q.get_run(conn, run_id)

    async def get_run(self, tenant_id: str, run_id: UUID) -> dict[str, Any] | None:
        self._reads += 1
        self._calls += 1
        return await self._in_thread(self._run_view, tenant_id, run_id)

    async def events(
        self, tenant_id: str, run_id: UUID, after_seq: int, wait_s: float = 0.0
    ) -> list[dict[str, Any]]:
        """Committed events after ``after_seq``; waits up to ``wait_s`` for new ones (a
        draining host refuses, and ends a wait at once: the caller asks another host)."""
        self._drain.check("a watch")
        self._reads += 1
        self._calls += 1
        deadline = time.monotonic() + max(wait_s, 0.0)
        key = (str(run_id),)
        while True:
            since = self._watch.generation(EVENTS_CHANNEL, key)

            def read() -> list[dict[str, Any]]:
                with self._db.tenant(tenant_id) as conn:
                    return q.events_after(conn, run_id, after_seq)

            found = await self._in_thread(read)
            remaining = deadline - time.monotonic()
            if found or remaining <= 0 or self._drain.draining:
                return found
            await self._watch.wait(EVENTS_CHANNEL, key, since, min(remaining, 2.0))

    # ------------------------------------------------------------------ health

    @ray.method(concurrency_group="control")
    async def ping(self) -> str:
        return "ok"

    async def exchange_target(self) -> str | None:
        """Where this host serves the workers' gRPC ``Exchange`` (None: it does not)."""
        return None if self._exchange_server is None else self._exchange_server.target

    @ray.method(concurrency_group="control")
    async def stats(self) -> dict[str, Any]:
        rss_kb = 0
        try:
            with open(f"/proc/{os.getpid()}/status", encoding="ascii") as fh:
                for line in fh:
                    if line.startswith("VmRSS:"):
                        rss_kb = int(line.split()[1])
        except OSError:
            pass
        return {
            "pid": os.getpid(),
            "activations": len(self._activations),
            "commands": self._commands,
            "turns": self.turns,
            "reads": self._reads,  # claim, get_run and events calls
            "calls": self._calls,  # command batches, claims, reads and exchanges served
            "exchanges": self._sessions.exchanges,
            "late_exchanges": self._sessions.late_exchanges,
            # commit statements sent (each a group: store/commit.py) and the documents in them
            "commit_groups": sum(s.store.statements_sent for s in self._shards.all()),
            "commit_documents": sum(s.store.documents_sent for s in self._shards.all()),
            "commit_bytes": sum(s.store.document_bytes_sent for s in self._shards.all()),
            # streamed output (store/output.py): writes, the chunks stored, their statements
            "output_writes": self._env.output.writes,
            "output_chunks": self._env.output.chunks,
            "output_statements": self._env.output.statements,
            "rss_bytes": rss_kb * 1024,
            "uptime_s": time.monotonic() - self._started,
            "in_flight": self._drain.in_flight,
            "draining": self._drain.draining,
        }

    @ray.method(concurrency_group="control")
    async def drain(self, grace_s: float | None = None) -> dict[str, Any]:
        """Stop taking commands and claims (each refused with ``errors.Draining``, which the
        router re-routes to another host at once), wait for those in flight to commit, at most
        ``grace_s`` (default ``drain.grace_seconds``), then release every grain. The runs'
        truth is in the database (leases included), so another host serves their next
        commands at once, with no wait for a lease to expire. The host stays up, refusing,
        until it is stopped or replaced (``resume`` calls the drain off)."""
        grace = self.settings.drain.grace_seconds if grace_s is None else grace_s
        self._drain.begin()
        # Waiting exchanges answer now, as draining. They wait on the command loop, in another
        # thread than this control group's: woken through that loop (an event set from here
        # woke none of them; they answered when their wait ran out).
        self._loop.call_soon_threadsafe(self._sessions.wake_all)
        report = await self._drain.wait(grace)
        released = len(self._activations)
        self._activations.clear()
        if not report.idle:
            log.warning("drain: %d commands still in flight after %.1fs", report.in_flight, grace)
        return {**dataclasses.asdict(report), "released": released}

    @ray.method(concurrency_group="control")
    async def resume(self) -> None:
        self._drain.resume()

    @ray.method(concurrency_group="control")
    async def activation_bytes(self) -> dict[str, float]:
        """Deep size of the cached activations (Python objects reachable from them), so the
        memory per idle activation is measured directly instead of from noisy RSS deltas."""
        seen: set[int] = set()
        total = sum(_deep_size(act.grain, seen) for act in list(self._activations.values()))
        return {"activations": len(self._activations), "bytes": float(total)}

    @ray.method(concurrency_group="control")
    async def deactivate_all(self) -> int:
        n = len(self._activations)
        self._activations.clear()
        return n


_SHARED = (str, int, float, bool, type(None))


def _deep_size(obj: Any, seen: set[int]) -> int:
    """sys.getsizeof over everything an activation owns (not the shared environment)."""
    import sys

    if id(obj) in seen or isinstance(obj, type):
        return 0
    seen.add(id(obj))
    size = sys.getsizeof(obj)
    if isinstance(obj, _SHARED):
        return size
    if isinstance(obj, dict):
        return size + sum(_deep_size(k, seen) + _deep_size(v, seen) for k, v in obj.items())
    if isinstance(obj, list | tuple | set | frozenset):
        return size + sum(_deep_size(item, seen) for item in obj)
    if isinstance(obj, RunGrain):
        return size + _deep_size(obj.agg, seen)  # the cached aggregate, not the shared env
    fields = getattr(obj, "__dict__", None)
    if fields is not None:
        size += _deep_size(fields, seen)
    for slot in getattr(type(obj), "__slots__", ()):
        size += _deep_size(getattr(obj, slot, None), seen)
    return size


def _own_index(host_count: int) -> int | None:
    """This host's index, from its actor name (None: a dedicated host, or outside Ray)."""
    try:
        name = ray.get_runtime_context().get_actor_name() or ""
    except Exception:  # noqa: BLE001 - not in an actor
        return None
    prefix = host_name(0)[:-1]
    if not name.startswith(prefix) or not name[len(prefix) :].isdigit():
        return None
    index = int(name[len(prefix) :])
    return index if index < host_count else None


def ensure_hosts(
    settings: Settings,
    owner_url: str,
    *,
    detached: bool = False,
    host_options: Callable[[int], dict[str, Any]] | None = None,
) -> list[Any]:
    """Create (or find) the configured host actors and wait until each answers.

    ``host_options(k)`` may add Ray options for host ``k`` (``resources``,
    ``scheduling_strategy``, ...), e.g. to place hosts on particular nodes; it may not
    repeat one of ``HOST_OPTIONS``.
    """
    config = host_config(settings, owner_url)
    options = dict(HOST_OPTIONS)
    if detached:
        options["lifetime"] = "detached"
    handles = [
        get_or_create(
            host_name(k), RunHost, config, **options, **(host_options(k) if host_options else {})
        )
        for k in range(settings.grains.host_count)
    ]
    ray.get([h.ping.remote() for h in handles])
    return handles
