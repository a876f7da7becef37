"""RunHost: a named async Ray actor hosting many RunGrain activations (virtual actors).

Thin by design: it owns mailboxes (one asyncio.Lock per run, so one run's commands run strictly
in order while other runs interleave), activation and idle deactivation, and long-poll waiting.
Every rule lives in ``runcontrol``; the grain code runs on a thread pool because the store is
synchronous.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar
from uuid import UUID

import ray

from runcontrol.bootstrap import build, build_database
from runcontrol.commands import AcquireLease, Command, OpenAttempts
from runcontrol.config import Settings
from runcontrol.domain import LeaseGrant, errors
from runcontrol.grain import RunGrain, batches, commit_together_async
from runcontrol.store import queries as q
from runcontrol.store.async_send import AsyncDocumentSender
from runcontrol.store.notify import Listener
from runcontrol.store.uow import DISPATCH_CHANNEL, EVENTS_CHANNEL

from .metrics import HostMetrics, command_span, start_command_span
from .placement import HostRouter, get_or_create, pack_answers, unpack

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


def host_config(settings: Settings, owner_url: str) -> dict[str, Any]:
    return {"owner_url": owner_url, "settings": settings.model_dump(mode="json")}


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
        self.settings = Settings.model_validate(config["settings"])
        db = build_database(
            self.settings, owner_url=config["owner_url"], migrate=False, require_current_schema=True
        )
        self._env = build(self.settings, db=db, migrate=False).env
        self._metrics = HostMetrics()
        self._env.observers.append(self._metrics.observe)
        self._sender = AsyncDocumentSender(db)
        self._activations: dict[UUID, Activation] = {}
        threads = self.settings.grains.threads
        self._pool = (
            ThreadPoolExecutor(max_workers=threads, thread_name_prefix="grain") if threads else None
        )
        self._router = make_router(config)
        self._listener = Listener(db.system_url, (DISPATCH_CHANNEL, EVENTS_CHANNEL))
        self._started = time.monotonic()
        self._commands = 0
        self.grouped_commands = 0  # commands committed through ``command_batch``'s groups
        self._reaper = asyncio.get_running_loop().create_task(self._reap())

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
            await asyncio.sleep(max(idle / 4, 0.05))
            cutoff = time.monotonic() - idle
            for run_id, act in list(self._activations.items()):
                if act.last_used < cutoff and act.idle:
                    del self._activations[run_id]

    async def _in_thread(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self._pool is None:  # threads=0: run on the event loop (measured: see benchmarks)
            return fn(*args, **kwargs)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    async def command(self, command: Command[T]) -> T:
        """Run one grain command in the run's mailbox (strictly in order per run)."""
        run_id = command.run_id
        act = self._activation(command.tenant_id, run_id)
        async with act.mailbox():
            self._commands += 1
            try:
                with command_span(command) as span:
                    result = await self._in_thread(act.grain.execute, command)
                    step_id = getattr(result, "step_id", None)
                    if step_id is not None:
                        span.set_attribute("step.id", str(step_id))
                return result  # type: ignore[no-any-return]
            finally:
                if not act.grain.active and self._activations.get(run_id) is act:
                    del self._activations[run_id]  # terminal: nothing left to serialise

    async def command_batch(self, items: list[Command[Any]]) -> list[tuple[bool, Any]]:
        """Several commands in one actor call (``HostRouter.command`` batches them), each
        answered ``(ok, result or error)`` as if sent alone: one run's commands in the order
        listed (across batches, no order: DESIGN 9.6).

        The first command of each cached run whose mailbox is idle, if the grain can run it as
        a transition (``batches``), joins one group: the host takes those mailboxes before
        anything else can queue on them, runs the rules on this loop and awaits one statement
        for the group's documents (``commit_together_async``), with no thread hand-off; a step
        that would block (a load, a refusal's audit) runs on the thread pool. A cached
        ``OpenAttempts`` is answered from memory on the spot. Everything else goes through
        ``command`` (on the thread pool), queued behind the group on its run's mailbox."""
        results: list[tuple[bool, Any]] = [(False, None)] * len(items)
        seen: set[UUID] = set()
        together: list[tuple[int, Activation]] = []
        alone: list[int] = []
        for i, item in enumerate(items):
            run_id = item.run_id
            act = self._activations.get(run_id)
            ready = (
                run_id not in seen
                and act is not None
                and act.grain.tenant_id == item.tenant_id
                and act.grain.cached
                and act.idle
            )
            seen.add(run_id)
            if ready and act is not None and isinstance(item, OpenAttempts):
                act.last_used = time.monotonic()
                self._commands += 1
                results[i] = (True, act.grain.execute(item))
                seen.discard(run_id)  # nothing is in flight for the run yet
            elif ready and act is not None and batches(item):
                act.queued += 1  # taken: no other command can start on the run (no await here)
                together.append((i, act))
            else:
                alone.append(i)

        async def one(i: int) -> None:
            try:
                results[i] = (True, await self.command(items[i]))
            except Exception as exc:  # noqa: BLE001 - answered to its caller, not raised here
                results[i] = (False, exc)

        # The group's mailboxes are marked taken above and handed back in this same coroutine,
        # whatever happens (a cancelled call included); each run's later commands in the batch
        # wait in its mailbox until then.
        tasks = [asyncio.ensure_future(one(i)) for i in alone]
        try:
            if together:
                await self._together(items, together, results)
            await asyncio.gather(*tasks)
        except BaseException:
            for task in tasks:
                task.cancel()
            raise
        return results

    async def command_batch_packed(self, payload: bytes) -> bytes:
        """``command_batch`` as the router sends it: items and answers each one pickle."""
        return pack_answers(await self.command_batch(unpack(payload)))

    async def _together(
        self,
        items: list[Command[Any]],
        together: list[tuple[int, Activation]],
        results: list[Any],
    ) -> None:
        """Commit these runs' commands as one group. Each run was marked taken (``queued``);
        its lock is taken here at once (the run was idle) and everything is handed back."""
        held: list[Activation] = []
        try:
            for _, act in together:
                await act.lock.acquire()  # idle and taken: returns at once
                held.append(act)
            answers = await self._commit_together([(act.grain, items[i]) for i, act in together])
        except Exception as exc:  # noqa: BLE001 - answered to every caller of the group
            answers = [(False, exc)] * len(together)
        finally:
            now = time.monotonic()
            for act in held:
                act.lock.release()
            for i, act in together:
                act.queued -= 1
                act.last_used = now
                run_id = items[i].run_id
                if not act.grain.active and self._activations.get(run_id) is act:
                    del self._activations[run_id]  # terminal: nothing left to serialise
        self._commands += len(together)
        self.grouped_commands += len(together)
        for (i, _), answer in zip(together, answers, strict=True):
            results[i] = answer

    async def _commit_together(
        self, calls: list[tuple[RunGrain, Command[Any]]]
    ) -> list[tuple[bool, Any]]:
        answers: list[tuple[bool, Any] | None] = [None] * len(calls)
        spans: list[Any] = []
        transitions: list[Any] = []
        slots: list[int] = []
        for k, (grain, command) in enumerate(calls):
            spans.append(start_command_span(command))
            try:
                transitions.append(grain.transition(command))
                slots.append(k)
            except Exception as exc:  # noqa: BLE001 - answered to its own caller
                answers[k] = (False, exc)
        try:
            done = await commit_together_async(self._sender.send, transitions, self._in_thread)
        finally:
            for span in spans:
                span.end()
        for k, answer in zip(slots, done, strict=True):
            answers[k] = answer
        return [a if a is not None else (False, None) for a in answers]

    # ------------------------------------------------------------------ claims

    async def claim(
        self, agent_ids: list[str], holder: str, timeout_s: float = 30.0
    ) -> dict[str, Any] | None:
        """Pull the oldest dispatched attempt for these agents and lease it (long-poll)."""
        deadline = time.monotonic() + max(timeout_s, 0.0)
        payloads = tuple(agent_ids)
        while True:
            since = self._listener.generation(DISPATCH_CHANNEL, payloads)
            candidates = await self._in_thread(self._claimable, agent_ids)
            for tenant_id, run_id, attempt_id in candidates:
                try:
                    grant: LeaseGrant = await self._router.send(
                        AcquireLease(
                            tenant_id=tenant_id,
                            run_id=run_id,
                            attempt_id=attempt_id,
                            holder=holder,
                        )
                    )
                except (errors.LeaseHeld, errors.LeaseRejected):
                    continue  # another worker won it, or the run moved on
                run = await self._in_thread(self._run_view, tenant_id, run_id)
                return {"grant": grant, "tenant_id": tenant_id, "input": (run or {}).get("input")}
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await self._listener.wait(DISPATCH_CHANNEL, payloads, since, min(remaining, 2.0))

    def _claimable(self, agent_ids: list[str]) -> list[tuple[str, UUID, UUID]]:
        with self._env.db.system_tx() as conn:
            return q.claimable(conn, agent_ids, limit=8)

    # ------------------------------------------------------------------ reads

    def _run_view(self, tenant_id: str, run_id: UUID) -> dict[str, Any] | None:
        with self._env.db.tenant(tenant_id) as conn:
            return q.get_run(conn, run_id)

    async def get_run(self, tenant_id: str, run_id: UUID) -> dict[str, Any] | None:
        return await self._in_thread(self._run_view, tenant_id, run_id)

    async def events(
        self, tenant_id: str, run_id: UUID, after_seq: int, wait_s: float = 0.0
    ) -> list[dict[str, Any]]:
        """Committed events after ``after_seq``; waits up to ``wait_s`` for new ones."""
        deadline = time.monotonic() + max(wait_s, 0.0)
        key = (str(run_id),)
        while True:
            since = self._listener.generation(EVENTS_CHANNEL, key)

            def read() -> list[dict[str, Any]]:
                with self._env.db.tenant(tenant_id) as conn:
                    return q.events_after(conn, run_id, after_seq)

            found = await self._in_thread(read)
            remaining = deadline - time.monotonic()
            if found or remaining <= 0:
                return found
            await self._listener.wait(EVENTS_CHANNEL, key, since, min(remaining, 2.0))

    # ------------------------------------------------------------------ health

    @ray.method(concurrency_group="control")
    async def ping(self) -> str:
        return "ok"

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
            "grouped_commands": self.grouped_commands,
            # commit statements sent (grouped: store/group.py, command_batch) and their documents
            "commit_groups": self._env.db.statements_sent,
            "commit_documents": self._env.db.documents_sent,
            "rss_bytes": rss_kb * 1024,
            "uptime_s": time.monotonic() - self._started,
        }

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
        return size + _deep_size(obj._agg, seen)  # the cached aggregate, not the shared env
    fields = getattr(obj, "__dict__", None)
    if fields is not None:
        size += _deep_size(fields, seen)
    for slot in getattr(type(obj), "__slots__", ()):
        size += _deep_size(getattr(obj, slot, None), seen)
    return size


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
    from .placement import host_name

    handles = [
        get_or_create(
            host_name(k), RunHost, config, **options, **(host_options(k) if host_options else {})
        )
        for k in range(settings.grains.host_count)
    ]
    ray.get([h.ping.remote() for h in handles])
    return handles
