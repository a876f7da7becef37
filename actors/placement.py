"""runId -> host routing, host creation and every Ray call the clients make.

All ``ray.*`` calls of the control plane live in ``actors/``; this module is the one place
that resolves named actors, creates them with their remote options, and turns Ray's failures
into our typed errors.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import itertools
import logging
import pickle
import time
import types
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from uuid import UUID

import ray
from ray import cloudpickle
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

from runcontrol import commands
from runcontrol.commands import Command
from runcontrol.domain import errors, model
from runcontrol.domain.run import values
from runcontrol.telemetry import Carrier, current_carrier
from runcontrol.workers import protocol
from runcontrol.workers.protocol import SessionDown, SessionUp

log = logging.getLogger(__name__)
R = TypeVar("R")

NAMESPACE = "runcontrol"
SCHEDULER_NAME = "runcontrol-scheduler"
RETRIES = 8  # lookups of a name not registered or an actor dead (about 7 s of backoff)
# An actor Ray reports as restarting is waited for this long, however many tries that takes: a
# host's restart starts a process and imports runcontrol, which takes more than RETRIES' backoff
# on a loaded machine (a command sent then would answer 503 though its host is coming back).
RESTART_WAIT_S = 30.0


def host_name(index: int) -> str:
    return f"runcontrol-host-{index}"


def dedicated_name(run_id: UUID) -> str:
    return f"run-{run_id}"


def host_index(run_id: UUID, host_count: int) -> int:
    """Stable over processes and restarts (unlike ``hash()``): sha256 of the id's bytes."""
    digest = hashlib.sha256(run_id.bytes).digest()
    return int.from_bytes(digest[:8], "big") % host_count


def get_or_create(name: str, cls: Any, config: dict[str, Any], **options: Any) -> Any:
    """Look the named actor up; create it if absent. Not ``get_if_exists`` (ray#44083)."""
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        pass
    groups = options.pop("concurrency_groups", None)
    remote_cls = (
        ray.remote(concurrency_groups=groups)(cls)  # type: ignore[call-overload]
        if groups
        else ray.remote(cls)
    )
    try:
        return remote_cls.options(name=name, namespace=NAMESPACE, **options).remote(config)
    except ValueError as exc:
        if "already" not in str(exc):
            raise
        # Another process created it between our lookup and our create.
        return ray.get_actor(name, namespace=NAMESPACE)


def _unwrap(exc: RayTaskError) -> BaseException:
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, errors.RunControlError) else exc


def pack(value: Any) -> bytes:
    """A batch's items or answers as one pickle: Ray then passes one bytes value instead of
    walking the list and cloudpickling each object in it (measured: docs/benchmarks.md)."""
    try:
        return pickle.dumps(value, protocol=5)
    except Exception:  # noqa: BLE001 - something only cloudpickle handles (its output loads alike)
        return bytes(cloudpickle.dumps(value))  # type: ignore[no-untyped-call]


def pack_answers(answers: list[tuple[bool, Any]]) -> bytes:
    """``pack`` for a batch's answers: one that will not pickle becomes an error for its own
    caller only, instead of failing the whole call (whose other commands may have committed)."""
    try:
        return pack(answers)
    except Exception:  # noqa: BLE001 - find the culprits one by one
        safe: list[tuple[bool, Any]] = []
        for ok, value in answers:
            try:
                pack(value)
                safe.append((ok, value))
            except Exception as exc:  # noqa: BLE001 - reported to that caller
                safe.append(
                    (False, errors.RunControlError(f"the answer could not be sent back: {exc}"))
                )
        return pack(safe)


def unpack(payload: bytes) -> Any:
    return pickle.loads(payload)  # noqa: S301 - from our own actors, inside the cluster


def _quick_state(*modules: types.ModuleType) -> None:
    """The frozen slotted dataclasses of ``modules`` pickled without ``dataclasses.fields``
    per object: Python's own ``__getstate__``/``__setstate__`` for them (a list of the field
    values, set back by ``object.__setattr__`` in field order) ask ``fields(self)`` each time,
    a tenth of a worker's samples and most of ``pack`` in a host (issue 42). The same state,
    so a pickle is byte for byte the one Python makes, read alike by either."""
    for module in modules:
        for cls in vars(module).values():
            found = isinstance(cls, type) and vars(cls).get("__getstate__")
            if getattr(found, "__qualname__", None) == "_dataclass_getstate":
                names = tuple(f.name for f in dataclasses.fields(cls))
                cls.__getstate__, cls.__setstate__ = _state_of(names)  # type: ignore[attr-defined]


def _state_of(names: tuple[str, ...]) -> tuple[Callable[[Any], Any], Callable[[Any, Any], None]]:
    put = object.__setattr__

    def __getstate__(self: Any) -> list[Any]:
        return [getattr(self, name) for name in names]

    def __setstate__(self: Any, state: Any) -> None:
        for name, value in zip(names, state):  # noqa: B905 - as Python's: an older, shorter state
            put(self, name, value)

    return __getstate__, __setstate__


_quick_state(commands, protocol, model, values)


# Grain commands bound for one host travel together: while ``MAX_IN_FLIGHT`` batches to a host
# are unanswered, further commands queue and leave as the next batch. An idle caller pays no
# wait (a lone command leaves on the next loop turn); a busy one pays one actor call per batch
# instead of one per command (measured: docs/benchmarks.md).
MAX_IN_FLIGHT = 2
MAX_BATCH = 64
# A host that answered ``errors.Draining`` gets no commands from this router for this long;
# then one is tried again (the host may have been replaced by then, or called its drain off).
DRAINING_RECHECK_S = 5.0
# The hosts' Exchange targets are asked again after this long (a restarted host serves on
# another port; a worker that cannot reach one goes through the ingress meanwhile).
TARGETS_TTL_S = 5.0


# A queued command: the command, its caller's future, and (tracing on) the caller's trace
# context, so the host's command span is the child of the span that sent it.
_Entry = tuple[Command[Any], asyncio.Future[Any], Carrier | None]


@dataclass
class _HostQueue:
    pending: list[_Entry] = field(default_factory=list)
    in_flight: int = 0
    scheduled: bool = False


class HostRouter:
    """Routes a run's commands to the actor that hosts it, retrying across actor restarts.

    A command keeps its ``command_id`` when repeated after ``ActorUnavailableError`` ("unknown
    whether it ran"): the grain answers a repeat of a committed command with the stored answer
    (DESIGN 9.5), so a batch is repeated whole safely.

    A draining host refuses new commands with ``errors.Draining`` (having done nothing): its
    runs then go to the next host of the ring (``host_index + 1``, ...) at once, for
    ``DRAINING_RECHECK_S``. Two activations of a run on two hosts are harmless (every commit is
    guarded by the run's version), and leases live in the database, so the other host serves a
    lease holder's report without waiting for the lease to expire.
    """

    def __init__(
        self,
        host_count: int,
        *,
        placement: str = "hosted",
        dedicated_factory: Any = None,
    ) -> None:
        self.host_count = host_count
        self.placement = placement
        self._dedicated_factory = dedicated_factory
        self._handles: dict[str, Any] = {}
        self._round_robin = itertools.cycle(range(host_count))
        self._draining: dict[str, float] = {}  # host name -> when it last answered Draining
        self.batches_sent = 0  # command_batch actor calls made (benchmarks report the ratio)
        self._targets: tuple[float, list[str]] | None = None  # (when asked, the targets)
        self._asking: asyncio.Future[None] | None = None
        # Per event loop (a process may run several, one after another): host name -> queue.
        self._queues: weakref.WeakKeyDictionary[
            asyncio.AbstractEventLoop, dict[str, _HostQueue]
        ] = weakref.WeakKeyDictionary()

    def name_for(self, run_id: UUID) -> str:
        if self.placement == "dedicated":
            return dedicated_name(run_id)
        return self._serving(host_index(run_id, self.host_count))

    def _serving(self, index: int) -> str:
        """Host ``index``, or the next of the ring not known to be draining (all draining:
        host ``index``, whose refusal then reaches the caller)."""
        now = time.monotonic()
        for step in range(self.host_count):
            name = host_name((index + step) % self.host_count)
            since = self._draining.get(name)
            if since is None or now - since > DRAINING_RECHECK_S:
                return name
        return host_name(index)

    def _drained(self, name: str) -> None:
        self._draining[name] = time.monotonic()

    def _handle(self, name: str) -> Any:
        handle = self._handles.get(name)
        if handle is None:
            if name.startswith("run-") and self._dedicated_factory is not None:
                handle = self._dedicated_factory(name)
            else:
                handle = ray.get_actor(name, namespace=NAMESPACE)
            self._handles[name] = handle
        return handle

    async def call_named(self, name: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self._call(lambda: name, method, *args, **kwargs)

    async def _call(self, pick: Callable[[], str], method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` on the actor ``pick()`` names, retrying (``pick`` again) while the
        actor is restarting, dead or not yet registered."""
        delay = 0.05
        last: BaseException | None = None
        tries = 0
        restart_deadline = time.monotonic() + RESTART_WAIT_S
        while tries < RETRIES:
            name = pick()
            try:
                handle = self._handle(name)
                return await getattr(handle, method).remote(*args, **kwargs)
            except RayTaskError as exc:
                error = _unwrap(exc)
                if isinstance(error, errors.Draining):
                    self._drained(name)
                raise error from None
            except (ActorUnavailableError, ActorDiedError, RayActorError, ValueError) as exc:
                # Restarting, dead or not yet registered: look the name up again and retry.
                last = exc
                self._handles.pop(name, None)
                restarting = isinstance(exc, ActorUnavailableError)
                if not restarting or time.monotonic() >= restart_deadline:
                    tries += 1
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)
        raise errors.Unavailable(f"{name} did not answer: {last}") from last

    async def call(self, run_id: UUID, method: str, *args: Any, **kwargs: Any) -> Any:
        return await self._call_serving(lambda: self.name_for(run_id), method, *args, **kwargs)

    async def call_any(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """``method`` on any host (a claim): a host that does not answer is passed over for the
        next, so a claim resent after its host died is answered at once by another; so is one
        that refuses as draining."""
        return await self._call_serving(
            lambda: self._serving(next(self._round_robin)), method, *args, **kwargs
        )

    async def _call_serving(
        self, pick: Callable[[], str], method: str, *args: Any, **kwargs: Any
    ) -> Any:
        """``_call`` on the host ``pick`` names; a draining one's refusal sends the call to the
        host ``pick`` names next (each refusal marks its host)."""
        refused: errors.Draining | None = None
        for _ in range(self.host_count):
            try:
                return await self._call(pick, method, *args, **kwargs)
            except errors.Draining as exc:
                refused = exc
        assert refused is not None
        raise refused

    async def hosts(self) -> int:
        return self.host_count

    async def exchange(self, host: int, up: SessionUp) -> SessionDown:
        """One worker-session exchange with host ``host``, tried once: a host that does not
        answer raises ``errors.Unavailable``. Not retried here, because ``up`` is stale by
        then: its host may have granted a credit and died before answering, and only the
        worker knows which credits to resend as ``resent`` (the restarted host looks those up
        by claim id) under a newer ``seq``. A host refusing as draining answers
        ``draining=True``."""
        name = host_name(host)
        try:
            handle = self._handle(name)
            down: SessionDown = unpack(await handle.exchange_packed.remote(pack(up)))
        except RayTaskError as exc:
            error = _unwrap(exc)
            if isinstance(error, errors.Draining):
                self._drained(name)
                return SessionDown(hosts=self.host_count, draining=True)
            raise error from None
        except (ActorUnavailableError, ActorDiedError, RayActorError, ValueError) as exc:
            self._handles.pop(name, None)
            raise errors.Unavailable(f"{name} did not answer: {exc!r}") from exc
        return down

    async def exchange_targets(self) -> list[str]:
        """Where each host serves the workers' gRPC ``Exchange`` itself (by index; "": it does
        not, or did not answer), asked of the hosts at most every ``TARGETS_TTL_S``."""
        if self._targets is None or time.monotonic() - self._targets[0] > TARGETS_TTL_S:
            asking = self._asking  # one question at a time (per event loop)
            if (
                asking is None
                or asking.done()
                or asking.get_loop() is not asyncio.get_running_loop()
            ):
                self._asking = asyncio.ensure_future(self._ask_targets())
            await asyncio.shield(self._asking)
        assert self._targets is not None
        return self._targets[1]

    async def _ask_targets(self) -> None:
        asked = time.monotonic()
        found = await asyncio.gather(*map(self._target, range(self.host_count)))
        self._targets = asked, list(found)

    async def _target(self, index: int) -> str:
        name = host_name(index)
        try:
            target = await self._handle(name).exchange_target.remote()
        except Exception:  # noqa: BLE001 - restarting, or an older host: through the ingress
            self._handles.pop(name, None)
            return ""
        return str(target or "")

    async def send(self, command: Command[R]) -> R:
        """One grain command, sent to the run's host in a batch with its neighbours."""
        loop = asyncio.get_running_loop()
        host = self.name_for(command.run_id)
        queue = self._queues.setdefault(loop, {}).setdefault(host, _HostQueue())
        future: asyncio.Future[R] = loop.create_future()
        entry: _Entry = (command, future, current_carrier())
        queue.pending.append(entry)
        self._schedule(loop, host, queue)
        try:
            return await future
        finally:
            if not future.done() or future.cancelled():  # the caller gave up before it left
                with contextlib.suppress(ValueError):
                    queue.pending.remove(entry)
            self._forget_if_idle(loop, host, queue)

    def _schedule(self, loop: asyncio.AbstractEventLoop, host: str, queue: _HostQueue) -> None:
        if (
            queue.pending
            and not queue.scheduled
            and queue.in_flight < MAX_IN_FLIGHT
            and not loop.is_closed()
        ):
            queue.scheduled = True
            loop.call_soon(self._flush, loop, host, queue)

    def _flush(self, loop: asyncio.AbstractEventLoop, host: str, queue: _HostQueue) -> None:
        queue.scheduled = False
        live = [entry for entry in queue.pending if not entry[1].done()]
        batch, queue.pending = live[:MAX_BATCH], live[MAX_BATCH:]
        if batch:
            queue.in_flight += 1
            loop.create_task(self._send(loop, host, queue, batch))
            self._schedule(loop, host, queue)  # more than a batch queued: up to MAX_IN_FLIGHT
        else:
            self._forget_if_idle(loop, host, queue)

    def _forget_if_idle(
        self, loop: asyncio.AbstractEventLoop, host: str, queue: _HostQueue
    ) -> None:
        """Drop a host's queue once nothing is queued, scheduled or in flight, and a loop's
        entry once it has no queues: nothing then keeps a finished loop (or its futures)."""
        if queue.pending or queue.scheduled or queue.in_flight:
            return
        queues = self._queues.get(loop)
        if queues is not None and queues.get(host) is queue:
            del queues[host]
            if not queues:
                self._queues.pop(loop, None)

    async def _send(
        self,
        loop: asyncio.AbstractEventLoop,
        host: str,
        queue: _HostQueue,
        batch: list[_Entry],
    ) -> None:
        self.batches_sent += 1
        try:
            items = [item for item, _, _ in batch]
            carriers = [carrier for _, _, carrier in batch]
            args: tuple[Any, ...] = (pack(items),)
            if any(carriers):  # tracing off: nothing more travels
                args += (carriers,)
            answers = unpack(await self.call_named(host, "command_batch_packed", *args))
        except asyncio.CancelledError:  # the loop is shutting down
            for _, future, _ in batch:
                future.cancel()
            raise
        except Exception as exc:  # the whole batch failed: every caller gets the error
            for _, future, _ in batch:
                if not future.done():
                    future.set_exception(exc)
        else:
            for (command, future, _), (ok, value) in zip(batch, answers, strict=True):
                if future.done():
                    continue  # the caller gave up (cancelled)
                if ok:
                    future.set_result(value)
                elif isinstance(value, errors.Draining) and self._rerouted(host, command):
                    loop.create_task(self._resend(command, future))
                else:
                    future.set_exception(value)
        finally:
            queue.in_flight -= 1
            self._schedule(loop, host, queue)
            self._forget_if_idle(loop, host, queue)

    def _rerouted(self, host: str, command: Command[Any]) -> bool:
        """``host`` refused ``command`` as draining: whether another host will take it."""
        self._drained(host)
        return self.name_for(command.run_id) != host

    async def _resend(self, command: Command[Any], future: asyncio.Future[Any]) -> None:
        """The same command (same id) to the run's next host; its answer is the caller's."""
        try:
            result = await self.send(command)
        except Exception as exc:  # noqa: BLE001 - the caller's error
            if not future.done():
                future.set_exception(exc)
        else:
            if not future.done():
                future.set_result(result)
